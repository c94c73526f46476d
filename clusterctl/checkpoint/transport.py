"""Moving one node's checkpoint copy to or from another node of the job over TCP.

Every node's first rank runs a `CopyServer` on the step's port (settings.port).  A node pushes its
local copy of each checkpoint to its buddy (`push_copy`: the buddy keeps it as
`buddy/<of_node>/step-<N>/`), and a node that resumes from a copy another node holds fetches it
(`fetch_copy`).  Only the job's processes know the job's 32-byte key (CLUSTERCTL_REPORT_KEY), and
only they can ask: anyone else on the network (another user's job on a shared node) is refused
before a byte of its request is parsed.

Protocol (version 2), one request per connection:

1. server → client: MAGIC, then a fresh 32-byte nonce; BUSY instead when MAX_CONNECTIONS
   transfers already run (the client says so and may try again).
2. client → server: its own 32-byte nonce, a request header (4-byte big-endian length, at most
   HEADER_LIMIT bytes, then JSON: kind "copy-request", version 2) and HMAC-SHA256 under the key of
   REQUEST_LABEL ‖ server nonce ‖ client nonce ‖ header.  The server checks the MAC
   (hmac.compare_digest) before parsing the JSON; a wrong MAC is answered with a header length of 0
   and the connection closed.
3. server → client: a response header (length, JSON: kind "copy-response", version 2) and its HMAC
   of RESPONSE_LABEL ‖ client nonce ‖ server nonce ‖ counter ‖ header, so neither side's answer can
   be forged or replayed, and a fetched manifest is the server's own.  To a push of a copy the
   server keeps already (the same step, slot and shards, every shard file there at its size) it
   answers `held: true`, and nothing more is sent either way: every node sends its newest copy
   again as a step starts (its buddy may be new), and after a recovery most buddies are not.  So
   is a push of the same shards the server keeps under another node's name (they are hard-linked):
   a spare in a lost node's slot has that node's buddy as its own, and sends back the copy it fetched.
4. the shards, in the manifest's order, each framed as name length (2 bytes), name, size (8 bytes),
   then exactly that many bytes; a name length of 0 ends them.  The bytes themselves carry no MAC:
   every shard's size and SHA-256 are in the authenticated manifest, and the receiver checks both
   as it reads.  A push then gets a second response saying whether the copy was kept.

Version 2 added `held` to the response (version 1 had none: a copy was always sent again).

A receiver writes into a `.tmp-*` directory, writes the manifest last, fsyncs and renames the
directory to its final name only when every shard verified; anything else removes it.  A fetch
returns what it measured of every shard (`ReceivedCopy`): the caller loads the copy without hashing
it a second time.  A fetched copy's shards are not fsynced: it is staged for a load that follows at
once, and any later load of it (as the node's own copy) verifies it again first.  A peer that
sends more or fewer bytes than it announced, a frame that is not the next shard, or a header larger
than HEADER_LIMIT is a TransferError.  Every socket operation waits at most `timeout` seconds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import selectors
import shutil
import socket
import stat
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from clusterctl.checkpoint.copies import MANIFEST_NAME, ReceivedCopy
from clusterctl.errors import ClusterctlError
from clusterctl.files import fsync_directory
from clusterctl.records.checkpoint_manifest import (
    MANIFEST_LIMIT, MAX_NAME_BYTES, CheckpointManifest, Shard, read_checkpoint_manifest,
    write_checkpoint_manifest)
from clusterctl.records.node_report import KEY_BYTES
from clusterctl.records.versioned import MAX_WHOLE, RecordError
from clusterctl.slurm.names import node_name_problem
from clusterctl.text import one_line

REQUEST_KIND = "copy-request"
RESPONSE_KIND = "copy-response"
VERSION = 2
MAGIC = b"CCT1"
BUSY = b"CCTB"
NONCE_BYTES = 32
MAC_BYTES = 32
HEADER_LIMIT = MANIFEST_LIMIT + (64 << 10)
"""The largest request or response header taken (bytes): a manifest of MAX_SHARDS long names fits."""
REQUEST_LABEL = b"clusterctl copy-request v1\0"
RESPONSE_LABEL = b"clusterctl copy-response v1\0"
MAX_CONNECTIONS = 4
"""Transfers one server runs at once; a further connection is told BUSY and closed."""
CHUNK = 4 << 20
"""Bytes received at a time (a buffer of this size per connection): a 1 GB fetch over loopback took
1.28-1.35 s with 4 MiB, 1.44-1.46 s with 1 MiB, no less with 16 MiB (median of 4, on a 2-core VM)."""
REQUESTS = ("fetch", "push")
_REQUEST_FIELDS = {"fetch": frozenset({"kind", "version", "request", "of_node", "step"}),
                   "push": frozenset({"kind", "version", "request", "manifest"})}
_RESPONSE_FIELDS = frozenset({"kind", "version", "ok", "error", "manifest", "held"})
_LENGTH = struct.Struct(">I")
_NAME_LENGTH = struct.Struct(">H")
_SIZE = struct.Struct(">Q")


class TransferError(ClusterctlError):
    """A copy could not be moved between two nodes; the message says what failed, with which node,
    and what to do.  `retryable`: nothing was tried yet and the same call may work in a moment (no
    server listens yet, or it is busy): the peer's first rank may still be starting."""

    exit_code = 14

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class _StreamError(Exception):
    """The peer broke the protocol or went away mid-stream (the edges add which transfer and node)."""


