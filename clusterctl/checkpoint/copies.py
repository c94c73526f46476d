"""One copy of a node's part of a checkpoint on disk: listing its shards with their checksums, and
verifying a copy against its manifest.

A copy is a directory: files at its top, or one level down in a rank's own folder
(`rank-3/__0_0.distcp`), and `manifest.json` (MANIFEST_NAME), which is not a shard.  Anything
else in it (a symlink, a device, a deeper folder) is refused: a copy is only ever written by
clusterctl's own code, so anything else was put there by someone else.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from clusterctl.records.checkpoint_manifest import MAX_SHARDS, CheckpointManifest, Shard, shard_name_problem

MANIFEST_NAME = "manifest.json"
CHUNK = 8 << 20
"""Bytes read at a time while hashing (hashlib releases the GIL on a chunk this size)."""


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
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
            size += len(chunk)
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
    (shard params.json)`), the first trouble found.  Files the manifest does not list are ignored."""
    for shard in manifest.shards:
        path = directory / shard.name
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
        try:
            _, sha = file_sha256(path)
        except OSError as exc:
            return f"cannot be read (shard {shard.name}: {exc.strerror})"
        if sha != shard.sha256:
            return f"fails its checksum (shard {shard.name})"
    return ""
