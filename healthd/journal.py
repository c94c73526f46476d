"""A durable local journal of the Slurm actions healthd decided, applied exactly once.

Each decision is appended (and fsynced) before it is applied; its outcome is appended
after.  A restart replays the journal: decisions without an outcome are applied then,
so slurmctld being down, or healthd being killed, loses and repeats nothing.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class PlannedAction:
    id: str
    op: str  # "drain" or "resume"
    reason: str
    at: float
    finding: dict


class Journal:
    """Append-only JSON lines: {"planned": {...}} then {"done": id, "result": ...}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def _append(self, record: dict) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self.lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)

    def plan(self, action: PlannedAction) -> None:
        self._append({"planned": asdict(action)})

    def done(self, action_id: str, result: str) -> None:
        self._append({"done": action_id, "result": result})

    def read(self) -> tuple[list[PlannedAction], dict[str, str]]:
        """Every planned action and the results known so far (a torn last line is ignored)."""
        planned: list[PlannedAction] = []
        results: dict[str, str] = {}
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return planned, results
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "planned" in record:
                planned.append(PlannedAction(**record["planned"]))
            elif "done" in record:
                results[record["done"]] = record.get("result", "")
        return planned, results

    def pending(self) -> list[PlannedAction]:
        planned, results = self.read()
        return [a for a in planned if a.id not in results]