@dataclass(frozen=True)
class CopyRequest:
    """What a client asks a CopyServer: `fetch` the copy of `of_node`'s shards of `step` it holds, or
    `push` the client's own local copy described by `manifest` (then `of_node` and `step` are the
    manifest's)."""

    request: str  # one of REQUESTS
    of_node: str
    step: int
    manifest: CheckpointManifest | None = None

    def to_json(self) -> dict[str, Any]:
        """The request header as sent."""
        if self.request == "push":
            assert self.manifest is not None
            return {"kind": REQUEST_KIND, "version": VERSION, "request": "push", "manifest": self.manifest.to_json()}
        return {"kind": REQUEST_KIND, "version": VERSION, "request": "fetch", "of_node": self.of_node,
                "step": self.step}

    def to_bytes(self) -> bytes:
        """The request header's bytes (compact UTF-8 JSON)."""
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode()


def parse_copy_request(raw: bytes) -> CopyRequest:
    """The request in a header's bytes (already authenticated); TransferError saying what is wrong for
    anything that is not exactly a version-1 request: bytes that are not JSON, another kind or
    version, unknown fields, a bad node name or step, a pushed manifest that is not a local copy."""
    document = _json_object(raw, "request header", REQUEST_KIND)
    request = document.get("request")
    if request not in REQUESTS:
        raise TransferError(f"request header: `request` is {_shown(request)}: one of {', '.join(REQUESTS)}")
    _refuse_unknown(document, _REQUEST_FIELDS[request], "request header")
    if request == "push":
        try:
            manifest = CheckpointManifest.from_json(document.get("manifest"), "pushed manifest")
        except RecordError as exc:
            raise TransferError(f"request header: {exc}") from None
        if manifest.tier != "local":
            raise TransferError(f"request header: a pushed copy is the sender's local copy, not a {manifest.tier} "
                                "copy")
        return CopyRequest("push", manifest.of_node, manifest.step, manifest)
    of_node = document.get("of_node")
    if (problem := node_name_problem(of_node)):
        raise TransferError(f"request header: `of_node`: {problem}")
    assert isinstance(of_node, str)
    step = document.get("step")
    if type(step) is not int or not 0 <= step <= MAX_WHOLE:
        raise TransferError(f"request header: `step` is {_shown(step)}: a whole number from 0 to {MAX_WHOLE}")
    return CopyRequest("fetch", of_node, step)


def copy_dir_name(step: int) -> str:
    """The folder name of a copy of `step` in a node's tier: `step-000000000040`."""
    return f"step-{step:012d}"


ReceivedHook = Callable[[CheckpointManifest], None]


