"""Flushing a node's copy to shared storage, throttled so that a thousand nodes flushing at once do
not starve the training job's own reads of shared storage.

    <shared dir>/tiers/step-<N:012d>/slot-<s:06d>/    files + manifest.json (tier shared, held_on null)

The copy is written as `.tmp-slot-<s>-<random>` next to its final name, every shard checked
against the source manifest's SHA-256 as it is copied (a copy that went bad on the node is not
flushed as good), the manifest written last, then the folder renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from clusterctl.checkpoint.copies import CHUNK, MANIFEST_NAME, CopyError
from clusterctl.checkpoint.tier import TMP_PREFIX, remove_tree, shared_copy_dir, slot_name
from clusterctl.records.checkpoint_manifest import CheckpointManifest, write_checkpoint_manifest


class Throttle:
    """A token bucket: `take(n)` returns once `n` more bytes fit in `bytes_per_second` (0: at once).

    The bucket holds one second of bytes, so a short burst goes at full speed; a take larger than
    what the bucket holds runs it into debt, which the sleep pays off.  `clock` and `sleep` are
    passed in (time.monotonic and time.sleep by default) so a test runs on a fake clock."""

    def __init__(self, bytes_per_second: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = max(float(bytes_per_second), 0.0)
        self._clock, self._sleep = clock, sleep
        self._tokens = self.rate
        self._last = clock()

    def take(self, count: int) -> None:
        """Account for `count` bytes, sleeping first as long as the rate requires."""
        if self.rate <= 0:
            return
        now = self._clock()
        self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate) - count
        self._last = now
        if self._tokens < 0:
            self._sleep(-self._tokens / self.rate)


def flush_copy(copy_dir: Path, manifest: CheckpointManifest, shared_dir: Path, slot: int,
               throttle: Throttle) -> CheckpointManifest:
    """Copy the copy in `copy_dir` (described by `manifest`) to shared storage as slot `slot`'s copy of
    its step; the shared copy's manifest.  CopyError when a shard cannot be read, does not match the
    manifest, or cannot be written (nothing half-written is left under the final name)."""
    final = shared_copy_dir(shared_dir, manifest.step, slot)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{TMP_PREFIX}{slot_name(slot)}-{os.urandom(4).hex()}")
    try:
        tmp.mkdir()
        for shard in manifest.shards:
            _copy_shard(copy_dir / shard.name, tmp / shard.name, shard.size, shard.sha256, throttle)
        shared = CheckpointManifest(step=manifest.step, of_node=manifest.of_node, tier="shared", held_on=None,
                                    shards=manifest.shards, written_at=time.time(),
                                    save_seconds=manifest.save_seconds, slot=slot, slots=manifest.slots)
        write_checkpoint_manifest(tmp / MANIFEST_NAME, shared)
        if final.exists():
            remove_tree(final)  # the same step saved again after a resume from an older one
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        return shared
    except OSError as exc:
        raise CopyError(f"cannot flush {manifest.where} of step {manifest.step} to {final}: "
                        f"{exc.strerror or exc}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _copy_shard(source: Path, dest: Path, size: int, sha256: str, throttle: Throttle) -> None:
    dest.parent.mkdir(exist_ok=True)
    digest = hashlib.sha256()
    copied = 0
    src_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst_fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            while chunk := os.read(src_fd, CHUNK):
                throttle.take(len(chunk))
                digest.update(chunk)
                copied += len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst_fd, view):]
            os.fsync(dst_fd)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)
    if copied != size or digest.hexdigest() != sha256:
        raise CopyError(f"{source}: {copied} bytes that do not match the copy's manifest (changed or damaged "
                        "on the node); not flushed")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
