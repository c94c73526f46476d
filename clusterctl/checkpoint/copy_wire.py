"""The copy protocol's wire format, shared by the copy server (clusterctl/checkpoint/copy_server.py)
and its clients (clusterctl/checkpoint/transport.py, whose docstring describes the protocol): the
constants, the request, the authenticated response channel, the framing of shards and the receiver's
`.tmp-*` folder made whole (`complete_copy`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import socket
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from clusterctl.checkpoint.copies import MANIFEST_NAME
from clusterctl.errors import ClusterctlError
from clusterctl.files import fsync_directory
from clusterctl.records.checkpoint_manifest import (
    MANIFEST_LIMIT, MAX_NAME_BYTES, CheckpointManifest, Shard, write_checkpoint_manifest)
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
"""Transfers one server runs at once; a further connection is told BUSY and closed.  A connection takes a
transfer slot only once its request's MAC is checked: strangers cannot hold them."""
HANDSHAKE_SECONDS = 10.0
"""The whole handshake (greeting, request header, MAC) must be over within this: the largest header
(HEADER_LIMIT, ~4 MiB) takes under half a second at 10 MB/s, so only an idle or trickling peer (a slow-loris)
runs into it, and it holds a handshake no longer than this."""
MAX_HANDSHAKES = 32
"""Handshakes one server runs at once (each a thread waiting for a request); a further connection is told
BUSY and closed.  A job's nodes open at most a couple each (a push to their buddy, a fetch)."""
PEER_CONNECTIONS = 8
"""Connections one peer address may hold at once (handshaking or transferring): one host cannot take all
MAX_HANDSHAKES."""
CHUNK = 4 << 20
"""Bytes received at a time (a buffer of this size per connection): a 1 GB fetch over loopback took
1.28-1.35 s with 4 MiB, 1.44-1.46 s with 1 MiB, no less with 16 MiB (median of 4, on a 2-core VM)."""
REQUESTS = ("fetch", "push")
_REQUEST_FIELDS = {"fetch": frozenset({"kind", "version", "request", "of_node", "step"}),
                   "push": frozenset({"kind", "version", "request", "manifest"})}
_RESPONSE_FIELDS = frozenset({"kind", "version", "ok", "error", "manifest", "held"})
LENGTH = struct.Struct(">I")
NAME_LENGTH = struct.Struct(">H")
_SIZE = struct.Struct(">Q")


class TransferError(ClusterctlError):
    """A copy could not be moved between two nodes; the message says what failed, with which node,
    and what to do.  `retryable`: nothing was tried yet and the same call may work in a moment (no
    server listens yet, or it is busy): the peer's first rank may still be starting."""

    exit_code = 14

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class StreamError(Exception):
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
    document = json_object(raw, "request header", REQUEST_KIND)
    request = document.get("request")
    if request not in REQUESTS:
        raise TransferError(f"request header: `request` is {shown(request)}: one of {', '.join(REQUESTS)}")
    refuse_unknown(document, _REQUEST_FIELDS[request], "request header")
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
        raise TransferError(f"request header: `step` is {shown(step)}: a whole number from 0 to {MAX_WHOLE}")
    return CopyRequest("fetch", of_node, step)


def copy_dir_name(step: int) -> str:
    """The folder name of a copy of `step` in a node's tier: `step-000000000040`."""
    return f"step-{step:012d}"


class Channel:
    """One connection after the handshake: authenticated headers both ways."""

    def __init__(self, sock: socket.socket, key: bytes, client_nonce: bytes, server_nonce: bytes) -> None:
        self.sock, self._key = sock, key
        self._client_nonce, self._server_nonce = client_nonce, server_nonce
        self._responses = 0
        self.held = False

    def _response_mac(self, header: bytes) -> bytes:
        return keyed_mac(self._key, RESPONSE_LABEL, self._client_nonce, self._server_nonce,
                    self._responses.to_bytes(4, "big"), header)

    def respond(self, *, manifest: CheckpointManifest | None = None, error: str = "", held: bool = False) -> None:
        """Send the next response header (the server side); `held`: a pushed copy is kept here already."""
        document = {"kind": RESPONSE_KIND, "version": VERSION, "ok": not error, "error": error[:4096],
                    "manifest": manifest.to_json() if manifest is not None else None, "held": held}
        header = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
        mac = self._response_mac(header)
        self._responses += 1
        self.sock.sendall(LENGTH.pack(len(header)) + header + mac)

    def expect(self, what: str) -> CheckpointManifest | None:
        """Read the next response header (the client side): its manifest when it says ok; TransferError
        with the server's reason otherwise.  `self.held` then says whether the server answered that it
        keeps a pushed copy already."""
        raw_length = recv_exact(self.sock, LENGTH.size, "the answer")
        (length,) = LENGTH.unpack(raw_length)
        if length == 0:
            raise TransferError(f"{what}: the server refused the request: authentication failed (its key is not "
                                "this job's: is another job's or step's copy server on that port?)")
        if length > HEADER_LIMIT:
            raise TransferError(f"{what}: the server announced a {length}-byte answer, more than {HEADER_LIMIT}: "
                                "not a clusterctl copy server of this version")
        header = recv_exact(self.sock, length, "the answer")
        mac = recv_exact(self.sock, MAC_BYTES, "the answer")
        if not hmac.compare_digest(mac, self._response_mac(header)):
            raise TransferError(f"{what}: the answer does not carry the job's key: not this job's "
                                "copy server (or tampered with on the way); take the next tier")
        self._responses += 1
        document = json_object(header, "answer", RESPONSE_KIND)
        refuse_unknown(document, _RESPONSE_FIELDS, "answer")
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