class CopyServer:
    """Serves this node's checkpoint copies to the job's other nodes and keeps their pushed copies.

    `tier_root` is the node's tier root (local/, buddy/); `node` this node's name (as in the rank
    map); `key` the job's KEY_BYTES-byte key; `port` the TCP port (0: any free one, see `port`
    after start), `host` the address to listen on ('' : every interface).  After a pushed copy is
    in place, `on_received(manifest)` is called with its manifest as held here (tier buddy), before
    the sender hears that the copy is kept; an exception from it is reported through `on_problem` (default: one line on stderr), as is
    anything unexpected in a connection.  `timeout` bounds every socket operation.

    This class is the listener: it accepts connections, at most `max_connections` at a time, each on
    a thread of its own.  What is said on a connection is `_CopySession`; the copies in the tier's
    folders are `_TierCopies`.
    """

    def __init__(self, tier_root: Path, node: str, key: bytes, port: int, host: str = "", *,
                 on_received: ReceivedHook | None = None, on_problem: Callable[[str], None] | None = None,
                 timeout: float = 60.0, max_connections: int = MAX_CONNECTIONS) -> None:
        if (problem := node_name_problem(node)):
            raise ValueError(problem)
        if len(key) != KEY_BYTES:
            raise ValueError(f"the job's key is {KEY_BYTES} bytes, not {len(key)}")
        self.tier_root, self.node, self.host = Path(tier_root), node, host
        self._wanted_port, self._timeout, self._on_problem = port, timeout, on_problem
        self._session = _CopySession(bytes(key), _TierCopies(self.tier_root, node, on_received, self._problem))
        self._slots = threading.BoundedSemaphore(max_connections)
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._active: set[socket.socket] = set()
        self._workers: set[threading.Thread] = set()

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
                    conn, _ = self._listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    # Out of file descriptors, say: the listener stays readable, so wait rather than spin.
                    self._problem(f"cannot accept a connection: {exc.strerror or exc}")
                    self._stop.wait(1.0)
                    continue
                conn.setblocking(True)
                conn.settimeout(self._timeout)
                if not self._slots.acquire(blocking=False):
                    _send_quietly(conn, BUSY)
                    conn.close()
                    continue
                worker = threading.Thread(target=self._connection, args=(conn,), daemon=True,
                                          name=f"copy-transfer-{self.port}")
                with self._lock:
                    self._active.add(conn)
                    self._workers.add(worker)
                worker.start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            self._session.answer(conn)
        except (OSError, TransferError, _StreamError):
            pass  # the peer went away or broke the protocol: it sees its own error; nothing was kept
        except Exception as exc:  # noqa: BLE001 - a bug must not end the server's thread silently
            self._problem(f"unexpected {type(exc).__name__} while serving a copy: {exc}")
        finally:
            conn.close()
            with self._lock:
                self._active.discard(conn)
                self._workers.discard(threading.current_thread())
            self._slots.release()

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

    def answer(self, conn: socket.socket) -> None:
        """Serve the one request of `conn` (OSError, TransferError or _StreamError when the peer breaks off)."""
        server_nonce = os.urandom(NONCE_BYTES)
        conn.sendall(MAGIC + server_nonce)
        client_nonce = _recv_exact(conn, NONCE_BYTES, "the request")
        header = _recv_header(conn, "the request")
        mac = _recv_exact(conn, MAC_BYTES, "the request")
        if not hmac.compare_digest(mac, _mac(self._key, REQUEST_LABEL, server_nonce, client_nonce, header)):
            conn.sendall(_LENGTH.pack(0))
            return
        channel = _Channel(conn, self._key, client_nonce, server_nonce)
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

    def _send_copy(self, channel: _Channel, request: CopyRequest) -> None:
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
            if (problem := _shard_file_problem(directory / shard.name, shard)):
                channel.respond(error=f"{what} is damaged (shard {shard.name}: {problem}); take the next tier")
                return
        channel.respond(manifest=manifest)
        for shard in manifest.shards:
            _send_shard(channel.sock, directory, shard, what)
        channel.sock.sendall(_NAME_LENGTH.pack(0))

    def _keep_pushed(self, channel: _Channel, pushed: CheckpointManifest) -> None:
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
            problem, _ = _receive_shards(channel.sock, tmp, held, what, durable=True)
            if not problem:
                problem = _no_more_bytes(channel.sock, what)
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
            tmp = _new_temporary(folder)
            self._writing.add(tmp)
        return tmp

    def complete(self, tmp: Path, held: CheckpointManifest) -> None:
        """Put the copy received in `tmp` at its final name (OSError when it cannot be stored)."""
        with self._lock:
            _complete(tmp, self.folder_of(held.of_node) / copy_dir_name(held.step), held)

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
                    tmp = _new_temporary(folder)
                    for shard in held.shards:
                        if "/" in shard.name:
                            (tmp / shard.name.split("/")[0]).mkdir(mode=0o700, exist_ok=True)
                        os.link(other / shard.name, tmp / shard.name, follow_symlinks=False)
                    _complete(tmp, folder / copy_dir_name(held.step), held)
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


