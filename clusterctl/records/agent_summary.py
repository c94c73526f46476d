"""The agent's summary of its job: `<job_dir>/agent-summary.json`, rewritten once per interval.

Written by the job's agent (clusterctl.launcher.job.agent), the one process that hears every node's
report; read by the supervisor on the login node (instead of the node table or the ranks' own
files) and by `clusterctl status`.  One small file per job per interval on shared storage, whatever
the job's size: what the agent saw, not every rank's report (names are capped at MAX_NAMES).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import RecordError, check_header, field, header, read_json_record
from clusterctl.slurm.names import node_name_problem

KIND = "agent-summary"
VERSION = 1
SUMMARY_NAME = "agent-summary.json"
MAX_NAMES = 64
"""Node names listed per kind (silent, stopped, drained); beyond that only counted."""
SUMMARY_LIMIT = 1 << 20

STATES = ("starting", "watching", "recovering", "ended")


@dataclass(frozen=True)
class AgentSummary:
    """What the agent last saw of its job's nodes."""

    job_id: str
    launch: str
    """Which step of the job (`0`, `restart-1`, ...)."""
    at: float
    """When written (epoch s, the agent's clock)."""
    interval: float
    """Seconds between two rewrites: a summary older than a few intervals means the agent is gone or stuck."""
    state: str  # one of STATES
    nodes: int
    """Nodes in the running step."""
    reporting: int
    """Nodes whose reporter was heard within the silence limit."""
    silent: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    """Nodes with a rank whose process is stopped or gone."""
    drained: tuple[str, ...] = ()
    """Nodes healthd said it drains."""
    min_step: int | None = None
    max_step: int | None = None
    refused: Mapping[str, int] = dataclass_field(default_factory=dict)
    """Report datagrams refused so far, by kind."""
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "job_id": self.job_id, "launch": self.launch, "at": self.at,
                "interval": self.interval, "state": self.state, "nodes": self.nodes, "reporting": self.reporting,
                "silent": list(self.silent[:MAX_NAMES]), "stopped": list(self.stopped[:MAX_NAMES]),
                "drained": list(self.drained[:MAX_NAMES]), "min_step": self.min_step, "max_step": self.max_step,
                "refused": dict(sorted(self.refused.items())), "message": self.message}

    @classmethod
    def from_json(cls, data: object, where: str) -> AgentSummary:
        """Parse a stored summary; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        state = field(body, "state", str, where)
        if state not in STATES:
            raise RecordError(where, f"state {state!r} is not one of {', '.join(STATES)}")
        refused = field(body, "refused", dict, where)
        if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for k, v in refused.items()):
            raise RecordError(where, "field `refused` must map kinds to counts")
        return cls(job_id=field(body, "job_id", str, where), launch=field(body, "launch", str, where),
                   at=_seconds(body, "at", where), interval=_seconds(body, "interval", where), state=state,
                   nodes=_count(body, "nodes", where), reporting=_count(body, "reporting", where),
                   silent=_names(body, "silent", where), stopped=_names(body, "stopped", where),
                   drained=_names(body, "drained", where), min_step=_optional_count(body, "min_step", where),
                   max_step=_optional_count(body, "max_step", where), refused=refused,
                   message=field(body, "message", str, where))

    def stale(self, now: float) -> bool:
        """True when the agent has not rewritten it for more than three intervals and 30 s."""
        return now - self.at > 3 * self.interval + 30.0


def _seconds(body: Mapping[str, Any], key: str, where: str) -> float:
    value = field(body, key, (int, float), where)
    if isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise RecordError(where, f"field `{key}` is {value!r}: it must be a finite number of seconds, not negative")
    return float(value)


def _count(body: Mapping[str, Any], key: str, where: str) -> int:
    value = field(body, key, int, where)
    if isinstance(value, bool) or value < 0:
        raise RecordError(where, f"field `{key}` is {value!r}: it must be a whole number, not negative")
    return int(value)


def _optional_count(body: Mapping[str, Any], key: str, where: str) -> int | None:
    return None if body.get(key) is None else _count(body, key, where)


def _names(body: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    names = field(body, key, list, where)
    if len(names) > MAX_NAMES:
        raise RecordError(where, f"field `{key}` lists {len(names)} nodes: at most {MAX_NAMES}")
    for name in names:
        problem = node_name_problem(name) if isinstance(name, str) else "not a string"
        if problem:
            raise RecordError(where, f"field `{key}`: {problem}")
    return tuple(names)


def summary_path(job_dir: Path) -> Path:
    """Where the agent of the job in `job_dir` writes its summary."""
    return job_dir / SUMMARY_NAME


def write_agent_summary(job_dir: Path, summary: AgentSummary) -> Path:
    """Replace the summary atomically; its path."""
    return atomic_write(summary_path(job_dir), json.dumps(summary.to_json(), sort_keys=True) + "\n")


def read_agent_summary(job_dir: Path) -> AgentSummary | None:
    """The job's summary, None when the agent has written none; RecordError when it is damaged or foreign
    (read like a file others could plant: no symlink, no FIFO, at most SUMMARY_LIMIT bytes)."""
    path = summary_path(job_dir)
    data = read_json_record(path, missing_ok=True, limit=SUMMARY_LIMIT, follow_symlinks=False)
    return None if data is None else AgentSummary.from_json(data, str(path))
