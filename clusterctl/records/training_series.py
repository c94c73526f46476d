"""A job's training over time: `<job_dir>/training-series.jsonl`, one point a line, appended.

Written by the job's agent (clusterctl.launcher.job.agent): each time it rewrites its summary
(`agent_summary.py`) and the job's step has moved since its last point, it appends one line with
the summary's training figures, as in

    {"kind": "training-point", "version": 1, "at": 1795667322.8, "job_id": "2", "launch": "0",
     "step": 14, "steps_per_s": 6.5, "tokens_per_s": 319488.0, "mfu": 0.41, "loss": 2.31, ...}

Read by `clusterctl report` (`--html` draws the curves; `launcher/pure/training_curves.py` thins
them).  One line of a few hundred bytes per summary interval per job, whatever the job's size:
nothing per node or rank.  A figure the program did not report (or no rate yet) is absent, not 0;
a loss or gradient norm that went NaN or infinite is written "nan" / "inf" (`measured_to_json`).

Lines are appended with O_APPEND, one write each (`files.append_json_line`); a line torn by a crash
mid-append is cut off by the next append, so a torn line is only ever the last.  The reader
(`TrainingSeriesReader`) streams the file: an incomplete last line is left out and said
(`last_line_problem`); a damaged line anywhere else, or a point of a newer version, is a
RecordError naming the file and the line.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import UnreadableFileError, append_json_line, read_lines, read_tail
from clusterctl.records.agent_summary import AgentSummary
from clusterctl.records.versioned import (
    MAX_WHOLE, NON_FINITE, RecordError, check_header, header, measured_field, measured_to_json, refuse_unknown,
)
from clusterctl.slurm.names import is_job_id, is_node_name, job_id_problem, node_name_problem
from clusterctl.text import one_line

KIND = "training-point"
VERSION = 1
SERIES_NAME = "training-series.jsonl"
SERIES_LIMIT = 1 << 30
"""The largest series read (bytes): ~3 million points, months of a job at the shortest interval (2 s)."""
LAUNCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A step's name (`0`, `restart-1`)."""

RATES = ("steps_per_s", "tokens_per_s", "flops_per_s", "mfu")
MEASURED = ("loss", "grad_norm")
STEP_TIMES = ("slowest_step_s", "reference_step_s")
FIGURES = (*RATES, *STEP_TIMES)
"""Figures that are finite and not negative, or absent."""
KNOWN = frozenset({"kind", "version", "at", "job_id", "launch", "step", "slowest_node", *FIGURES, *MEASURED})