# ---- the client side ---------------------------------------------------------------------------

def push_copy(host: str, port: int, key: bytes, copy_dir: Path, manifest: CheckpointManifest, *,
              timeout: float = 60) -> bool:
    """Send this node's local copy in `copy_dir` (described by `manifest`, tier local) to the
    CopyServer on `host`:`port`, which keeps it as its buddy copy once every shard verified; True
    when the bytes were sent, False when the server keeps this very copy already (nothing sent).

    `timeout` bounds each network operation (connecting, each read and write), not the whole copy.
    TransferError when the server cannot be reached, refuses the key, or refuses the copy (a shard
    whose bytes do not match the manifest is named); nothing is kept on the server then.
    """
    what = f"pushing {manifest.where} of step {manifest.step} to {host}"
    for shard in manifest.shards:
        if (problem := _shard_file_problem(copy_dir / shard.name, shard)):
            raise TransferError(f"{what}: shard {shard.name} in {copy_dir}: {problem}; the local copy changed after "
                                "its manifest was written: save the checkpoint again")
    request = CopyRequest("push", manifest.of_node, manifest.step, manifest)
    with _connect(host, port, key, request, timeout, what) as channel:
        channel.expect(what)
        if channel.held:
            return False
        try:
            for shard in manifest.shards:
                _send_shard(channel.sock, copy_dir, shard, what)
            channel.sock.sendall(_NAME_LENGTH.pack(0))
            channel.sock.shutdown(socket.SHUT_WR)
        except OSError:
            # The server stops reading when it cannot keep the copy (its disk is full): its answer says why.
            channel.expect(what)
            raise
        channel.expect(what)
    return True


