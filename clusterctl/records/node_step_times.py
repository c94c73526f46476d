"""Per-node compute time per step of a running job: `<job_dir>/step_times.json`.

Written by the in-allocation agent (clusterctl.launcher.job.agent) from its straggler watch
every few seconds while a step runs; read by `clusterctl status` and `clusterctl report` to show
which node is slow, by how much, and what it has cost.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import (
    RecordError, check_header, field, header, number_field, number_or_none_field, read_json_record,
)

KIND = "node-step-times"
VERSION = 1
NAME = "step_times.json"
STATES = ("ok", "slow", "straggler")


@dataclass(frozen=True)
class NodeStepTime:
    """One node: its ranks, its slowest rank's compute seconds per step, that over the job's, its state."""

    node: str
    ranks: tuple[int, ...]
    seconds: float | None
    ratio: float | None
    state: str  # one of STATES: ok; slow (a streak at or above the margin, not yet long enough); straggler
    lost_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """As stored."""
        return {"node": self.node, "ranks": list(self.ranks), "seconds": self.seconds, "ratio": self.ratio,
                "state": self.state, "lost_s": self.lost_s}

    @classmethod
    def from_json(cls, data: object, where: str) -> NodeStepTime:
        """Parse one node's line; RecordError naming what is wrong."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "a node's step time is not a JSON object")
        ranks = field(data, "ranks", list, where)
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise RecordError(where, "field `ranks` must be a list of whole numbers")
        state = field(data, "state", str, where)
        if state not in STATES:
            raise RecordError(where, f"field `state` is {state!r}, not one of {', '.join(STATES)}")
        return cls(node=field(data, "node", str, where), ranks=tuple(ranks),
                   seconds=number_or_none_field(data, "seconds", where),
                   ratio=number_or_none_field(data, "ratio", where),
                   state=state, lost_s=number_field(data, "lost_s", where))


@dataclass(frozen=True)
class NodeStepTimes:
    """A job's per-node step times at `at` (epoch s): the reference (lower median over its nodes),
    seconds lost to slow nodes in this job so far, and each node's line."""

    job_id: str
    at: float
    step: int
    reference: float | None
    lost_s: float
    nodes: tuple[NodeStepTime, ...]

    def to_json(self) -> dict[str, Any]:
        """As stored."""
        return {**header(KIND, VERSION), "job_id": self.job_id, "at": self.at, "step": self.step,
                "reference": self.reference, "lost_s": self.lost_s, "nodes": [n.to_json() for n in self.nodes]}

    @classmethod
    def from_json(cls, data: object, where: str) -> NodeStepTimes:
        """Parse a stored record; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        return cls(job_id=field(body, "job_id", str, where), at=number_field(body, "at", where),
                   step=field(body, "step", int, where), reference=number_or_none_field(body, "reference", where),
                   lost_s=number_field(body, "lost_s", where),
                   nodes=tuple(NodeStepTime.from_json(n, where) for n in field(body, "nodes", list, where)))


def step_times_path(job_dir: Path) -> Path:
    """Where a job's per-node step times are kept."""
    return job_dir / NAME


def write_node_step_times(job_dir: Path, record: NodeStepTimes) -> Path:
    """Replace the job's step-time table atomically; its path."""
    return atomic_write(step_times_path(job_dir), json.dumps(record.to_json(), sort_keys=True) + "\n")


def read_node_step_times(job_dir: Path) -> NodeStepTimes | None:
    """The job's step-time table; None when the job has none (no agent, or nothing compared yet);
    RecordError when it is damaged or from a newer clusterctl."""
    path = step_times_path(job_dir)
    data = read_json_record(path, missing_ok=True)
    if data is None:
        return None
    return NodeStepTimes.from_json(data, str(path))
