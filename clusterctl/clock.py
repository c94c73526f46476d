"""The one clock: wall time for records, monotonic time for intervals, UTC and durations as text for humans.

Passed in wherever time matters so tests can drive it; `SYSTEM_CLOCK` is the real one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime


def utc(ts: float) -> str:
    """Seconds since the epoch → `2026-11-22T15:04:05Z` (what journals and drain reasons carry)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration_text(seconds: float | None) -> str:
    """Seconds as a person reads them: `250 ms`, `12.5 s`, `4.8 min`, `2.5 h` (`-` for None)."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def parse_utc(text: str) -> float | None:
    """`2026-11-22T15:04:05Z` → seconds since the epoch; None when it is not that form."""
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Clock:
    """Wall time, monotonic time and sleeping, swappable as one object."""

    now: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


SYSTEM_CLOCK = Clock()
