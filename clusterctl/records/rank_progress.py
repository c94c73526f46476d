"""How far one rank has got: `<job_dir>/progress/<rank>.json`, rewritten as the rank steps.

Written by `clusterctl.progress.beat` inside the training program (at most about once a second,
and at each change of phase); read by the hang watch (clusterctl.launcher.pure.hang_watch), which
learns the job's step time from it and names the node of a rank that stopped progressing, and by
the straggler watch (clusterctl.launcher.pure.straggler_watch), which compares the ranks' compute time.

Version 2 adds `compute_s` / `compute_steps`: the rank's own compute time summed over the steps
it reported one for (cumulative since the process started, so reports skipped by the rate limit
lose nothing: a reader divides the growth between two reads); and `alive_at`, when the rank's
process last showed it runs at all (a thread of clusterctl.progress rewrites the report every
interval, whatever the training loop does): a rank blocked in a collective stays alive, a frozen
or stopped process does not.  Version 3 adds what the program says of its training
(`beat(step, tokens=..., flops=..., loss=..., grad_norm=...)`): `tokens` and `flops` summed since the
process started, like `compute_s`; `loss` and `grad_norm` as of the step beside each (`loss_step`,
`grad_norm_step`; null when never reported; a loss that went NaN or infinite is written "nan", "inf",
"-inf").  Version 1 and 2 records (a program running an older clusterctl) are still read, without what
they lack.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import (
    RecordError, check_header, count_field, dated_field, field, finite_field, header, measured_field,
    measured_to_json, read_json_record, seconds_field,
)
from clusterctl.slurm.names import node_name_problem

KIND = "rank-progress"
VERSION = 3
OLDEST_VERSION = 1

PHASES = ("startup", "step", "checkpoint-save", "checkpoint-load")
"""What a rank may say it is doing; each has its own timeout in the hang watch."""


@dataclass(frozen=True)
class RankProgress:
    """One rank's last report: the step it reached, what it was doing, and when (its own clock)."""

    rank: int
    node: str  # SLURMD_NODENAME (the name the rank map uses)
    step: int
    phase: str  # one of PHASES
    at: float  # epoch seconds
    pid: int
    compute_s: float = 0.0
    """Seconds this rank spent computing (not waiting for peers) over `compute_steps` steps, since it started."""
    compute_steps: int = 0
    alive_at: float = 0.0
    """When the rank's process last showed it runs (epoch s; 0: not reported)."""
    tokens: float = 0.0
    """Tokens this rank processed since it started (its share: see clusterctl.progress.beat)."""
    flops: float = 0.0
    """Floating-point operations this rank did since it started."""
    loss: float | None = None
    """The loss as of `loss_step` (None: never reported; NaN and infinities are kept)."""
    loss_step: int | None = None
    grad_norm: float | None = None
    """The gradient norm as of `grad_norm_step` (None: never reported)."""
    grad_norm_step: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "rank": self.rank, "node": self.node, "step": self.step,
                "phase": self.phase, "at": self.at, "pid": self.pid, "compute_s": self.compute_s,
                "compute_steps": self.compute_steps, "alive_at": self.alive_at, "tokens": self.tokens,
                "flops": self.flops, "loss": measured_to_json(self.loss), "loss_step": self.loss_step,
                "grad_norm": measured_to_json(self.grad_norm), "grad_norm_step": self.grad_norm_step}

    @property
    def has_metrics(self) -> bool:
        """The program reported tokens, FLOPs, a loss or a gradient norm through this rank."""
        return self.tokens > 0 or self.flops > 0 or self.loss is not None or self.grad_norm is not None

    @classmethod
    def from_json(cls, data: object, where: str) -> RankProgress:
        """Parse a stored record; RecordError for anything not understood."""
        found = data.get("version") if isinstance(data, dict) and data.get("kind") == KIND else None
        older = found if found in (1, 2) else None
        body = check_header(data, KIND, older or VERSION, where)
        phase = field(body, "phase", str, where)
        if phase not in PHASES:
            raise RecordError(where, f"phase {phase!r} is not one of {', '.join(PHASES)}")
        node = field(body, "node", str, where)
        problem = node_name_problem(node)
        if problem:
            raise RecordError(where, f"field `node`: {problem}")
        compute_s, compute_steps, alive_at = 0.0, 0, 0.0
        if older != 1:
            compute_s = seconds_field(body, "compute_s", where)
            compute_steps = count_field(body, "compute_steps", where)
            alive_at = seconds_field(body, "alive_at", where)
        record = cls(rank=count_field(body, "rank", where), node=node, step=count_field(body, "step", where),
                     phase=phase,
                     at=seconds_field(body, "at", where), pid=count_field(body, "pid", where),
                     compute_s=compute_s, compute_steps=compute_steps, alive_at=alive_at)
        if older is not None:
            return record
        loss, grad_norm = measured_field(body, "loss", where), measured_field(body, "grad_norm", where)
        if grad_norm is not None and grad_norm < 0:
            raise RecordError(where, f"field `grad_norm` is {grad_norm!r}: a norm is not negative")
        return replace(record, tokens=_total(body, "tokens", where), flops=_total(body, "flops", where),
                       loss=loss, loss_step=dated_field(body, "loss_step", loss, where),
                       grad_norm=grad_norm, grad_norm_step=dated_field(body, "grad_norm_step", grad_norm, where))


