"""Moving one node's checkpoint copy to or from another node of the job over TCP.

Every node's first rank runs a `CopyServer` on the step's port (settings.port).  A node pushes its
local copy of each checkpoint to its buddy (`push_copy`: the buddy keeps it as
`buddy/<of_node>/step-<N>/`), and a node that resumes from a copy another node holds fetches it
(`fetch_copy`).  Only the job's processes know the job's 32-byte key (CLUSTERCTL_REPORT_KEY), and
only they can ask: anyone else on the network (another user's job on a shared node) is refused
before a byte of its request is parsed.

Protocol (version 2), one request per connection:

1. server → client: MAGIC, then a fresh 32-byte nonce; BUSY instead when MAX_CONNECTIONS
   transfers already run, MAX_HANDSHAKES handshakes, or PEER_CONNECTIONS connections from the
   client's address (the client says so and may try again).  Steps 1-2 must be over within
   HANDSHAKE_SECONDS, and a connection takes a transfer slot only after its MAC is checked: idle
   or trickling strangers cannot keep the job's own copies out (issue 40).
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

Where it lives: the wire format both sides share is clusterctl/checkpoint/copy_wire.py, the server
(`CopyServer`) clusterctl/checkpoint/copy_server.py, the clients (`push_copy`, `fetch_copy`) here; every
name callers use (CopyServer, TransferError, the constants...) is importable from here.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from clusterctl.checkpoint.copies import ReceivedCopy
# The public names of the protocol stay importable from here, where callers have always found them.
from clusterctl.checkpoint.copy_server import CopyServer as CopyServer
from clusterctl.checkpoint.copy_server import ReceivedHook as ReceivedHook
from clusterctl.checkpoint.copy_wire import (
    BUSY, CHUNK, HEADER_LIMIT, MAC_BYTES, MAGIC, MAX_CONNECTIONS, NAME_LENGTH, NONCE_BYTES, REQUEST_KIND,
    REQUEST_LABEL, REQUESTS, RESPONSE_KIND, RESPONSE_LABEL, VERSION, LENGTH, Channel, CopyRequest, StreamError,
    TransferError, complete_copy, copy_dir_name, keyed_mac, new_temporary, no_more_bytes, parse_copy_request,
    receive_shards, recv_exact, send_shard, shard_file_problem,
)
from clusterctl.records.checkpoint_manifest import CheckpointManifest
from clusterctl.records.node_report import KEY_BYTES
from clusterctl.records.versioned import MAX_WHOLE
from clusterctl.slurm.names import node_name_problem

__all__ = ["BUSY", "CHUNK", "HEADER_LIMIT", "MAC_BYTES", "MAGIC", "MAX_CONNECTIONS", "NONCE_BYTES", "REQUESTS",
           "REQUEST_KIND", "REQUEST_LABEL", "RESPONSE_KIND", "RESPONSE_LABEL", "VERSION", "CopyRequest",
           "CopyServer", "ReceivedHook", "TransferError", "copy_dir_name", "fetch_copy", "parse_copy_request",
           "push_copy"]


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
        if (problem := shard_file_problem(copy_dir / shard.name, shard)):
            raise TransferError(f"{what}: shard {shard.name} in {copy_dir}: {problem}; the local copy changed after "
                                "its manifest was written: save the checkpoint again")
    request = CopyRequest("push", manifest.of_node, manifest.step, manifest)
    with _connect(host, port, key, request, timeout, what) as channel:
        channel.expect(what)
        if channel.held:
            return False
        try:
            for shard in manifest.shards:
                send_shard(channel.sock, copy_dir, shard, what)
            channel.sock.sendall(NAME_LENGTH.pack(0))
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
            tmp = new_temporary(dest_dir.parent)
        except OSError as exc:
            raise TransferError(f"{what}: cannot make a folder in {dest_dir.parent}: {exc.strerror or exc}; "
                                "check the node's tier root") from None
        try:
            problem, measured = receive_shards(channel.sock, tmp, manifest, what, durable=False)
            problem = problem or no_more_bytes(channel.sock, what)
            if problem:
                raise TransferError(f"{problem}; the fetched copy was discarded: take the next tier")
            try:
                complete_copy(tmp, dest_dir, manifest)
            except OSError as exc:
                raise TransferError(f"{what}: cannot store it as {dest_dir}: {exc.strerror or exc}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return ReceivedCopy(manifest, measured)


@contextmanager
def _connect(host: str, port: int, key: bytes, request: CopyRequest, timeout: float, what: str) -> Iterator[Channel]:
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
        greeting = recv_exact(sock, len(MAGIC), "the greeting", allow_short=True)
        if greeting == BUSY:
            raise TransferError(f"{what}: {host} is busy with {MAX_CONNECTIONS} other transfers; try again "
                                "in a few seconds", retryable=True)
        if greeting != MAGIC:
            raise TransferError(f"{what}: whatever listens on port {port} of {host} is not a clusterctl copy "
                                "server of this version (another program on that port?)")
        server_nonce = recv_exact(sock, NONCE_BYTES, "the greeting")
        client_nonce = os.urandom(NONCE_BYTES)
        header = request.to_bytes()
        sock.sendall(client_nonce + LENGTH.pack(len(header)) + header
                     + keyed_mac(key, REQUEST_LABEL, server_nonce, client_nonce, header))
        yield Channel(sock, key, client_nonce, server_nonce)
    except (OSError, StreamError) as exc:
        raise _network_error(exc, what, host, port, timeout) from None
    finally:
        sock.close()


def _network_error(exc: BaseException, what: str, host: str, port: int, timeout: float) -> TransferError:
    if isinstance(exc, TransferError):
        return exc
    if isinstance(exc, StreamError):
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