def fetch_copy(host: str, port: int, key: bytes, of_node: str, step: int, dest_dir: Path, *,
               timeout: float = 60, held_on: str | None = None) -> ReceivedCopy:
    """Fetch the copy of `of_node`'s shards of `step` that the CopyServer on `host`:`port` holds
    into `dest_dir`; its manifest as written there, and every shard's size and SHA-256 as received.

    The shards are written into a `.tmp-*` sibling of `dest_dir`, each checked against the server's
    authenticated manifest (size and SHA-256) as it is read; only a whole copy is renamed to
    `dest_dir` (replacing what was there), with its manifest written last, and the returned
    `measured` then equals the manifest's shards (the proof that no second pass is needed).  That
    manifest is the server's, or, with `held_on` (this node's name), relabelled as held here:
    `local` when `held_on` is `of_node`, else `buddy`.  The shards are not fsynced (see the module
    docstring).  `timeout` bounds each network operation.  TransferError when the server cannot be
    reached, refuses the key, holds no such copy, or sends a shard that does not verify (named);
    nothing is left at `dest_dir` or in a temporary then.
    """
    if (problem := node_name_problem(of_node)):
        raise ValueError(problem)
    if held_on is not None and (problem := node_name_problem(held_on)):
        raise ValueError(problem)
    if type(step) is not int or not 0 <= step <= MAX_WHOLE:
        raise ValueError(f"step {step!r} is not a whole number from 0 to {MAX_WHOLE}")
    what = f"fetching {of_node}'s copy of step {step} from {host}"
    request = CopyRequest("fetch", of_node, step)
    with _connect(host, port, key, request, timeout, what) as channel:
        channel.sock.shutdown(socket.SHUT_WR)
        manifest = channel.expect(what)
        if manifest is None or (manifest.of_node, manifest.step) != (of_node, step):
            raise TransferError(f"{what}: {host} answered with another copy's manifest: not a clusterctl copy "
                                "server of this version; take the next tier")
        if held_on is not None:
            manifest = replace(manifest, tier="local" if held_on == of_node else "buddy", held_on=held_on)
        try:
            dest_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = _new_temporary(dest_dir.parent)
        except OSError as exc:
            raise TransferError(f"{what}: cannot make a folder in {dest_dir.parent}: {exc.strerror or exc}; "
                                "check the node's tier root") from None
        try:
            problem, measured = _receive_shards(channel.sock, tmp, manifest, what, durable=False)
            problem = problem or _no_more_bytes(channel.sock, what)
            if problem:
                raise TransferError(f"{problem}; the fetched copy was discarded: take the next tier")
            try:
                _complete(tmp, dest_dir, manifest)
            except OSError as exc:
                raise TransferError(f"{what}: cannot store it as {dest_dir}: {exc.strerror or exc}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return ReceivedCopy(manifest, measured)


# ---- shared pieces -----------------------------------------------------------------------------

class _Channel:
    """One connection after the handshake: authenticated headers both ways."""

    def __init__(self, sock: socket.socket, key: bytes, client_nonce: bytes, server_nonce: bytes) -> None:
        self.sock, self._key = sock, key
        self._client_nonce, self._server_nonce = client_nonce, server_nonce
        self._responses = 0
        self.held = False

    def _response_mac(self, header: bytes) -> bytes:
        return _mac(self._key, RESPONSE_LABEL, self._client_nonce, self._server_nonce,
                    self._responses.to_bytes(4, "big"), header)

    def respond(self, *, manifest: CheckpointManifest | None = None, error: str = "", held: bool = False) -> None:
        """Send the next response header (the server side); `held`: a pushed copy is kept here already."""
        document = {"kind": RESPONSE_KIND, "version": VERSION, "ok": not error, "error": error[:4096],
                    "manifest": manifest.to_json() if manifest is not None else None, "held": held}
        header = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
        mac = self._response_mac(header)
        self._responses += 1
        self.sock.sendall(_LENGTH.pack(len(header)) + header + mac)

    def expect(self, what: str) -> CheckpointManifest | None:
        """Read the next response header (the client side): its manifest when it says ok; TransferError
        with the server's reason otherwise.  `self.held` then says whether the server answered that it
        keeps a pushed copy already."""
        raw_length = _recv_exact(self.sock, _LENGTH.size, "the answer")
        (length,) = _LENGTH.unpack(raw_length)
        if length == 0:
            raise TransferError(f"{what}: the server refused the request: authentication failed (its key is not "
                                "this job's: is another job's or step's copy server on that port?)")
        if length > HEADER_LIMIT:
            raise TransferError(f"{what}: the server announced a {length}-byte answer, more than {HEADER_LIMIT}: "
                                "not a clusterctl copy server of this version")
        header = _recv_exact(self.sock, length, "the answer")
        mac = _recv_exact(self.sock, MAC_BYTES, "the answer")
        if not hmac.compare_digest(mac, self._response_mac(header)):
            raise TransferError(f"{what}: the answer does not carry the job's key: not this job's "
                                "copy server (or tampered with on the way); take the next tier")
        self._responses += 1
        document = _json_object(header, "answer", RESPONSE_KIND)
        _refuse_unknown(document, _RESPONSE_FIELDS, "answer")
        ok, error, body, held = document.get("ok"), document.get("error"), document.get("manifest"), document.get("held")
        if type(ok) is not bool or not isinstance(error, str) or type(held) is not bool:
            raise TransferError(f"{what}: the answer's `ok`, `error` or `held` has the wrong type")
        self.held = held
        if not ok:
            raise TransferError(f"{what}: the server says: {one_line(error)}")
        if body is None:
            return None
        try:
            return CheckpointManifest.from_json(body, "the answer's manifest")
        except RecordError as exc:
            raise TransferError(f"{what}: {exc}") from None


@contextmanager
def _connect(host: str, port: int, key: bytes, request: CopyRequest, timeout: float, what: str) -> Iterator[_Channel]:
    """Connect, check the server's greeting and send the authenticated request; every OSError or broken
    stream on the way or in the body becomes a TransferError saying what failed with which node."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"the job's key is {KEY_BYTES} bytes, not {len(key)}")
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror as exc:
        raise TransferError(f"{what}: cannot resolve node name {host!r} ({exc.strerror}); check the rank map "
                            "and the cluster's DNS") from None
    except OSError as exc:
        raise _network_error(exc, what, host, port, timeout) from None
    try:
        greeting = _recv_exact(sock, len(MAGIC), "the greeting", allow_short=True)
        if greeting == BUSY:
            raise TransferError(f"{what}: {host} is busy with {MAX_CONNECTIONS} other transfers; try again "
                                "in a few seconds", retryable=True)
        if greeting != MAGIC:
            raise TransferError(f"{what}: whatever listens on port {port} of {host} is not a clusterctl copy "
                                "server of this version (another program on that port?)")
        server_nonce = _recv_exact(sock, NONCE_BYTES, "the greeting")
        client_nonce = os.urandom(NONCE_BYTES)
        header = request.to_bytes()
        sock.sendall(client_nonce + _LENGTH.pack(len(header)) + header
                     + _mac(key, REQUEST_LABEL, server_nonce, client_nonce, header))
        yield _Channel(sock, key, client_nonce, server_nonce)
    except (OSError, _StreamError) as exc:
        raise _network_error(exc, what, host, port, timeout) from None
    finally:
        sock.close()




def _network_error(exc: BaseException, what: str, host: str, port: int, timeout: float) -> TransferError:
    if isinstance(exc, TransferError):
        return exc
    if isinstance(exc, _StreamError):
        return TransferError(f"{what}: {exc} ({host} went away or does not speak this protocol); "
                             "take the next tier")
    if isinstance(exc, ConnectionRefusedError):
        return TransferError(f"{what}: connection refused on port {port}: no copy server runs on {host} (its node "
                             "is gone or its first rank has not started it); take the next tier", retryable=True)
    if isinstance(exc, TimeoutError):
        return TransferError(f"{what}: no answer from {host} within {timeout:g} s (the node may be hung or "
                             "unreachable); take the next tier")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
    return TransferError(f"{what}: the connection to {host} port {port} failed: {reason}; take the next tier")


def _mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, count: int, during: str, *, allow_short: bool = False) -> bytes:
    buffer = bytearray(count)
    view = memoryview(buffer)
    got = 0
    while got < count:
        n = sock.recv_into(view[got:], count - got)
        if n == 0:
            if allow_short:
                return bytes(buffer[:got])
            raise _StreamError(f"the peer closed the connection during {during} ({got} of {count} bytes)")
        got += n
    return bytes(buffer)


def _recv_header(sock: socket.socket, during: str) -> bytes:
    (length,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size, during))
    if not 0 < length <= HEADER_LIMIT:
        raise _StreamError(f"{during}: a header of {length} bytes (1 to {HEADER_LIMIT} taken)")
    return _recv_exact(sock, length, during)


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def _json_object(raw: bytes, what: str, kind: str) -> dict[str, Any]:
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise TransferError(f"{what}: not UTF-8 JSON") from None
    if not isinstance(document, dict):
        raise TransferError(f"{what}: not a JSON object")
    if document.get("kind") != kind:
        raise TransferError(f"{what}: kind {_shown(document.get('kind'))}, not {kind!r}")
    version = document.get("version")
    if type(version) is not int or version != VERSION:
        raise TransferError(f"{what}: version {_shown(version)}; this clusterctl speaks version {VERSION} "
                            "(every node of a job runs the same clusterctl: reinstall it)")
    return document


def _refuse_unknown(document: dict[str, Any], known: frozenset[str], what: str) -> None:
    unknown = sorted(str(key) for key in document if key not in known)
    if unknown:
        raise TransferError(f"{what}: unknown field `{one_line(unknown[0][:64])}`")


def _shown(value: object) -> str:
    return one_line(repr(value)[:80])


def _shard_file_problem(path: Path, shard: Shard) -> str | None:
    try:
        info = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_size != shard.size:
        return f"{info.st_size} bytes, not the manifest's {shard.size}"
    return None


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
    if not same or any(_shard_file_problem(directory / s.name, s) for s in kept.shards):
        return None
    return kept


def _send_shard(sock: socket.socket, directory: Path, shard: Shard, what: str) -> None:
    name = shard.name.encode("utf-8")
    try:
        fd = os.open(directory / shard.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TransferError(f"{what}: cannot read shard {shard.name}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        sock.sendall(_NAME_LENGTH.pack(len(name)) + name + _SIZE.pack(shard.size))
        sent = _send_file(sock, file, shard.size)
    if sent != shard.size:
        raise TransferError(f"{what}: shard {shard.name} shrank to {sent} bytes while being sent (the manifest "
                            f"says {shard.size}); save the checkpoint again")


def _send_file(sock: socket.socket, file: BinaryIO, size: int) -> int:
    # socket.sendfile treats count=0 as "the whole file".
    return sock.sendfile(file, 0, size) if size else 0


def _new_temporary(parent: Path) -> Path:
    tmp = parent / f".tmp-{os.urandom(8).hex()}"
    tmp.mkdir(mode=0o700)
    return tmp


def _receive_shards(sock: socket.socket, tmp: Path, manifest: CheckpointManifest, what: str, *,
                    durable: bool) -> tuple[str, tuple[Shard, ...]]:
    """Read every shard of `manifest` into `tmp`, checking each (fsynced when `durable`); ('', every
    shard as measured) when all verified, else the first shard's problem (the rest of the stream is
    read and dropped, so the sender hears the answer).  _StreamError for a stream that is not the
    manifest's frames."""
    buffer = bytearray(CHUNK)
    problem = ""
    measured: list[Shard] = []
    for shard in manifest.shards:
        (length,) = _NAME_LENGTH.unpack(_recv_exact(sock, _NAME_LENGTH.size, f"shard {shard.name}"))
        if not 0 < length <= MAX_NAME_BYTES:
            raise _StreamError(f"expected shard {shard.name}, got a frame with a {length}-byte name "
                                "(a copy whose shards end early?)")
        name = _recv_exact(sock, length, f"shard {shard.name}").decode("utf-8", "replace")
        (size,) = _SIZE.unpack(_recv_exact(sock, _SIZE.size, f"shard {shard.name}"))
        if name != shard.name or size != shard.size:
            raise _StreamError(f"expected shard {shard.name} of {shard.size} bytes, got "
                                f"{one_line(name[:80])!r} of {size} bytes")
        one, sha = _receive_one(sock, tmp, shard, buffer, what, keep=not problem, durable=durable)
        problem = problem or one
        if sha:
            measured.append(Shard(shard.name, shard.size, sha))
    (end,) = _NAME_LENGTH.unpack(_recv_exact(sock, _NAME_LENGTH.size, "the end of the shards"))
    if end != 0:
        raise _StreamError(f"more shards were sent than the manifest's {len(manifest.shards)}")
    return problem, tuple(measured)


