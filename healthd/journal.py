"""A durable local journal of the Slurm actions healthd decided, applied exactly once.

Each decision is appended (and fsynced) before it is applied; its outcome is appended
after.  A restart replays the journal: decisions without an outcome are applied then,
so slurmctld being down, or healthd being killed, loses and repeats nothing.  The line
format is clusterctl.records.healthd_actions; this class only serialises the threads.
"""

from __future__ import annotations

import threading
from pathlib import Path

from clusterctl.records.healthd_actions import (
    ActionJournal, PlannedAction, append_done, append_planned, read_action_journal,
)

__all__ = ["Journal", "PlannedAction"]


class Journal:
    """The action journal at `path`, safe to append to from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def plan(self, action: PlannedAction) -> None:
        """Journal a decision before it is attempted."""
        with self.lock:
            append_planned(self.path, action)

    def done(self, action_id: str, result: str) -> None:
        """Journal a decision's outcome."""
        with self.lock:
            append_done(self.path, action_id, result)

    def read(self) -> ActionJournal:
        """Every decision and the outcomes known so far (a torn line is skipped and reported)."""
        with self.lock:
            return read_action_journal(self.path)

    def pending(self) -> tuple[PlannedAction, ...]:
        """Decisions without an outcome."""
        return self.read().pending
