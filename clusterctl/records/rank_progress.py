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
or stopped process does not.  Version 1 records (a program running an older clusterctl) are
still read, with neither.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import RecordError, check_header, field, header, read_json_record

KIND = "rank-progress"
VERSION = 2
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

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "rank": self.rank, "node": self.node, "step": self.step,
                "phase": self.phase, "at": self.at, "pid": self.pid, "compute_s": self.compute_s,
                "compute_steps": self.compute_steps, "alive_at": self.alive_at}

    @classmethod
    def from_json(cls, data: object, where: str) -> RankProgress:
        """Parse a stored record; RecordError for anything not understood."""
        older = isinstance(data, dict) and data.get("kind") == KIND and data.get("version") == OLDEST_VERSION
        body = check_header(data, KIND, OLDEST_VERSION if older else VERSION, where)
        phase = field(body, "phase", str, where)
        if phase not in PHASES:
            raise RecordError(where, f"phase {phase!r} is not one of {', '.join(PHASES)}")
        compute_s, compute_steps, alive_at = 0.0, 0, 0.0
        if not older:
            compute_s = float(field(body, "compute_s", (int, float), where))
            compute_steps = field(body, "compute_steps", int, where)
            alive_at = float(field(body, "alive_at", (int, float), where))
            if compute_s < 0 or compute_steps < 0 or compute_s != compute_s or compute_s == float("inf"):
                raise RecordError(where, "compute_s and compute_steps must be finite and not negative")
        return cls(rank=field(body, "rank", int, where), node=field(body, "node", str, where),
                   step=field(body, "step", int, where), phase=phase,
                   at=float(field(body, "at", (int, float), where)), pid=field(body, "pid", int, where),
                   compute_s=compute_s, compute_steps=compute_steps, alive_at=alive_at)


def progress_dir(job_dir: Path) -> Path:
    """The folder holding one progress file per rank of a job."""
    return job_dir / "progress"


def rank_progress_path(job_dir: Path, rank: int) -> Path:
    """Where rank `rank` of a job reports its progress."""
    return progress_dir(job_dir) / f"{rank}.json"


def write_rank_progress(job_dir: Path, record: RankProgress) -> Path:
    """Replace the rank's report atomically (a reader sees the previous report or this one); its path."""
    return atomic_write(rank_progress_path(job_dir, record.rank), json.dumps(record.to_json(), sort_keys=True) + "\n")


def read_rank_progress(path: Path) -> RankProgress:
    """One rank's report; RecordError when it is missing, damaged, foreign or from a newer clusterctl."""
    try:
        data = read_json_record(path)
    except FileNotFoundError:
        raise RecordError(str(path), "missing") from None
    record = RankProgress.from_json(data, str(path))
    if path.name != f"{record.rank}.json":
        raise RecordError(str(path), f"holds rank {record.rank}, not the rank its name says")
    return record


def read_progress(job_dir: Path) -> tuple[tuple[RankProgress, ...], tuple[str, ...]]:
    """Every rank's report (by rank), and one problem line per file that could not be read; never raises.

    A rank that has not reported yet has no file.  A damaged file is a problem, not an error: the
    watch judges the ranks it can read, and the caller shows the problems.
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
            records.append(read_rank_progress(path))
        except RecordError as exc:
            problems.append(str(exc))
    return tuple(sorted(records, key=lambda record: record.rank)), tuple(problems)
