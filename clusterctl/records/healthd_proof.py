"""healthd's neighbour proofs (`<journal_dir>/proofs.jsonl`): each `healthd prove` run, one line.

Appended by `healthd prove` when a run ends: the node proven, the known-good neighbour, the test (the
built-in TCP link test or the site's command, e.g. nccl-tests' all_reduce_perf), what it measured
(bandwidth in GB/s, latency in microseconds), the verdict and what it was judged against.  The passing
lines are the fleet's healthy history: the next proof's thresholds are relative to their median.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from clusterctl.clock import utc
from clusterctl.files import append_json_line, read_json_lines
from clusterctl.records.versioned import (
    RecordError, check_header, field, number_field, number_or_none_field, strings_field,
)

KIND = "healthd-proof"
VERSION = 1
PROOFS_NAME = "proofs.jsonl"

ProofOutcome = Literal["pass", "fail", "error"]
PROOF_OUTCOMES: tuple[ProofOutcome, ...] = ("pass", "fail", "error")
"""pass (at or above the thresholds); fail (measured, below them); error (no measurement: the job did not
start, the test did not finish, its output could not be read)."""


@dataclass(frozen=True)
class ProofResult:
    """What one proof of a node with a neighbour came to."""

    node: str
    neighbour: str
    test: str
    """Which test measured: "tcp" (built-in) or the site command's argv on one line: history compares like with like."""
    outcome: ProofOutcome
    at: float
    seconds: float = 0.0
    bandwidth_gbs: float | None = None
    """Measured bandwidth, GB/s (nccl-tests: bus bandwidth at the largest size)."""
    latency_us: float | None = None
    """Measured latency, microseconds (nccl-tests: time at the smallest size; tcp: half a round trip)."""
    min_bandwidth_gbs: float | None = None
    """The bandwidth threshold it was judged against."""
    max_latency_us: float | None = None
    basis: str = ""
    """What the thresholds came from: "median of 12 passing proofs" or "absolute floors (3 passing proofs, need 5)"."""
    reasons: tuple[str, ...] = ()
    """Why it failed or could not be judged (empty on a pass)."""
    excerpt: str = ""
    """The tail of the test's output (bounded, one line): the evidence."""

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def to_json(self) -> dict[str, Any]:
        """One line as stored (and `healthd prove --json`)."""
        return {"kind": KIND, "version": VERSION, "node": self.node, "neighbour": self.neighbour, "test": self.test,
                "outcome": self.outcome, "at": self.at, "when": utc(self.at), "seconds": self.seconds,
                "bandwidth_gbs": self.bandwidth_gbs, "latency_us": self.latency_us,
                "min_bandwidth_gbs": self.min_bandwidth_gbs, "max_latency_us": self.max_latency_us,
                "basis": self.basis, "reasons": list(self.reasons), "excerpt": self.excerpt}

    @classmethod
    def from_json(cls, data: object, where: str) -> ProofResult:
        """Parse one line; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        outcome = field(body, "outcome", str, where)
        known = next((o for o in PROOF_OUTCOMES if o == outcome), None)
        if known is None:
            raise RecordError(where, f"unknown proof outcome {outcome!r} (known: {', '.join(PROOF_OUTCOMES)})")
        return cls(field(body, "node", str, where), field(body, "neighbour", str, where), field(body, "test", str, where),
                   known, number_field(body, "at", where), number_field(body, "seconds", where),
                   number_or_none_field(body, "bandwidth_gbs", where), number_or_none_field(body, "latency_us", where),
                   number_or_none_field(body, "min_bandwidth_gbs", where),
                   number_or_none_field(body, "max_latency_us", where),
                   field(body, "basis", str, where), strings_field(body, "reasons", where),
                   field(body, "excerpt", str, where))


def proofs_path(journal_dir: Path) -> Path:
    """Where healthd journals its proofs."""
    return journal_dir / PROOFS_NAME


def append_proof(path: Path, result: ProofResult) -> None:
    """Append one result durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_json_line(path, result.to_json())


def read_proofs(path: Path) -> tuple[ProofResult, ...]:
    """Every result, oldest first (none when the file is missing; a torn last line is skipped); RecordError for a
    line not understood."""
    return tuple(ProofResult.from_json(r, f"{path}: record {n}")
                 for n, r in enumerate(read_json_lines(path).records, start=1))
