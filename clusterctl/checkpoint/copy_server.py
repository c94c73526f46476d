"""The copy server in every node's first rank: serves this node's checkpoint copies to the job's other
nodes and keeps the copies they push (the protocol: clusterctl/checkpoint/transport.py's docstring; its
wire format: clusterctl/checkpoint/copy_wire.py).  `CopyServer` listens and accepts, `_CopySession`
answers one connection, `_TierCopies` reads and keeps the copies in the node's tier root.
Import it from clusterctl.checkpoint.transport (with the clients)."""

from __future__ import annotations

import hmac
import os
import selectors
import shutil
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from clusterctl.checkpoint.copies import MANIFEST_NAME
from clusterctl.checkpoint.copy_wire import (
    BUSY, HANDSHAKE_SECONDS, MAC_BYTES, MAGIC, MAX_CONNECTIONS, MAX_HANDSHAKES, NAME_LENGTH, NONCE_BYTES,
    PEER_CONNECTIONS, REQUEST_LABEL, LENGTH, Channel,
    CopyRequest, StreamError, TransferError, complete_copy, copy_dir_name, keyed_mac, new_temporary,
    no_more_bytes, parse_copy_request, receive_shards, recv_exact, recv_header, send_shard, shard_file_problem,
)
from clusterctl.records.checkpoint_manifest import CheckpointManifest, read_checkpoint_manifest
from clusterctl.records.node_report import KEY_BYTES
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.names import node_name_problem
from clusterctl.text import one_line

ReceivedHook = Callable[[CheckpointManifest], None]


