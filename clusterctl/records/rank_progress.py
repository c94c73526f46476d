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
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import RecordError, check_header, field, header, read_json_record
from clusterctl.slurm.names import node_name_problem

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
        node = field(body, "node", str, where)
        problem = node_name_problem(node)
        if problem:
            raise RecordError(where, f"field `node`: {problem}")
        compute_s, compute_steps, alive_at = 0.0, 0, 0.0
        if not older:
            compute_s = _seconds(body, "compute_s", where)
            compute_steps = _count(body, "compute_steps", where)
            alive_at = _seconds(body, "alive_at", where)
        return cls(rank=_count(body, "rank", where), node=node, step=_count(body, "step", where), phase=phase,
                   at=_seconds(body, "at", where), pid=_count(body, "pid", where),
                   compute_s=compute_s, compute_steps=compute_steps, alive_at=alive_at)


def _seconds(body: Mapping[str, Any], key: str, where: str) -> float:
    # JSON as Python reads it admits NaN and Infinity: a NaN time compares false with everything
    # and an infinite one outlasts every other rank's, so either would steer the watches.
    value = float(field(body, key, (int, float), where))
    if not math.isfinite(value) or value < 0:
        raise RecordError(where, f"field `{key}` is {value!r}: it must be a finite number of seconds, not negative")
    return value


def _count(body: Mapping[str, Any], key: str, where: str) -> int:
    value: int = field(body, key, int, where)
    if value < 0:
        raise RecordError(where, f"field `{key}` is {value}: it must not be negative")
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
"""The largest progress file read (bytes): a report is about 250 bytes."""

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
