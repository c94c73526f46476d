"""Where a hung step's ranks were stuck: `<job_dir>/stacks/<node>.json`, one per node asked.

Before the in-allocation agent ends a hung step it runs `python -m clusterctl.launcher.job stacks` on
the stuck nodes (and a few healthy ones, for comparison) as a one-off step of the job; on each node
that command finds the step's ranks in their progress files, asks `py-spy dump` for each rank's Python
stack (bounded in time) and writes this record: per rank its pid, whether a stack was read (and if not,
why: py-spy missing, the process gone, permission refused, no answer in time) and the frames of the
thread that runs the training loop, innermost first.  Also the names of PyTorch's flight-recorder
dumps found on the node and kept beside the record (`flight_recorder`), or why there were none.

Read by the agent, which summarises the records into the journal's `recovered-in-allocation` event
(clusterctl.launcher.pure.hang_stacks); kept with the run for people to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import (
    RecordError, check_header, choice_field, field, header, indented_json, node_field, read_json_record,
    refuse_unknown, seconds_field, whole_field,
)

KIND = "node-stacks"
VERSION = 1

STACK_STATUSES = ("dumped", "gone", "no-py-spy", "refused", "timed-out", "failed", "not-tried")
"""What became of one rank's dump: a stack read; the process had ended; py-spy is not installed on the
node; the kernel refused (ptrace permission); py-spy did not answer within the bound; py-spy failed
otherwise; not tried (the node's time bound was spent, or the rank has no pid)."""
MAX_FRAMES = 64
"""Frames kept per stack, innermost first (a deeper stack is cut: the innermost frames say where it waits)."""
MAX_TEXT = 300
"""Characters kept of a function or file name, and of a note."""


def _short(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"


@dataclass(frozen=True)
class Frame:
    """One frame of a stack: the function, its file (as the process named it) and the line."""

    function: str
    file: str
    line: int

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line}

    @classmethod
    def from_json(cls, data: object, where: str) -> Frame:
        if not isinstance(data, Mapping):
            raise RecordError(where, "a frame must be a JSON object")
        refuse_unknown(data, frozenset({"function", "file", "line"}), where)
        return cls(_short(field(data, "function", str, where)), _short(field(data, "file", str, where)),
                   whole_field(data, "line", where))


@dataclass(frozen=True)
class RankStack:
    """One rank's dump: its pid, `status` (one of STACK_STATUSES), the frames of its training thread
    (innermost first; empty unless dumped), how many threads the process had, and a note (why not)."""

    rank: int
    pid: int
    status: str
    frames: tuple[Frame, ...] = ()
    threads: int = 0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": self.pid, "status": self.status,
                "frames": [f.to_json() for f in self.frames], "threads": self.threads, "note": self.note}

    @classmethod
    def from_json(cls, data: object, where: str) -> RankStack:
        if not isinstance(data, Mapping):
            raise RecordError(where, "a rank's stack must be a JSON object")
        refuse_unknown(data, frozenset({"rank", "pid", "status", "frames", "threads", "note"}), where)
        frames = field(data, "frames", list, where)
        if len(frames) > MAX_FRAMES:
            raise RecordError(where, f"more than {MAX_FRAMES} frames in one stack")
        return cls(rank=whole_field(data, "rank", where), pid=whole_field(data, "pid", where),
                   status=choice_field(data, "status", STACK_STATUSES, where),
                   frames=tuple(Frame.from_json(f, where) for f in frames),
                   threads=whole_field(data, "threads", where), note=_short(field(data, "note", str, where)))


@dataclass(frozen=True)
class NodeStacks:
    """What one node said of its ranks of launch `launch` of job `job_id`, at `at` (epoch s).
    `flight_recorder`: the file names of PyTorch flight-recorder dumps kept beside this record
    (`flight-recorder/<node>/`); `notes`: what could not be done on the node as a whole."""

    node: str
    job_id: str
    launch: str
    at: float
    ranks: tuple[RankStack, ...]
    flight_recorder: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**header(KIND, VERSION), "node": self.node, "job_id": self.job_id, "launch": self.launch,
                "at": self.at, "ranks": [r.to_json() for r in self.ranks],
                "flight_recorder": list(self.flight_recorder), "notes": list(self.notes)}

    @classmethod
    def from_json(cls, data: object, where: str) -> NodeStacks:
        body = check_header(data, KIND, VERSION, where)
        refuse_unknown(body, frozenset({"kind", "version", "node", "job_id", "launch", "at", "ranks",
                                        "flight_recorder", "notes"}), where)
        texts = {key: field(body, key, list, where) for key in ("flight_recorder", "notes")}
        if not all(isinstance(t, str) for values in texts.values() for t in values):
            raise RecordError(where, "fields `flight_recorder` and `notes` must be lists of text")
        return cls(node=node_field(body, "node", where), job_id=field(body, "job_id", str, where),
                   launch=field(body, "launch", str, where), at=seconds_field(body, "at", where),
                   ranks=tuple(RankStack.from_json(r, where) for r in field(body, "ranks", list, where)),
                   flight_recorder=tuple(texts["flight_recorder"]), notes=tuple(_short(n) for n in texts["notes"]))


def stacks_dir(job_dir: Path) -> Path:
    """Where a step's stack records are kept: `<job_dir>/stacks`."""
    return job_dir / "stacks"


def write_node_stacks(job_dir: Path, record: NodeStacks) -> Path:
    """Write `record` as `<job_dir>/stacks/<node>.json` (whole, atomically); its path."""
    return atomic_write(stacks_dir(job_dir) / f"{record.node}.json", indented_json(record.to_json()) + "\n")


def read_node_stacks(path: Path) -> NodeStacks:
    """One node's stack record; RecordError for a file that is not one (FileNotFoundError when missing)."""
    return NodeStacks.from_json(read_json_record(path, limit=16 << 20), str(path))
