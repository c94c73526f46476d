"""What the GPU checks remember between samples: conditions that matter only when they last (temperature,
clock slowdowns), and error counters judged by their rate (NVLink)."""

from __future__ import annotations

from clusterctl.healthd.checks.counter_rate import CounterRates


class Sustained:
    """Remembers since when each condition has been true (forgets it as soon as it is not), and the recent
    reads of each GPU error counter (`rates`)."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}
        self.rates = CounterRates()

    def duration(self, key: str, active: bool, now: float) -> float | None:
        """Seconds the condition has held (None if it does not hold now)."""
        if not active:
            self.since.pop(key, None)
            return None
        return now - self.since.setdefault(key, now)
