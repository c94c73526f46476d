"""One copy of a node's part of a checkpoint on disk: listing its shards with their checksums,
verifying a copy against its manifest, copying one while checking it, and what a transport that
received a copy says it measured of it (`ReceivedCopy`).

A copy is a directory: files at its top, or one level down in a rank's own folder
(`rank-3/__0_0.distcp`), and `manifest.json` (MANIFEST_NAME), which is not a shard.  Anything
else in it (a symlink, a device, a deeper folder) is refused: a copy is only ever written by
clusterctl's own code, so anything else was put there by someone else.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from clusterctl.records.checkpoint_manifest import MAX_SHARDS, CheckpointManifest, Shard, shard_name_problem

MANIFEST_NAME = "manifest.json"
CHUNK = 8 << 20
"""Bytes read at a time while hashing (hashlib releases the GIL on a chunk this size)."""
HASH_THREADS = 8
"""The most shards hashed at once: a node's local ranks each write their own files, and SHA-256 runs
on one core per file (hashlib releases the GIL), so verifying a node's copy scales with its cores."""
PARALLEL_BYTES = 64 << 20
"""Below this many bytes in all, a copy is hashed on the calling thread (a pool costs more than it saves)."""


class CopyError(Exception):
    """A copy cannot be listed, read or moved (the message says which file and why)."""


def shard_names(directory: Path) -> list[str]:
    """The shard names in `directory`, sorted: regular files at its top and one folder down,
    without the manifest.  CopyError for a symlink, a special file or a deeper folder."""
    names: list[str] = []
    try:
        top = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise CopyError(f"cannot list {directory}: {exc.strerror}") from None
    for entry in top:
        if entry.name == MANIFEST_NAME:
            continue
        kind = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISREG(kind):
            names.append(entry.name)
        elif stat.S_ISDIR(kind):
            for inner in sorted(os.scandir(entry.path), key=lambda e: e.name):
                if not stat.S_ISREG(inner.stat(follow_symlinks=False).st_mode):
                    raise CopyError(f"{inner.path}: not a regular file (a checkpoint copy holds files and "
                                    "one level of folders only)")
                names.append(f"{entry.name}/{inner.name}")
        else:
            raise CopyError(f"{entry.path}: not a regular file or folder")
    for name in names:
        if (problem := shard_name_problem(name)):
            raise CopyError(f"{directory}: {problem}")
    if len(names) > MAX_SHARDS:
        raise CopyError(f"{directory}: {len(names)} files, at most {MAX_SHARDS} in one node's copy")
    return names