def keyed_mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).digest()


def recv_exact(sock: socket.socket, count: int, during: str, *, allow_short: bool = False,
               deadline: float | None = None) -> bytes:
    """Exactly `count` bytes from `sock` (StreamError when the peer closes first; `allow_short`: what came).
    `deadline` (time.monotonic()): TimeoutError once it passes, however the bytes trickle in."""
    buffer = bytearray(count)
    view = memoryview(buffer)
    got = 0
    while got < count:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{during}: {got} of {count} bytes by the deadline")
            sock.settimeout(left)
        n = sock.recv_into(view[got:], count - got)
        if n == 0:
            if allow_short:
                return bytes(buffer[:got])
            raise StreamError(f"the peer closed the connection during {during} ({got} of {count} bytes)")
        got += n
    return bytes(buffer)


def recv_header(sock: socket.socket, during: str, *, deadline: float | None = None) -> bytes:
    """One length-prefixed header (StreamError when its length is 0 or above HEADER_LIMIT)."""
    (length,) = LENGTH.unpack(recv_exact(sock, LENGTH.size, during, deadline=deadline))
    if not 0 < length <= HEADER_LIMIT:
        raise StreamError(f"{during}: a header of {length} bytes (1 to {HEADER_LIMIT} taken)")
    return recv_exact(sock, length, during, deadline=deadline)


def json_object(raw: bytes, what: str, kind: str) -> dict[str, Any]:
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise TransferError(f"{what}: not UTF-8 JSON") from None
    if not isinstance(document, dict):
        raise TransferError(f"{what}: not a JSON object")
    if document.get("kind") != kind:
        raise TransferError(f"{what}: kind {shown(document.get('kind'))}, not {kind!r}")
    version = document.get("version")
    if type(version) is not int or version != VERSION:
        raise TransferError(f"{what}: version {shown(version)}; this clusterctl speaks version {VERSION} "
                            "(every node of a job runs the same clusterctl: reinstall it)")
    return document


def refuse_unknown(document: dict[str, Any], known: frozenset[str], what: str) -> None:
    unknown = sorted(str(key) for key in document if key not in known)
    if unknown:
        raise TransferError(f"{what}: unknown field `{one_line(unknown[0][:64])}`")


def shown(value: object) -> str:
    return one_line(repr(value)[:80])


def shard_file_problem(path: Path, shard: Shard) -> str | None:
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


def send_shard(sock: socket.socket, directory: Path, shard: Shard, what: str) -> None:
    name = shard.name.encode("utf-8")
    try:
        fd = os.open(directory / shard.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TransferError(f"{what}: cannot read shard {shard.name}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        sock.sendall(NAME_LENGTH.pack(len(name)) + name + _SIZE.pack(shard.size))
        sent = _send_file(sock, file, shard.size)
    if sent != shard.size:
        raise TransferError(f"{what}: shard {shard.name} shrank to {sent} bytes while being sent (the manifest "
                            f"says {shard.size}); save the checkpoint again")


def _send_file(sock: socket.socket, file: BinaryIO, size: int) -> int:
    # socket.sendfile treats count=0 as "the whole file".
    return sock.sendfile(file, 0, size) if size else 0


def new_temporary(parent: Path) -> Path:
    tmp = parent / f".tmp-{os.urandom(8).hex()}"
    tmp.mkdir(mode=0o700)
    return tmp


def receive_shards(sock: socket.socket, tmp: Path, manifest: CheckpointManifest, what: str, *,
                    durable: bool) -> tuple[str, tuple[Shard, ...]]:
    """Read every shard of `manifest` into `tmp`, checking each (fsynced when `durable`); ('', every
    shard as measured) when all verified, else the first shard's problem (the rest of the stream is
    read and dropped, so the sender hears the answer).  StreamError for a stream that is not the
    manifest's frames."""
    buffer = bytearray(CHUNK)
    problem = ""
    measured: list[Shard] = []
    for shard in manifest.shards:
        (length,) = NAME_LENGTH.unpack(recv_exact(sock, NAME_LENGTH.size, f"shard {shard.name}"))
        if not 0 < length <= MAX_NAME_BYTES:
            raise StreamError(f"expected shard {shard.name}, got a frame with a {length}-byte name "
                                "(a copy whose shards end early?)")
        name = recv_exact(sock, length, f"shard {shard.name}").decode("utf-8", "replace")
        (size,) = _SIZE.unpack(recv_exact(sock, _SIZE.size, f"shard {shard.name}"))
        if name != shard.name or size != shard.size:
            raise StreamError(f"expected shard {shard.name} of {shard.size} bytes, got "
                                f"{one_line(name[:80])!r} of {size} bytes")
        one, sha = _receive_one(sock, tmp, shard, buffer, what, keep=not problem, durable=durable)
        problem = problem or one
        if sha:
            measured.append(Shard(shard.name, shard.size, sha))
    (end,) = NAME_LENGTH.unpack(recv_exact(sock, NAME_LENGTH.size, "the end of the shards"))
    if end != 0:
        raise StreamError(f"more shards were sent than the manifest's {len(manifest.shards)}")
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
                raise StreamError(f"the connection closed in shard {shard.name} "
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


def no_more_bytes(sock: socket.socket, what: str) -> str:
    # The sender half-closes after its last frame: anything before that end is more than it announced.
    if sock.recv(1):
        return f"{what}: more bytes were sent after the last shard than the manifest announced"
    return ""


def complete_copy(tmp: Path, final: Path, manifest: CheckpointManifest) -> None:
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