class CopyServer:
    """Serves this node's checkpoint copies to the job's other nodes and keeps their pushed copies.

    `tier_root` is the node's tier root (local/, buddy/); `node` this node's name (as in the rank
    map); `key` the job's KEY_BYTES-byte key; `port` the TCP port (0: any free one, see `port`
    after start), `host` the address to listen on ('' : every interface).  After a pushed copy is
    in place, `on_received(manifest)` is called with its manifest as held here (tier buddy), before
    the sender hears that the copy is kept; an exception from it is reported through `on_problem` (default: one line on stderr), as is
    anything unexpected in a connection.  `timeout` bounds every socket operation.

    This class is the listener: it accepts connections, each on a thread of its own.  A connection
    first shakes hands (at most `max_handshakes` at once, `per_peer` from one address, the whole
    handshake within `handshake_timeout` s); only a request carrying the job's key then takes one of
    the `max_connections` transfer slots, so strangers (idle, trickling or wrong-key connections) cannot
    keep the job's own copies out.  `refused` counts the connections turned away, by reason.  What is
    said on a connection is `_CopySession`; the copies in the tier's folders are `_TierCopies`.
    """

    def __init__(self, tier_root: Path, node: str, key: bytes, port: int, host: str = "", *,
                 on_received: ReceivedHook | None = None, on_problem: Callable[[str], None] | None = None,
                 timeout: float = 60.0, max_connections: int = MAX_CONNECTIONS,
                 handshake_timeout: float = HANDSHAKE_SECONDS, max_handshakes: int = MAX_HANDSHAKES,
                 per_peer: int = PEER_CONNECTIONS) -> None:
        if (problem := node_name_problem(node)):
            raise ValueError(problem)
        if len(key) != KEY_BYTES:
            raise ValueError(f"the job's key is {KEY_BYTES} bytes, not {len(key)}")
        self.tier_root, self.node, self.host = Path(tier_root), node, host
        self._wanted_port, self._timeout, self._on_problem = port, timeout, on_problem
        self._session = _CopySession(bytes(key), _TierCopies(self.tier_root, node, on_received, self._problem))
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_connections, self._max_handshakes, self._per_peer = max_connections, max_handshakes, per_peer
        self._handshake_timeout = handshake_timeout
        self._transfers = 0
        self._handshakes = 0
        self._peers: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._active: set[socket.socket] = set()
        self._workers: set[threading.Thread] = set()

    @property
    def refused(self) -> dict[str, int]:
        """Connections turned away so far, by reason: `busy` (every transfer slot taken by the job's own),
        `handshakes` (MAX_HANDSHAKES strangers at once), `per peer` (one address's PEER_CONNECTIONS),
        `timed out` (no whole request within the handshake deadline), `wrong key`, `broken` (not the protocol):
        records.checkpoint_holdings.COPY_REFUSALS.  The node's first rank writes them into the node's holdings,
        which its reporter carries to the agent's summary (clusterctl/checkpoint/worker.py)."""
        with self._lock:
            return dict(self._refused)

    @property
    def port(self) -> int:
        """The port listened on (the one chosen by the system when 0 was asked)."""
        if self._listener is None:
            return self._wanted_port
        return int(self._listener.getsockname()[1])

    def start(self) -> CopyServer:
        """Listen and serve on a daemon thread; TransferError when the port cannot be bound."""
        if self._listener is not None:
            return self
        try:
            if self.host == "" and socket.has_dualstack_ipv6():
                listener = socket.create_server(("", self._wanted_port), family=socket.AF_INET6, dualstack_ipv6=True,
                                                backlog=64)
            else:
                listener = socket.create_server((self.host, self._wanted_port), backlog=64)
        except OSError as exc:
            raise TransferError(f"{self.node}: cannot serve checkpoint copies on port {self._wanted_port}: "
                                f"{exc.strerror or exc}; another process holds the port (a previous step's rank "
                                "still running?) or the job's port setting is wrong") from None
        listener.setblocking(False)
        self._listener = listener
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name=f"copy-server-{self.port}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, end the transfers still running (their partial copies are removed) and wait
        for them a few seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            for conn in self._active:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            workers = list(self._workers)
        for worker in workers:
            worker.join(timeout=5.0)

    def __enter__(self) -> CopyServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- serving -------------------------------------------------------------------------------

    def _serve(self) -> None:
        assert self._listener is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not selector.select(timeout=0.2):
                    continue
                try:
                    conn, address = self._listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    # Out of file descriptors, say: the listener stays readable, so wait rather than spin.
                    self._problem(f"cannot accept a connection: {exc.strerror or exc}")
                    self._stop.wait(1.0)
                    continue
                conn.setblocking(True)
                peer = str(address[0])
                if self._admit(peer):
                    _send_quietly(conn, BUSY)
                    conn.close()
                    continue
                worker = threading.Thread(target=self._connection, args=(conn, peer), daemon=True,
                                          name=f"copy-transfer-{self.port}")
                with self._lock:
                    self._active.add(conn)
                    self._workers.add(worker)
                worker.start()

    def _admit(self, peer: str) -> str:
        """Take a handshake place for a connection from `peer`; the reason it is refused, or ""."""
        with self._lock:
            if self._transfers >= self._max_connections:
                reason = "busy"
            elif self._handshakes >= self._max_handshakes:
                reason = "handshakes"
            elif self._peers[peer] >= self._per_peer:
                reason = "per peer"
            else:
                self._handshakes += 1
                self._peers[peer] += 1
                return ""
            self._refused[reason] += 1
            return reason

    def _connection(self, conn: socket.socket, peer: str) -> None:
        transferring = False
        try:
            try:
                shaken = self._session.handshake(conn, time.monotonic() + self._handshake_timeout)
            except TimeoutError:
                self._count("timed out")
                return
            except (OSError, StreamError):
                self._count("broken")
                return
            finally:
                with self._lock:
                    self._handshakes -= 1
            if shaken is None:
                self._count("wrong key")
                return
            channel, header = shaken
            conn.settimeout(self._timeout)
            if not self._slots.acquire(timeout=self._handshake_timeout):
                self._count("busy")
                channel.respond(error=f"{self.node} is busy with {self._max_connections} other transfers; try "
                                      "again in a few seconds")
                return
            transferring = True
            with self._lock:
                self._transfers += 1
            self._session.serve(channel, header)
        except (OSError, TransferError, StreamError):
            pass  # the peer went away or broke the protocol: it sees its own error; nothing was kept
        except Exception as exc:  # noqa: BLE001 - a bug must not end the server's thread silently
            self._problem(f"unexpected {type(exc).__name__} while serving a copy: {exc}")
        finally:
            conn.close()
            with self._lock:
                self._active.discard(conn)
                self._workers.discard(threading.current_thread())
                self._peers[peer] -= 1
                if self._peers[peer] <= 0:
                    del self._peers[peer]
                if transferring:
                    self._transfers -= 1
            if transferring:
                self._slots.release()

    def _count(self, reason: str) -> None:
        with self._lock:
            self._refused[reason] += 1

    def _problem(self, text: str) -> None:
        line = f"clusterctl copy server on {self.node}: {one_line(text)}"
        if self._on_problem is not None:
            self._on_problem(line)
        else:
            print(line, file=sys.stderr, flush=True)