def _receive_one(sock: socket.socket, tmp: Path, shard: Shard, buffer: bytearray, what: str, *, keep: bool,
                 durable: bool) -> tuple[str, str]:
    """One shard's bytes from the stream into `tmp` (dropped when not `keep`): (its problem or '', the
    SHA-256 of the bytes written or '' when none were)."""
    view = memoryview(buffer)
    digest = hashlib.sha256()
    fd = -1
    problem = ""
    if keep:
        try:
            if "/" in shard.name:
                (tmp / shard.name.split("/")[0]).mkdir(mode=0o700, exist_ok=True)
            fd = os.open(tmp / shard.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            problem = f"{what}: cannot write shard {shard.name}: {exc.strerror or exc}"
    try:
        remaining = shard.size
        while remaining:
            n = sock.recv_into(view, min(CHUNK, remaining))
            if n == 0:
                raise _StreamError(f"the connection closed in shard {shard.name} "
                                  f"({shard.size - remaining} of {shard.size} bytes)")
            remaining -= n
            if fd < 0:
                continue
            digest.update(view[:n])
            try:
                _write_all(fd, view[:n])
            except OSError as exc:
                problem = f"{what}: cannot write shard {shard.name}: {exc.strerror or exc}"
                os.close(fd)
                fd = -1
        sha = ""
        if fd >= 0:
            try:
                if durable:
                    os.fsync(fd)
            except OSError as exc:
                problem = f"{what}: cannot write shard {shard.name}: {exc.strerror or exc}"
            sha = digest.hexdigest()
            if not problem and sha != shard.sha256:
                problem = (f"{what}: shard {shard.name} fails its checksum (its bytes do not match the manifest's "
                           "SHA-256: changed after the manifest was written, or damaged on the way)")
    finally:
        if fd >= 0:
            os.close(fd)
    return problem, sha


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _no_more_bytes(sock: socket.socket, what: str) -> str:
    # The sender half-closes after its last frame: anything before that end is more than it announced.
    if sock.recv(1):
        return f"{what}: more bytes were sent after the last shard than the manifest announced"
    return ""


def _complete(tmp: Path, final: Path, manifest: CheckpointManifest) -> None:
    """Write the manifest last, make it all durable, and put the copy at its final name."""
    write_checkpoint_manifest(tmp / MANIFEST_NAME, manifest)
    for name in {shard.name.split("/")[0] for shard in manifest.shards if "/" in shard.name}:
        fsync_directory(tmp / name)
    fsync_directory(tmp)
    old = None
    if final.exists() or final.is_symlink():
        old = final.with_name(f".tmp-old-{os.urandom(8).hex()}")
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_directory(final.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
