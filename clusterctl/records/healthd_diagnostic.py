"""healthd's diagnostic journal (`<journal_dir>/diagnostics.jsonl`): each active diagnostic run, one line.

Appended by the daemon (after_failure, before_return) and the prolog (preflight) when a run ends: which
diagnostic (its argv), its level, its outcome, the exit code, the one-line summary and a bounded excerpt
of its output.  The daemon reads the last lines back at start: a node drained before a restart still
needs a pass newer than its drain to return to service, and one it has is not asked for again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from clusterctl.clock import utc
from clusterctl.files import append_json_line, read_json_lines
from clusterctl.records.versioned import RecordError, check_header, field, header, number_field

KIND = "healthd-diagnostic"
VERSION = 1
DIAGNOSTICS_NAME = "diagnostics.jsonl"

Level = Literal["preflight", "after_failure", "before_return"]
LEVELS: tuple[Level, ...] = ("preflight", "after_failure", "before_return")
Outcome = Literal["pass", "fail", "timeout", "error"]
OUTCOMES: tuple[Outcome, ...] = ("pass", "fail", "timeout", "error")
"""pass; fail (the diagnostic says the node is bad); timeout (no answer in time); error (could not run it,
or its output could not be read): only "pass" lets a node return."""


@dataclass(frozen=True)
class DiagnosticResult:
    """What one run of a diagnostic came to."""

    level: Level
    name: str
    """Its argv, one line (`dcgmi diag -r 3 -j`)."""
    outcome: Outcome
    at: float
    """When it finished (seconds since the epoch): a pass counts only if newer than the drain."""
    seconds: float = 0.0
    exit_code: int | None = None
    summary: str = ""
    """One line an admin acts on: the failed tests and their messages, or why it could not be read."""
    excerpt: str = ""
    """The tail of its output (bounded, one line): the evidence."""

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def describe(self) -> str:
        """`dcgmi diag -r 3 -j: fail (failed: Memory gpu0: ...)`."""
        return f"{self.name}: {self.outcome}" + (f" ({self.summary})" if self.summary else "")

    def to_json(self) -> dict[str, Any]:
        """One line as stored."""
        return {**header(KIND, VERSION), "level": self.level, "name": self.name, "outcome": self.outcome,
                "at": self.at, "when": utc(self.at), "seconds": self.seconds, "exit_code": self.exit_code,
                "summary": self.summary, "excerpt": self.excerpt}

    @classmethod
    def from_json(cls, data: object, where: str) -> DiagnosticResult:
        """Parse one line; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        level = field(body, "level", str, where)
        outcome = field(body, "outcome", str, where)
        known_level = next((lv for lv in LEVELS if lv == level), None)
        known_outcome = next((o for o in OUTCOMES if o == outcome), None)
        if known_level is None:
            raise RecordError(where, f"unknown diagnostic level {level!r} (known: {', '.join(LEVELS)})")
        if known_outcome is None:
            raise RecordError(where, f"unknown diagnostic outcome {outcome!r} (known: {', '.join(OUTCOMES)})")
        return cls(known_level, field(body, "name", str, where), known_outcome,
                   number_field(body, "at", where), number_field(body, "seconds", where),
                   field(body, "exit_code", (int, type(None)), where), field(body, "summary", str, where),
                   field(body, "excerpt", str, where))


def diagnostics_path(journal_dir: Path) -> Path:
    """Where healthd journals its diagnostics."""
    return journal_dir / DIAGNOSTICS_NAME


def append_diagnostic(journal_dir: Path, result: DiagnosticResult) -> None:
    """Append one result durably."""
    journal_dir.mkdir(parents=True, exist_ok=True)
    append_json_line(diagnostics_path(journal_dir), result.to_json())


def read_diagnostics(journal_dir: Path) -> tuple[DiagnosticResult, ...]:
    """Every result, oldest first (a torn last line is skipped); RecordError for a line not understood."""
    path = diagnostics_path(journal_dir)
    return tuple(DiagnosticResult.from_json(r, f"{path}: record {n}")
                 for n, r in enumerate(read_json_lines(path).records, start=1))
