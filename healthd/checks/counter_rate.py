"""Error counters judged by their rate, not their total: how fast a counter climbs over a short window.

A total says nothing about now (a port that took 40 symbol errors last month is fine today); a rate does.
Counters go back down when they are reset (an admin's `perfquery -x`, a driver reload, a GPU reset) or
wrap: a read lower than the last starts a new baseline and never yields a rate, so a reset is never
mistaken for a burst.  A rate is only given once the reads span `min_span` seconds, so one error seen
between two reads a fraction of a second apart is not called a storm; after a long gap (healthd paused,
the host suspended) the rate is the mean over the gap, never a spike.
"""

from __future__ import annotations

from collections import deque


class CounterRates:
    """The recent reads of each counter (by key), and its rate per minute over the last `window` seconds."""

    def __init__(self, window: float = 60.0, min_span: float = 30.0) -> None:
        if not 0 < min_span <= window:
            raise ValueError(f"min_span {min_span} must be positive and at most window {window}")
        self.window, self.min_span = window, min_span
        self._reads: dict[str, deque[tuple[float, int]]] = {}

    def per_minute(self, key: str, value: int, now: float) -> float | None:
        """Record `value` of counter `key` read at `now`; its rate per minute, or None when it cannot be told yet
        (first read, a reset or wrap, the clock going back, reads spanning less than `min_span`)."""
        reads = self._reads.setdefault(key, deque())
        if reads and (value < reads[-1][1] or now < reads[-1][0]):
            reads.clear()  # reset, wrap or a clock step back: what came before says nothing any more
        reads.append((now, value))
        # Keep the newest read at least `window` old as the baseline, and nothing older.
        while len(reads) > 2 and reads[1][0] <= now - self.window:
            reads.popleft()
        then, first = reads[0]
        span = now - then
        if span < self.min_span:
            return None
        return (value - first) * 60.0 / span

    def forget(self, keep: set[str]) -> None:
        """Drop every counter not in `keep` (a device or link that went away)."""
        for key in [k for k in self._reads if k not in keep]:
            del self._reads[key]
