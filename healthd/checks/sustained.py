"""Conditions that matter only when they last (temperature, clock slowdowns)."""

from __future__ import annotations


class Sustained:
    """Remembers since when each condition has been true; forgets it as soon as it is not."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}

    def duration(self, key: str, active: bool, now: float) -> float | None:
        """Seconds the condition has held (None if it does not hold now)."""
        if not active:
            self.since.pop(key, None)
            return None
        return now - self.since.setdefault(key, now)