MAX_TOTAL = 1e35
"""The largest token or FLOP count a record holds: beyond any training run (the largest are ~1e26 FLOPs),
so a node's sum of 64 ranks stays a finite number whatever a rank's file says."""


def _total(body: Mapping[str, Any], key: str, where: str) -> float:
    value = finite_field(body, key, where, what="a finite count")
    if value > MAX_TOTAL:
        raise RecordError(where, f"field `{key}` is {value!r}: more than any training run counts ({MAX_TOTAL:g})")
    return value


def progress_dir(job_dir: Path) -> Path:
    """The folder holding one progress file per rank of a job."""
    return job_dir / "progress"


def rank_progress_path(job_dir: Path, rank: int) -> Path:
    """Where rank `rank` of a job reports its progress."""
    return progress_dir(job_dir) / f"{rank}.json"


def write_rank_progress(job_dir: Path, record: RankProgress) -> Path:
    """Replace the rank's report atomically (a reader sees the previous report or this one); its path."""
    return atomic_write(rank_progress_path(job_dir, record.rank), json.dumps(record.to_json(), sort_keys=True) + "\n")


PROGRESS_LIMIT = 64 << 10
"""The largest progress file read (bytes): a report is about 350 bytes."""

FUTURE_TOLERANCE = 60.0
"""How far (seconds) a report's times may lie ahead of the reader's clock: the hosts' clocks agree
much better than that (Slurm and munge need it), so a report from further ahead is refused."""


def read_rank_progress(path: Path, now: float | None = None) -> RankProgress:
    """One rank's report; RecordError when it is missing, damaged, foreign or from a newer clusterctl.

    Read like a file others could plant: never through a symlink, never from a FIFO or a device
    (O_NONBLOCK|O_NOFOLLOW, regular files only), at most PROGRESS_LIMIT bytes.  Its times must be
    finite and not negative, and with `now` (the reader's clock, epoch s) not more than
    FUTURE_TOLERANCE ahead of it: a time from the future would make every other rank look silent.
    """
    try:
        data = read_json_record(path, limit=PROGRESS_LIMIT, follow_symlinks=False)
    except FileNotFoundError:
        raise RecordError(str(path), "missing") from None
    record = RankProgress.from_json(data, str(path))
    if path.name != f"{record.rank}.json":
        raise RecordError(str(path), f"holds rank {record.rank}, not the rank its name says")
    if now is not None:
        ahead = max(record.at, record.alive_at) - now
        if ahead > FUTURE_TOLERANCE:
            raise RecordError(str(path), f"dated {ahead:.0f} s ahead of this host's clock (a clock out of step, or "
                                         "a forged time): ignored, so it cannot make the other ranks look silent")
    return record


def read_progress(job_dir: Path, now: float | None = None) -> tuple[tuple[RankProgress, ...], tuple[str, ...]]:
    """Every rank's report (by rank), and one problem line per file that could not be read; never raises.

    A rank that has not reported yet has no file.  A damaged file is a problem, not an error: the
    watch judges the ranks it can read, and the caller shows the problems.  A refused report is
    that rank's alone: the other ranks' reports are still read (see `read_rank_progress`; pass the
    reader's clock as `now`).
    """
    try:
        paths = sorted(path for path in progress_dir(job_dir).iterdir() if path.name.endswith(".json"))
    except FileNotFoundError:
        return (), ()
    except OSError as exc:
        return (), (f"{progress_dir(job_dir)}: cannot list: {exc.strerror}",)
    records: list[RankProgress] = []
    problems: list[str] = []
    for path in paths:
        try:
            records.append(read_rank_progress(path, now))
        except RecordError as exc:
            problems.append(str(exc))
    return tuple(sorted(records, key=lambda record: record.rank)), tuple(problems)