class _CopySession:
    """The server's side of one connection (protocol steps 1-4 of the module docstring): the handshake,
    then a fetch answered from this node's copies or a push kept among them."""

    def __init__(self, key: bytes, copies: _TierCopies) -> None:
        self._key, self._copies = key, copies

    def handshake(self, conn: socket.socket, deadline: float) -> tuple[Channel, bytes] | None:
        """Greet `conn` and read its request by `deadline` (time.monotonic(); TimeoutError after it): the
        channel and the request header when its MAC carries the job's key, None (the peer told) when not.
        OSError or StreamError when the peer breaks off."""
        server_nonce = os.urandom(NONCE_BYTES)
        conn.settimeout(max(0.0, deadline - time.monotonic()))
        conn.sendall(MAGIC + server_nonce)
        client_nonce = recv_exact(conn, NONCE_BYTES, "the request", deadline=deadline)
        header = recv_header(conn, "the request", deadline=deadline)
        mac = recv_exact(conn, MAC_BYTES, "the request", deadline=deadline)
        if not hmac.compare_digest(mac, keyed_mac(self._key, REQUEST_LABEL, server_nonce, client_nonce, header)):
            conn.sendall(LENGTH.pack(0))
            return None
        return Channel(conn, self._key, client_nonce, server_nonce), header

    def serve(self, channel: Channel, header: bytes) -> None:
        """Answer the authenticated request in `header` (OSError, TransferError or StreamError when the
        peer breaks off)."""
        try:
            request = parse_copy_request(header)
        except TransferError as exc:
            channel.respond(error=str(exc))
            return
        if request.request == "fetch":
            self._send_copy(channel, request)
        else:
            assert request.manifest is not None
            self._keep_pushed(channel, request.manifest)

    def _send_copy(self, channel: Channel, request: CopyRequest) -> None:
        node = self._copies.node
        own = request.of_node == node
        directory = self._copies.folder_of(request.of_node) / copy_dir_name(request.step)
        what = f"{request.of_node}'s {'local ' if own else ''}copy of step {request.step} on {node}"
        try:
            manifest = read_checkpoint_manifest(directory / MANIFEST_NAME)
        except (FileNotFoundError, NotADirectoryError):
            channel.respond(error=f"{node} holds no complete copy of {request.of_node}'s shards of step "
                                  f"{request.step} (no {MANIFEST_NAME} in {directory}); take the next tier")
            return
        except RecordError as exc:
            channel.respond(error=f"{what} has a manifest this node cannot read ({exc}); take the next tier")
            return
        expected = ("local" if own else "buddy", request.of_node, request.step, node)
        if (manifest.tier, manifest.of_node, manifest.step, manifest.held_on) != expected:
            channel.respond(error=f"{what}: its manifest describes {manifest.where} of step {manifest.step}, "
                                  "not this copy; take the next tier")
            return
        for shard in manifest.shards:
            if (problem := shard_file_problem(directory / shard.name, shard)):
                channel.respond(error=f"{what} is damaged (shard {shard.name}: {problem}); take the next tier")
                return
        channel.respond(manifest=manifest)
        for shard in manifest.shards:
            send_shard(channel.sock, directory, shard, what)
        channel.sock.sendall(NAME_LENGTH.pack(0))

    def _keep_pushed(self, channel: Channel, pushed: CheckpointManifest) -> None:
        node = self._copies.node
        of_node, step = pushed.of_node, pushed.step
        if of_node == node:
            channel.respond(error=f"{node} was sent its own copy of step {step}: a node keeps buddy copies "
                                  "of other nodes only (check the buddy map)")
            return
        held = replace(pushed, tier="buddy", held_on=node)
        folder = self._copies.folder_of(of_node)
        what = f"{of_node}'s copy of step {step} pushed to {node}"
        kept = self._copies.kept_already(held)
        if kept is not None:
            channel.respond(manifest=kept, held=True)
            return
        try:
            tmp = self._copies.new_temporary(folder)
        except OSError as exc:
            channel.respond(error=f"{what}: cannot make a folder in {folder}: {exc.strerror or exc}")
            return
        try:
            channel.respond(manifest=held)
            problem, _ = receive_shards(channel.sock, tmp, held, what, durable=True)
            if not problem:
                problem = no_more_bytes(channel.sock, what)
            if not problem:
                try:
                    self._copies.complete(tmp, held)
                except OSError as exc:
                    problem = f"{what}: cannot store it in {folder}: {exc.strerror or exc}"
        finally:
            self._copies.discard(tmp)
        if problem:
            channel.respond(error=problem)
            return
        self._copies.received(held)
        channel.respond(manifest=held)


