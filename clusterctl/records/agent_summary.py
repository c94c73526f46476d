"""The agent's summary of its job: `<job_dir>/agent-summary.json`, rewritten once per interval.

Written by the job's agent (clusterctl.launcher.job.agent), the one process that hears every node's
report; read by the supervisor on the login node (instead of the node table or the ranks' own
files) and by `clusterctl status`.  One small file per job per interval on shared storage, whatever
the job's size: what the agent saw, not every rank's report (names are capped at MAX_NAMES).

Version 2 adds `training` (`TrainingMetrics`): what the program says of its training, measured over
the nodes' reports (steps/s, tokens/s, FLOP/s, MFU against the GPUs' peak, the loss and gradient
norm of the lowest rank that reported one), or null when the program reports none of it.  A
version-1 summary (an older agent) is still read, with none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import (
    RecordError, check_header, choice_field, field, header, measured_field, measured_to_json, read_json_record,
    seconds_field, whole_field,
)
from clusterctl.slurm.names import node_name_problem

KIND = "agent-summary"
VERSION = 2
OLDEST_VERSION = 1
SUMMARY_NAME = "agent-summary.json"
MAX_NAMES = 64
"""Node names listed per kind (silent, stopped, drained); beyond that only counted."""
SUMMARY_LIMIT = 1 << 20

STATES = ("starting", "watching", "recovering", "ended")
PEAK_SOURCES = ("spec", "nvml", "")
"""Where the GPUs' peak came from: the spec's `[job] gpu_peak_tflops`, NVML's device name, or nowhere."""
MAX_TEXT = 512