@dataclass(frozen=True)
class TrainingPoint:
    """The job's training at one summary: its step and what the program reported of it (None: not reported)."""

    at: float
    """When the agent wrote the summary (epoch s, its clock)."""
    job_id: str
    launch: str
    """Which step of the job (`0`, `restart-1`, ...): a restart inside the allocation starts a new one."""
    step: int
    """The newest step a rank reported (the summary's `max_step`)."""
    steps_per_s: float | None = None
    tokens_per_s: float | None = None
    flops_per_s: float | None = None
    mfu: float | None = None
    """A fraction (0.41 is 41%)."""
    loss: float | None = None
    grad_norm: float | None = None
    slowest_node: str | None = None
    slowest_step_s: float | None = None
    """The slowest node's compute seconds per step (its slowest rank's), as the straggler watch last measured."""
    reference_step_s: float | None = None
    """The job's compute seconds per step then (the lower median over its ranks)."""

    def to_json(self) -> dict[str, Any]:
        """The point as stored: every figure that is None left out."""
        data: dict[str, Any] = {**header(KIND, VERSION), "at": self.at, "job_id": self.job_id, "launch": self.launch,
                                "step": self.step}
        for key in FIGURES:
            if (value := getattr(self, key)) is not None:
                data[key] = value
        for key in MEASURED:
            if (value := getattr(self, key)) is not None:
                data[key] = measured_to_json(value)
        if self.slowest_node is not None:
            data["slowest_node"] = self.slowest_node
        return data

    @classmethod
    def from_json(cls, data: object, where: str) -> TrainingPoint:
        """Parse one stored point; RecordError for anything not understood (a newer version, an unknown field).

        Written for speed (a series of weeks is a quarter of a million points): the checks inline, no
        helper per field."""
        body: Mapping[str, Any] = data if type(data) is dict and data.get("kind") == KIND and \
            data.get("version") == VERSION else check_header(data, KIND, VERSION, where)
        if not body.keys() <= KNOWN:
            refuse_unknown(body, KNOWN, where)
        job_id: Any = body.get("job_id")
        launch: Any = body.get("launch")
        at: Any = body.get("at")
        step: Any = body.get("step")
        if type(job_id) is not str or not is_job_id(job_id):
            raise RecordError(where, f"field `job_id`: {job_id_problem(job_id)}" if "job_id" in body
                              else "missing field `job_id`")
        if type(launch) is not str or not LAUNCH.fullmatch(launch):
            raise _wrong(body, "launch", "a step's name such as `restart-1`", where)
        if type(at) not in _NUMBER or not 0 <= at <= _HUGE:
            raise _wrong(body, "at", "a time in epoch seconds", where)
        if type(step) is not int or not 0 <= step <= MAX_WHOLE:
            raise _wrong(body, "step", f"a whole number from 0 to {MAX_WHOLE}", where)
        figures: dict[str, float | None] = {}
        for key in FIGURES:
            value = body.get(key)
            if value is None or (type(value) in _NUMBER and 0 <= value <= _HUGE):
                figures[key] = None if value is None else float(value)
            else:
                raise _wrong(body, key, "a finite number, not negative", where)
        for key in MEASURED:
            value = body.get(key)
            if value is None or type(value) is float:
                figures[key] = value
            elif type(value) is int and -_HUGE <= value <= _HUGE or type(value) is str and value in NON_FINITE:
                figures[key] = measured_field(body, key, where)
            else:
                raise _wrong(body, key, 'a number, "nan", "inf" or "-inf"', where)
        node = body.get("slowest_node")
        if node is not None and (type(node) is not str or not is_node_name(node)):
            raise RecordError(where, f"field `slowest_node`: {node_name_problem(node)}")
        return cls(at=float(at), job_id=job_id, launch=launch, step=step, slowest_node=node, **figures)


def _wrong(body: Mapping[str, Any], key: str, wanted: str, where: str) -> RecordError:
    if key not in body:
        return RecordError(where, f"missing field `{key}`")
    return RecordError(where, f"field `{key}` is {one_line(repr(body[key])[:48])}: {wanted}")


_HUGE = 1e300
"""Beyond any figure a job has, and within a float (a JSON integer may be larger than any float)."""
_NUMBER = frozenset({int, float})
"""The types of a JSON number (`type(x) in _NUMBER` leaves bool out)."""


def point_of(summary: AgentSummary, slowest: tuple[str, float] | None = None,
             reference_step_s: float | None = None) -> TrainingPoint | None:
    """The point the agent appends for `summary` (None when the summary has no training figures or no
    step yet); `slowest`: the slowest node and its compute seconds per step, `reference_step_s` the job's."""
    training = summary.training
    if training is None or summary.max_step is None:
        return None
    return TrainingPoint(at=summary.at, job_id=summary.job_id, launch=summary.launch, step=summary.max_step,
                         steps_per_s=training.steps_per_s, tokens_per_s=training.tokens_per_s,
                         flops_per_s=training.flops_per_s, mfu=training.mfu, loss=training.loss,
                         grad_norm=training.grad_norm, slowest_node=slowest[0] if slowest else None,
                         slowest_step_s=slowest[1] if slowest else None, reference_step_s=reference_step_s)


def series_path(job_dir: Path) -> Path:
    """Where the agent of the job in `job_dir` appends its training series."""
    return job_dir / SERIES_NAME


