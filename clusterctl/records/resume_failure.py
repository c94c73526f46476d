"""A node that could not load its part of the resume checkpoint: `<launch dir>/resume-failed/<node>.json`.

Written by the training program's `clusterctl.checkpoint` on a node where no copy of its slot's part
verified (its own, its buddy's, shared storage's), just before the rank exits with EXIT_RESUME_FAILED;
read by the job's agent when the step ends, which counts a failed resume of that checkpoint and plans
again without the bad copies (launcher/pure/checkpoint_tiers.plan_resume falls back to the last
flushed checkpoint after two).  Rare by design: one small file per failed node per resume.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.checkpoint_manifest import TIERS
from clusterctl.records.versioned import (
    RecordError, check_header, choice_field, field, header, node_field, read_json_record, refuse_unknown, text_field,
    whole_field,
)
from clusterctl.slurm.names import node_name_problem
from clusterctl.text import one_line

KIND = "resume-failure"
VERSION = 1
EXIT_RESUME_FAILED = 87
"""The exit code of a rank that could not load any copy of its part of the resume checkpoint."""
FOLDER = "resume-failed"
MAX_BAD = 16
MAX_TEXT = 512
RECORD_LIMIT = 64 << 10
MAX_FILES = 1000
"""The most failure files read from one step (one per node that failed; more is said as a count)."""
_FIELDS = frozenset({"kind", "version", "node", "step", "why", "bad_copies"})
_BAD_FIELDS = frozenset({"step", "of_node", "tier", "held_on", "problem"})


@dataclass(frozen=True)
class BadCopy:
    """A copy a node tried and could not use, and why (`fails its checksum (shard rank-1.json)`)."""

    step: int
    of_node: str
    tier: str
    held_on: str | None
    problem: str

    @property
    def key(self) -> tuple[int, str, str, str | None]:
        """What names the copy (checkpoint_tiers.copy_key)."""
        return (self.step, self.of_node, self.tier, self.held_on)

    def to_json(self) -> dict[str, Any]:
        """The copy's entry."""
        return {"step": self.step, "of_node": self.of_node, "tier": self.tier, "held_on": self.held_on,
                "problem": self.problem}


@dataclass(frozen=True)
class ResumeFailure:
    """`node` could not load step `step`: why, and every copy it tried."""

    node: str
    step: int
    why: str
    bad_copies: tuple[BadCopy, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "node": self.node, "step": self.step, "why": self.why,
                "bad_copies": [b.to_json() for b in self.bad_copies]}

    @classmethod
    def from_json(cls, data: object, where: str) -> ResumeFailure:
        """Parse the record; RecordError naming `where` and the key for anything not exactly understood."""
        body = check_header(data, KIND, VERSION, where)
        refuse_unknown(body, _FIELDS, where)
        entries = field(body, "bad_copies", list, where)
        if len(entries) > MAX_BAD:
            raise RecordError(where, f"field `bad_copies` lists {len(entries)}: at most {MAX_BAD}")
        return cls(node=node_field(body, "node", where), step=whole_field(body, "step", where),
                   why=text_field(body, "why", where, limit=MAX_TEXT),
                   bad_copies=tuple(_bad(e, f"{where}: bad_copies[{i}]") for i, e in enumerate(entries)))


def _bad(data: object, where: str) -> BadCopy:
    if not isinstance(data, dict):
        raise RecordError(where, "must be an object")
    refuse_unknown(data, _BAD_FIELDS, where)
    held_on = field(data, "held_on", (str, type(None)), where)
    if held_on is not None and (problem := node_name_problem(held_on)):
        raise RecordError(where, f"field `held_on`: {problem}")
    return BadCopy(step=whole_field(data, "step", where), of_node=node_field(data, "of_node", where),
                   tier=choice_field(data, "tier", TIERS, where), held_on=held_on,
                   problem=text_field(data, "problem", where, limit=MAX_TEXT))


def write_resume_failure(launch_dir: Path, failure: ResumeFailure) -> Path:
    """Write the node's failure record atomically; its path.  Texts are cut to MAX_TEXT on one line."""
    if (problem := node_name_problem(failure.node)):
        raise ValueError(problem)
    record = ResumeFailure(failure.node, failure.step, one_line(failure.why)[:MAX_TEXT],
                           tuple(BadCopy(b.step, b.of_node, b.tier, b.held_on, one_line(b.problem)[:MAX_TEXT])
                                 for b in failure.bad_copies[:MAX_BAD]))
    return atomic_write(launch_dir / FOLDER / f"{failure.node}.json", json.dumps(record.to_json(), sort_keys=True)
                        + "\n", mode=0o600)


def read_resume_failures(launch_dir: Path) -> list[ResumeFailure]:
    """Every node's failure record of the step in `launch_dir` (none: []), by node name; RecordError for
    the first one damaged, foreign or from a newer clusterctl."""
    folder = launch_dir / FOLDER
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        return []
    failures = []
    for name in names[:MAX_FILES]:
        path = folder / name
        failures.append(ResumeFailure.from_json(read_json_record(path, limit=RECORD_LIMIT, follow_symlinks=False),
                                                str(path)))
    return failures