@dataclass(frozen=True)
class TrainingMetrics:
    """What the program says of its training, as the agent measured it over its nodes' reports.

    Rates are each node's counters' growth over the last `window_s` seconds (its own clock), summed
    over the `nodes` that grew (`steps_per_s`: their median); None when nothing was reported or no
    node has reported twice yet.  MFU = FLOP/s / (`gpus` x `peak_tflops` x 1e12); None with
    `mfu_missing` saying why when FLOPs are reported but the GPUs' peak is unknown."""

    window_s: float
    nodes: int
    """Nodes whose counters gave a rate."""
    nodes_reporting: int
    """Nodes whose metrics were heard within the window."""
    gpus: int
    """GPUs of the step (its ranks): MFU's denominator."""
    steps_per_s: float | None = None
    tokens_per_s: float | None = None
    flops_per_s: float | None = None
    mfu: float | None = None
    """A fraction (0.41 is 41%)."""
    peak_tflops: float | None = None
    """Dense BF16 TFLOP/s per GPU the MFU is measured against."""
    peak_from: str = ""  # one of PEAK_SOURCES
    gpu: str = ""
    """The GPU model NVML names on the nodes ("" unknown)."""
    mfu_missing: str = ""
    """Why there is no MFU although FLOPs are reported ("" otherwise)."""
    loss: float | None = None
    loss_step: int | None = None
    loss_rank: int | None = None
    grad_norm: float | None = None
    grad_norm_step: int | None = None
    grad_norm_rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The metrics as stored (what `status --json` shows)."""
        return {"window_s": self.window_s, "nodes": self.nodes, "nodes_reporting": self.nodes_reporting,
                "gpus": self.gpus, "steps_per_s": self.steps_per_s, "tokens_per_s": self.tokens_per_s,
                "flops_per_s": self.flops_per_s, "mfu": self.mfu, "peak_tflops": self.peak_tflops,
                "peak_from": self.peak_from, "gpu": self.gpu, "mfu_missing": self.mfu_missing,
                "loss": measured_to_json(self.loss), "loss_step": self.loss_step, "loss_rank": self.loss_rank,
                "grad_norm": measured_to_json(self.grad_norm), "grad_norm_step": self.grad_norm_step,
                "grad_norm_rank": self.grad_norm_rank}

    @classmethod
    def from_json(cls, body: object, where: str) -> TrainingMetrics:
        """Parse a summary's `training`; RecordError for anything not understood."""
        if not isinstance(body, dict):
            raise RecordError(where, "must be an object")
        texts = {key: field(body, key, str, where) for key in ("gpu", "mfu_missing")}
        for key, text in texts.items():
            if len(text) > MAX_TEXT:
                raise RecordError(where, f"field `{key}` is longer than {MAX_TEXT} characters")
        return cls(window_s=seconds_field(body, "window_s", where), nodes=whole_field(body, "nodes", where),
                   nodes_reporting=whole_field(body, "nodes_reporting", where), gpus=whole_field(body, "gpus", where),
                   steps_per_s=_optional_rate(body, "steps_per_s", where),
                   tokens_per_s=_optional_rate(body, "tokens_per_s", where),
                   flops_per_s=_optional_rate(body, "flops_per_s", where), mfu=_optional_rate(body, "mfu", where),
                   peak_tflops=_optional_rate(body, "peak_tflops", where),
                   peak_from=choice_field(body, "peak_from", PEAK_SOURCES, where), gpu=texts["gpu"],
                   mfu_missing=texts["mfu_missing"], loss=measured_field(body, "loss", where),
                   loss_step=_optional_count(body, "loss_step", where),
                   loss_rank=_optional_count(body, "loss_rank", where),
                   grad_norm=measured_field(body, "grad_norm", where),
                   grad_norm_step=_optional_count(body, "grad_norm_step", where),
                   grad_norm_rank=_optional_count(body, "grad_norm_rank", where))


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
    training: TrainingMetrics | None = None
    """What the program says of its training (None: it reports none of it)."""

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "job_id": self.job_id, "launch": self.launch, "at": self.at,
                "interval": self.interval, "state": self.state, "nodes": self.nodes, "reporting": self.reporting,
                "silent": list(self.silent[:MAX_NAMES]), "stopped": list(self.stopped[:MAX_NAMES]),
                "drained": list(self.drained[:MAX_NAMES]), "min_step": self.min_step, "max_step": self.max_step,
                "refused": dict(sorted(self.refused.items())), "message": self.message,
                "training": self.training.to_json() if self.training is not None else None}

    @classmethod
    def from_json(cls, data: object, where: str) -> AgentSummary:
        """Parse a stored summary; RecordError for anything not understood."""
        older = isinstance(data, dict) and data.get("kind") == KIND and data.get("version") == OLDEST_VERSION
        body = check_header(data, KIND, OLDEST_VERSION if older else VERSION, where)
        training = None if older else field(body, "training", (dict, type(None)), where)
        state = field(body, "state", str, where)
        if state not in STATES:
            raise RecordError(where, f"state {state!r} is not one of {', '.join(STATES)}")
        refused = field(body, "refused", dict, where)
        if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for k, v in refused.items()):
            raise RecordError(where, "field `refused` must map kinds to counts")
        return cls(job_id=field(body, "job_id", str, where), launch=field(body, "launch", str, where),
                   at=seconds_field(body, "at", where), interval=seconds_field(body, "interval", where), state=state,
                   nodes=whole_field(body, "nodes", where), reporting=whole_field(body, "reporting", where),
                   silent=_names(body, "silent", where), stopped=_names(body, "stopped", where),
                   drained=_names(body, "drained", where), min_step=_optional_count(body, "min_step", where),
                   max_step=_optional_count(body, "max_step", where), refused=refused,
                   message=field(body, "message", str, where),
                   training=None if training is None else TrainingMetrics.from_json(training, f"{where}: training"))

    def stale(self, now: float) -> bool:
        """True when the agent has not rewritten it for more than three intervals and 30 s."""
        return now - self.at > 3 * self.interval + 30.0


def _optional_count(body: Mapping[str, Any], key: str, where: str) -> int | None:
    return None if body.get(key) is None else whole_field(body, key, where)


def _optional_rate(body: Mapping[str, Any], key: str, where: str) -> float | None:
    if key not in body:
        raise RecordError(where, f"missing field `{key}`")
    if body[key] is None:
        return None
    value = field(body, key, (int, float), where)
    if isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise RecordError(where, f"field `{key}` is {value!r}: a finite number, not negative, or null")
    return float(value)


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
