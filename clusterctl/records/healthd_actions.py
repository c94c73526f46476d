"""healthd's action journal (`<journal_dir>/actions.jsonl`): Slurm actions decided, then their outcome.

Each decision is appended (durably) before it is applied, its outcome after.  The next
healthd (after a restart or a crash) reads it back and applies what has no outcome yet,
exactly once.  Lines: `{"kind": "healthd-action", "version": 1, "planned": {...}}` and
`{"kind": "healthd-action", "version": 1, "done": "<id>", "result": "drained"}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any

from clusterctl.files import append_json_line, read_json_lines
from clusterctl.records.healthd_state import StateFinding
from clusterctl.records.versioned import RecordError, check_header, field, header, number_field

KIND = "healthd-action"
VERSION = 1
OPS = ("drain", "resume")


@dataclass(frozen=True)
class PlannedAction:
    """A Slurm action healthd decided on: drain (with its reason) or resume."""

    id: str
    op: str  # "drain" or "resume"
    reason: str  # the drain reason to set, or (resume) the reason being lifted
    at: float  # when it was decided
    finding: StateFinding | None = None  # what caused a drain, for audits

    def to_json(self) -> dict[str, Any]:
        """The `planned` object of a journal line."""
        return {"id": self.id, "op": self.op, "reason": self.reason, "at": self.at,
                "finding": self.finding.to_json() if self.finding else None}

    @classmethod
    def from_json(cls, data: object, where: str) -> PlannedAction:
        """Parse a `planned` object."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "`planned` is not a JSON object")
        op = field(data, "op", str, where)
        if op not in OPS:
            raise RecordError(where, f"unknown op {op!r} (known: {', '.join(OPS)})")
        finding = field(data, "finding", (dict, type(None)), where)
        return cls(field(data, "id", str, where), op, field(data, "reason", str, where),
                   number_field(data, "at", where),
                   StateFinding.from_json(finding, where) if finding is not None else None)


@dataclass(frozen=True)
class ActionJournal:
    """What the journal holds: every decision, the outcomes known, and lines that could not be read."""

    planned: tuple[PlannedAction, ...] = ()
    results: Mapping[str, str] = dataclass_field(default_factory=dict)
    """Outcome by action id, in the order they were journaled."""
    torn_lines: tuple[int, ...] = ()

    @property
    def pending(self) -> tuple[PlannedAction, ...]:
        """Decisions without an outcome: apply them (once) before anything new."""
        return tuple(a for a in self.planned if a.id not in self.results)


def append_planned(path: Path, action: PlannedAction) -> None:
    """Journal a decision, durably, before it is applied."""
    append_json_line(path, {**header(KIND, VERSION), "planned": action.to_json()}, mode=0o600)


def append_done(path: Path, action_id: str, result: str) -> None:
    """Journal the outcome of an applied decision."""
    append_json_line(path, {**header(KIND, VERSION), "done": action_id, "result": result}, mode=0o600)


def read_action_journal(path: Path) -> ActionJournal:
    """Read the journal; a torn line (a crash mid-append) is skipped and reported in `torn_lines`.

    RecordError for a line from a newer healthd or that is not an action record: applying
    actions from a journal this healthd does not understand could drain or resume wrongly.
    """
    lines = read_json_lines(path)
    planned: list[PlannedAction] = []
    results: dict[str, str] = {}
    for number, record in enumerate(lines.records, start=1):
        where = f"{path}: record {number}"
        check_header(record, KIND, VERSION, where)
        if "planned" in record:
            planned.append(PlannedAction.from_json(record["planned"], where))
        elif "done" in record:
            results[field(record, "done", str, where)] = field(record, "result", str, where)
        else:
            raise RecordError(where, "neither `planned` nor `done`")
    return ActionJournal(tuple(planned), results, lines.unreadable_lines)