class _TierCopies:
    """This node's copies in its tier root, as the copy server reads and keeps them: its own under
    local/, other nodes' under buddy/<node>/, a pushed copy written in a `.tmp-*` folder and put in
    place whole.  One lock orders the folder changes of concurrent transfers."""

    def __init__(self, tier_root: Path, node: str, on_received: ReceivedHook | None,
                 problem: Callable[[str], None]) -> None:
        self.tier_root, self.node = tier_root, node
        self._on_received, self._problem = on_received, problem
        self._lock = threading.Lock()
        self._writing: set[Path] = set()

    def folder_of(self, of_node: str) -> Path:
        """Where `of_node`'s copies are kept on this node: local/ for its own, else buddy/<of_node>/."""
        return self.tier_root / "local" if of_node == self.node else self.tier_root / "buddy" / of_node

    def kept_already(self, held: CheckpointManifest) -> CheckpointManifest | None:
        """The manifest of `held` when this node keeps it already, as it is or (its files linked here) as
        another node's buddy copy of the same bytes; None: its bytes are to be sent."""
        folder = self.folder_of(held.of_node)
        with self._lock:
            kept = _kept_already(folder / copy_dir_name(held.step), held)
        if kept is None and (kept := self._link_same_bytes(held, folder)) is not None:
            self.received(kept)
        return kept

    def new_temporary(self, folder: Path) -> Path:
        """A fresh `.tmp-*` folder in `folder` for a copy being received (OSError when none can be made)."""
        with self._lock:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._remove_stale_temporaries(folder)
            tmp = new_temporary(folder)
            self._writing.add(tmp)
        return tmp

    def complete(self, tmp: Path, held: CheckpointManifest) -> None:
        """Put the copy received in `tmp` at its final name (OSError when it cannot be stored)."""
        with self._lock:
            complete_copy(tmp, self.folder_of(held.of_node) / copy_dir_name(held.step), held)

    def discard(self, tmp: Path) -> None:
        """Remove what is left of the temporary `tmp` (all of it when the copy was not completed)."""
        shutil.rmtree(tmp, ignore_errors=True)
        with self._lock:
            self._writing.discard(tmp)

    def received(self, held: CheckpointManifest) -> None:
        """Tell `on_received` that `held` is kept here; its failure is reported, the copy stays."""
        # Before the answer: once push_copy returns, the buddy's holdings already list the copy.
        if self._on_received is not None:
            try:
                self._on_received(held)
            except Exception as exc:  # noqa: BLE001 - the copy is kept; the caller's hook failing is reported
                self._problem(f"after keeping {held.where} of step {held.step}: on_received failed: "
                              f"{type(exc).__name__}: {exc}")

    def _link_same_bytes(self, held: CheckpointManifest, folder: Path) -> CheckpointManifest | None:
        """Keep `held` by linking the files of another buddy copy here with the same step, slot and shards
        (a replacement node sends back the copy it fetched from this node: its buddy is the lost node's);
        its manifest as kept, or None (then the bytes are sent)."""
        with self._lock:
            for other in sorted((self.tier_root / "buddy").glob(f"*/{copy_dir_name(held.step)}")):
                source = _kept_already(other, held, any_node=True)
                if source is None or other.parent == folder:
                    continue
                tmp: Path | None = None
                try:
                    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                    tmp = new_temporary(folder)
                    for shard in held.shards:
                        if "/" in shard.name:
                            (tmp / shard.name.split("/")[0]).mkdir(mode=0o700, exist_ok=True)
                        os.link(other / shard.name, tmp / shard.name, follow_symlinks=False)
                    complete_copy(tmp, folder / copy_dir_name(held.step), held)
                    return held
                except OSError:
                    return None  # the bytes are sent instead
                finally:
                    if tmp is not None:
                        shutil.rmtree(tmp, ignore_errors=True)
        return None

    def _remove_stale_temporaries(self, folder: Path) -> None:
        # A push that died with its process (the previous step's server) leaves a .tmp-* behind;
        # ours in flight are in self._writing (the caller holds self._lock).
        for entry in folder.iterdir():
            if entry.name.startswith(".tmp-") and entry not in self._writing:
                shutil.rmtree(entry, ignore_errors=True)


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def _kept_already(directory: Path, pushed: CheckpointManifest, *, any_node: bool = False) -> CheckpointManifest | None:
    """The manifest of the copy in `directory` when it is the pushed one (the same step, node, slot and
    shards, every shard file there at its size; `any_node`: whoever's copy it is); None otherwise."""
    try:
        kept = read_checkpoint_manifest(directory / MANIFEST_NAME)
    except (OSError, RecordError):
        return None
    same = ((kept.tier, kept.step, kept.slot, kept.slots, kept.shards)
            == (pushed.tier, pushed.step, pushed.slot, pushed.slots, pushed.shards)
            and (any_node or (kept.of_node, kept.held_on) == (pushed.of_node, pushed.held_on)))
    if not same or any(shard_file_problem(directory / s.name, s) for s in kept.shards):
        return None
    return kept