def file_sha256(path: Path) -> tuple[int, str]:
    """The size and SHA-256 (hex) of the regular file at `path` (never through a symlink)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        digest = hashlib.sha256()
        size = 0
        # One buffer, reused: a fresh 8 MiB object per read costs page faults as well as the copy.
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        while count := os.readv(fd, [buffer]):
            digest.update(view[:count])
            size += count
        return size, digest.hexdigest()
    finally:
        os.close(fd)


def shards_of(directory: Path) -> tuple[Shard, ...]:
    """Every shard of the copy in `directory`, with its size and SHA-256 (CopyError when unreadable)."""
    shards = []
    for name in shard_names(directory):
        try:
            size, sha = file_sha256(directory / name)
        except OSError as exc:
            raise CopyError(f"cannot read {directory / name}: {exc.strerror}") from None
        shards.append(Shard(name, size, sha))
    return tuple(shards)


def verify_copy(directory: Path, manifest: CheckpointManifest) -> str:
    """'' when every shard the manifest lists is in `directory` with its size and SHA-256; else what is
    wrong, as a phrase after "the copy" (`is missing shard rank-1/__0_0.distcp`, `fails its checksum
    (shard params.json)`): the first missing or wrongly sized shard (found before any byte is hashed),
    else the first in the manifest's order that fails its checksum.  Files the manifest does not list
    are ignored.  The shards are hashed on up to HASH_THREADS threads."""
    for shard in manifest.shards:
        if (problem := _shard_file_problem(directory / shard.name, shard)):
            return problem
    return _first_problem(_in_parallel(lambda shard: _shard_sum_problem(directory / shard.name, shard),
                                       manifest.shards))


def copy_verified(source: Path, dest: Path, manifest: CheckpointManifest, *,
                  take: Callable[[int], None] | None = None, fsync: bool = False) -> str:
    """Copy every shard `manifest` lists from `source` into `dest` (made when missing; each shard a new
    file, never written through a symlink), hashing each as it is read: one pass over the bytes instead
    of a copy and then a verification.  '' when every shard copied matches the manifest, else the first
    problem as verify_copy words it (the shards after it are not copied; the caller removes `dest`).
    `take(n)` is called before each n bytes are written (a throttle); `fsync` makes each shard durable.
    OSError when `dest` cannot be written."""
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    for shard in manifest.shards:
        if (problem := _shard_file_problem(source / shard.name, shard)):
            return problem
        target = dest / shard.name
        if "/" in shard.name:
            target.parent.mkdir(mode=0o700, exist_ok=True)
        try:
            src = os.open(source / shard.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            return f"cannot be read (shard {shard.name}: {exc.strerror})"
        try:
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                size, sha = _copy_hashed(src, out, take)
                if fsync:
                    os.fsync(out)
            finally:
                os.close(out)
        finally:
            os.close(src)
        if (size, sha) != (shard.size, shard.sha256):
            return (f"has shard {shard.name} of {size} bytes, not {shard.size} (changed while read?)"
                    if size != shard.size else f"fails its checksum (shard {shard.name})")
    return ""


def link_shards(source: Path, dest: Path, names: Sequence[str]) -> None:
    """Give the named shards of the copy in `source` a second name in `dest` (made when missing): a hard
    link, so staging a copy this node already holds moves no byte; a plain copy where the filesystem
    cannot link.  Only regular files are taken (CopyError otherwise); the caller verifies the result."""
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in names:
        src, target = source / name, dest / name
        if "/" in name:
            target.parent.mkdir(mode=0o700, exist_ok=True)
        if not stat.S_ISREG(os.stat(src, follow_symlinks=False).st_mode):
            raise CopyError(f"{src}: not a regular file")
        try:
            os.link(src, target, follow_symlinks=False)
        except OSError:
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    _copy_hashed(fd, out, None)
                finally:
                    os.close(out)
            finally:
                os.close(fd)


@dataclass(frozen=True)
class ReceivedCopy:
    """A copy a transport wrote into a folder, and its proof of having checked it: `manifest` is the
    copy's (as the sender authenticated it), `measured` each shard's name, size and SHA-256 as the
    receiver counted and hashed the bytes it wrote.  A copy whose `measured` differs from the manifest's
    shards must not be loaded (`problem`); one whose `measured` equals them needs no second pass."""

    manifest: CheckpointManifest
    measured: tuple[Shard, ...]

    def problem(self) -> str:
        """'' when every shard was measured as the manifest lists it; else the first difference, worded
        as verify_copy words it."""
        got = {shard.name: shard for shard in self.measured}
        for shard in self.manifest.shards:
            seen = got.get(shard.name)
            if seen is None:
                return f"is missing shard {shard.name} (the transport did not check it)"
            if seen.size != shard.size:
                return f"has shard {shard.name} of {seen.size} bytes, not {shard.size} (truncated?)"
            if seen.sha256 != shard.sha256:
                return f"fails its checksum (shard {shard.name})"
        return ""


def _shard_file_problem(path: Path, shard: Shard) -> str:
    try:
        info = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return f"is missing shard {shard.name}"
    except OSError as exc:
        return f"cannot be read (shard {shard.name}: {exc.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return f"holds shard {shard.name} as something other than a regular file"
    if info.st_size != shard.size:
        return f"has shard {shard.name} of {info.st_size} bytes, not {shard.size} (truncated?)"
    return ""


def _shard_sum_problem(path: Path, shard: Shard) -> str:
    try:
        size, sha = file_sha256(path)
    except OSError as exc:
        return f"cannot be read (shard {shard.name}: {exc.strerror})"
    if size != shard.size:
        return f"has shard {shard.name} of {size} bytes, not {shard.size} (changed while read?)"
    return "" if sha == shard.sha256 else f"fails its checksum (shard {shard.name})"


def _in_parallel(check: Callable[[Shard], str], shards: Sequence[Shard]) -> list[str]:
    """`check` of every shard, in the shards' order; on threads when there is enough to hash."""
    big = sum(1 for s in shards if s.size >= CHUNK)
    if big < 2 or sum(s.size for s in shards) < PARALLEL_BYTES:
        return [check(shard) for shard in shards]
    # The largest first, so the pool does not end waiting on one big shard started last.
    order = sorted(range(len(shards)), key=lambda i: -shards[i].size)
    with ThreadPoolExecutor(max_workers=min(HASH_THREADS, os.cpu_count() or 1, big),
                            thread_name_prefix="clusterctl-hash") as pool:
        results = dict(zip(order, pool.map(check, [shards[i] for i in order])))
    return [results[i] for i in range(len(shards))]


def _first_problem(problems: Sequence[str]) -> str:
    return next((p for p in problems if p), "")


def _copy_hashed(src: int, out: int, take: Callable[[int], None] | None) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while count := os.readv(src, [buffer]):
        if take is not None:
            take(count)
        digest.update(view[:count])
        chunk = view[:count]
        while chunk:
            chunk = chunk[os.write(out, chunk):]
        size += count
    return size, digest.hexdigest()
