"""Shared storage emulated on this machine's disk: every byte written to or read from it passes a
token bucket, so a node's checkpoint takes at least bytes / rate, as it would on a parallel
filesystem that gives each node `rate` bytes per second.

The bucket holds `burst_seconds` of bytes (default 0.05 s): a short burst goes at full speed, a long
transfer at `rate` on average.  (A one-second bucket would let a 1 GB checkpoint at 1 GB/s through
without waiting at all.)  `take(n)` accounts for n bytes and sleeps while the bucket is in debt;
the clock and the sleep are passed in so a test runs it on a fake clock.

`ThrottledFileSystem` plugs the bucket into torch.distributed.checkpoint: DCP's FileSystemWriter
and FileSystemReader open every file through their `fs.create_stream`, so wrapping the stream's
write, read and readinto throttles everything DCP moves (shards and .metadata).  `copy_file`
throttles a plain copy the same way (the stand-in's flush).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHUNK = 8 << 20


class Throttle:
    """A token bucket of `rate` bytes per second holding `burst_seconds` of them (rate 0: no limit)."""

    def __init__(self, rate: float, burst_seconds: float = 0.05, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = max(float(rate), 0.0)
        self.capacity = self.rate * max(burst_seconds, 0.0)
        self._clock, self._sleep = clock, sleep
        self._tokens = self.capacity
        self._last = clock()
        self.slept = 0.0
        """Seconds slept so far (how much of a transfer's time the throttle made)."""

    def take(self, count: int) -> None:
        """Account for `count` bytes; sleep until the bucket is out of debt."""
        if self.rate <= 0 or count <= 0:
            return
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate) - count
        self._last = now
        if self._tokens < 0:
            wait = -self._tokens / self.rate
            self._sleep(wait)
            self.slept += wait


class _ThrottledStream:
    """A file object whose reads and writes pass the throttle; everything else is the file's."""

    def __init__(self, raw: Any, throttle: Throttle) -> None:
        self._raw, self._throttle = raw, throttle

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self._throttle.take(size)
        written: int = self._raw.write(data)
        return written

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._raw.read(size)
        self._throttle.take(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        count: int = self._raw.readinto(buffer)
        self._throttle.take(count or 0)
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def throttled_filesystem(throttle: Throttle) -> Any:
    """A DCP FileSystem whose streams pass `throttle` (torch imported here, when asked)."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class ThrottledFileSystem(FileSystem):
        @contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
            with Path(path).open(mode) as stream:
                yield _ThrottledStream(stream, throttle)

    return ThrottledFileSystem()


def copy_file(source: Path, dest: Path, throttle: Throttle | None = None, fsync: bool = False) -> tuple[int, str]:
    """Copy `source` to `dest` (made new) in CHUNK pieces through `throttle`; (bytes, sha256 hex)."""
    digest = hashlib.sha256()
    size = 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb", buffering=0) as src, dest.open("xb", buffering=0) as dst:
        while chunk := src.read(CHUNK):
            if throttle is not None:
                throttle.take(len(chunk))
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[dst.write(view) or 0:]
            size += len(chunk)
        if fsync:
            os.fsync(dst.fileno())
    return size, digest.hexdigest()
