"""The hooks' log of jobs refused on this node (`<journal_dir>/node-record.jsonl`), one line each.

Appended by the prolog when it refuses a job; read by admins and tests to learn why a
node left service at a job's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import append_json_line, read_json_lines
from clusterctl.records.versioned import check_header, field, header, strings_field

KIND = "healthd-node-record"
VERSION = 1
NODE_RECORD_NAME = "node-record.jsonl"


@dataclass(frozen=True)
class NodeRecordEntry:
    """One refusal: which hook, which job, the problems it saw and what it did about the node."""

    at: str  # UTC
    hook: str  # "prolog"
    job_id: str
    node: str
    problems: tuple[str, ...]
    outcome: str  # "drained: healthd: ...", "already drained (...)", "could not drain (...)"

    def to_json(self) -> dict[str, Any]:
        """One line as stored."""
        return {**header(KIND, VERSION), "at": self.at, "hook": self.hook, "job": self.job_id, "node": self.node,
                "problems": list(self.problems), "outcome": self.outcome}

    @classmethod
    def from_json(cls, data: object, where: str) -> NodeRecordEntry:
        """Parse one line; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        return cls(field(body, "at", str, where), field(body, "hook", str, where), field(body, "job", str, where),
                   field(body, "node", str, where), strings_field(body, "problems", where),
                   field(body, "outcome", str, where))


def node_record_path(journal_dir: Path) -> Path:
    """Where the hooks keep their log."""
    return journal_dir / NODE_RECORD_NAME


def append_node_record(journal_dir: Path, entry: NodeRecordEntry) -> None:
    """Append one entry durably."""
    journal_dir.mkdir(parents=True, exist_ok=True)
    append_json_line(node_record_path(journal_dir), entry.to_json())


def read_node_record(journal_dir: Path) -> tuple[NodeRecordEntry, ...]:
    """Every entry (a torn last line is skipped); RecordError for a line not understood."""
    path = node_record_path(journal_dir)
    return tuple(NodeRecordEntry.from_json(r, f"{path}: record {n}")
                 for n, r in enumerate(read_json_lines(path).records, start=1))