def append_training_point(job_dir: Path, point: TrainingPoint) -> None:
    """Append one point to the job's series (one write, O_APPEND; a torn last line is cut off first).
    OSError when it cannot be written."""
    append_json_line(series_path(job_dir), point.to_json(), torn_tail="cut")


class TrainingSeriesReader:
    """One pass over a job's series, streamed (never the whole file in memory): iterate it for its
    points, oldest first.  Once iterated, `lines` says how many lines were read and
    `last_line_problem` why the last one was left out ("" when it was not): incomplete (a crash
    mid-append, or a line being written) or damaged.  A missing file has no points.

    RecordError, naming the file and the line: a damaged line that is not the last (it is not a
    crash mid-append), a point of a version this clusterctl does not know (wherever it is), a path
    that is not a regular file (a symlink, a FIFO: never followed or waited on) or a file larger
    than SERIES_LIMIT bytes."""

    def __init__(self, job_dir: Path) -> None:
        self.path = series_path(job_dir)
        self.lines = 0
        self.last_line_problem = ""

    def __iter__(self) -> Iterator[TrainingPoint]:
        damaged: tuple[int, str] | None = None
        name = str(self.path)
        try:
            for number, raw in enumerate(read_lines(self.path, limit=SERIES_LIMIT, follow_symlinks=False), start=1):
                if damaged is not None:
                    line, why = damaged
                    raise RecordError(f"{name}, line {line}", f"{why}; lines follow it, so it is not a crash "
                                      "mid-append: the series is damaged (move the file away to draw the run "
                                      "without it)")
                self.lines = number
                point, why = _parse(raw, f"{name}, line {number}")
                if point is None:
                    damaged = (number, why)
                    continue
                yield point
        except FileNotFoundError:
            return
        except UnreadableFileError as exc:
            raise RecordError(str(self.path), exc.reason) from None
        if damaged is not None:
            self.last_line_problem = damaged[1]


_decode = json.JSONDecoder().decode  # json.loads less its per-call checks: a series has many lines


def _parse(raw: bytes, where: str) -> tuple[TrainingPoint | None, str]:
    """A line's point, or None and why it is damaged; RecordError for a point of another version."""
    if not raw.endswith(b"\n"):
        return None, "incomplete (no end of line: a crash mid-append, or the line being written)"
    try:
        data = _decode(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"not a JSON line ({exc.__class__.__name__})"
    version = data.get("version") if isinstance(data, dict) and data.get("kind") == KIND else VERSION
    if version != VERSION and isinstance(version, int) and not isinstance(version, bool):
        check_header(data, KIND, VERSION, where)  # raises: the point of a newer (or unknown) version
    try:
        return TrainingPoint.from_json(data, where), ""
    except RecordError as exc:
        return None, str(exc).removeprefix(f"{where}: ")


ENDS_BYTES = 64 << 10
"""How far from the file's end `read_series_ends` looks for the newest whole point."""


def read_series_ends(job_dir: Path) -> tuple[TrainingPoint, TrainingPoint] | None:
    """The first and the newest whole point of the job's series, read from the file's two ends only
    (cheap whatever its length; the lines between are not read): None when it has no whole point.
    RecordError as `TrainingSeriesReader` says, for the lines read."""
    path = series_path(job_dir)
    try:
        with contextlib.closing(read_lines(path, limit=SERIES_LIMIT, follow_symlinks=False)) as lines:
            head = next(lines, b"")
        start, tail = read_tail(path, ENDS_BYTES, limit=SERIES_LIMIT, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except UnreadableFileError as exc:
        raise RecordError(str(path), exc.reason) from None
    first, _ = _parse(head, f"{path}, line 1")
    if first is None:
        return None  # its only line, being written (damaged, the full reader says so)
    pieces = tail.splitlines(keepends=True)
    for raw in reversed(pieces if start == 0 else pieces[1:]):  # past 0, the first piece is a line's end
        last, _ = _parse(raw, f"{path}, its last lines")
        if last is not None:
            return first, last
    return first, first
