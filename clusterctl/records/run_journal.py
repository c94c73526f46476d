"""The run journal: `<run>/journal.jsonl`, one typed event a line, append-only.

Written by `clusterctl submit`, `cancel` and the supervisor; read by the supervisor's replay,
`status`, `report`, and by anyone with jq.  Every line is a JSON object

    {"kind": "run-event", "version": 2, "event": "submitted", "at": 1732287845.123, ...fields}

and each `event` has one frozen dataclass here with exactly its fields.  A reader refuses an
event it does not know, or a newer version, with a RecordError naming the file and line: a
decision replayed from a half-understood journal could submit a job twice.

Journals written before events carried a kind and version (clusterctl 0.x, no `kind` key)
hold the same fields and are read as version 1: old run directories stay readable.

A damaged line (a torn last line after a crash mid-append, or a line damaged in the middle) is
skipped and reported by `read_run_journal`, with what losing it may cost: the views and the
supervisor show it as a warning.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from clusterctl.files import UnreadableFileError, append_json_line, read_json_lines
from clusterctl.records.versioned import (
    RecordError, check_header, field, header, node_field, nodes_field, number_field, number_or_none_field,
    strings_field,
)
from clusterctl.slurm.names import job_id_problem

KIND = "run-event"
VERSION = 2
READ_VERSIONS = (1, 2)
"""Version 2 added `data_parallel_before`/`data_parallel_after` to `recovered-in-allocation` (a shrink); a
version 1 line holds none and means the job ran at the spec's size."""


class EventKind(enum.StrEnum):
    """Every event a run journal holds, by the name stored in its `event` field."""

    CREATED = "created"
    WAITING = "waiting"
    SUBMITTING = "submitting"
    SUBMITTED = "submitted"
    SUBMIT_LOST = "submit-lost"
    ENDING = "ending"
    RECOVERED = "recovered-in-allocation"
    RESUMED = "resumed"
    AGENT_ENDED = "agent-ended"
    STRAGGLER = "straggler"
    DECIDED = "decided"
    DONE = "done"
    STOPPED = "stopped"
    CANCELLED = "cancelled"


END_KINDS = frozenset({EventKind.DONE, EventKind.STOPPED, EventKind.CANCELLED})
"""Events that end a run: after one, nothing is submitted again."""


class OutcomeKind(enum.StrEnum):
    """How an attempt ended, in the supervisor's terms (the `outcome` of a `decided` event)."""

    COMPLETED = "completed"
    USER_CANCELLED = "user-cancelled"
    RESUBMIT = "resubmit"
    NODE_FAILURE = "node-failure"
    PROGRAM_FAILURE = "program-failure"
    STORAGE_FULL = "storage-full"
    MISPLACED = "misplaced"
    PROGRAM_ASKED_STOP = "program-asked-stop"


class DecisionAction(enum.StrEnum):
    """What the supervisor decided after an attempt (the `action` of a `decided` event)."""

    DONE = "done"
    STOP = "stop"
    RESUBMIT = "resubmit"


# ---- reading helpers ------------------------------------------------------------------
_OPTIONAL_STR = (str, type(None))
_OPTIONAL_INT = (int, type(None))


def _job_id(data: Mapping[str, Any], key: str, where: str) -> str:
    # A job id read back from the journal goes to scancel/sacct: it must be one, not an option.
    value = str(field(data, key, (str, int), where))
    problem = job_id_problem(value)
    if problem:
        raise RecordError(where, f"field `{key}`: {problem}")
    return value


def _choice(enum_type: type[enum.StrEnum], data: Mapping[str, Any], key: str, where: str) -> Any:
    value = field(data, key, str, where)
    try:
        return enum_type(value)
    except ValueError:
        known = ", ".join(member.value for member in enum_type)
        raise RecordError(where, f"field `{key}` is {value!r}, which this clusterctl does not know "
                                 f"(known: {known}); upgrade clusterctl on this host") from None


# ---- the events -----------------------------------------------------------------------
@dataclass(frozen=True)
class BlamedNode:
    """A node held responsible for an attempt's end, with the evidence; `until` when its blame expires."""

    node: str
    reason: str
    evidence: tuple[str, ...] = ()
    until: float | None = None

    def to_json(self) -> dict[str, Any]:
        """As stored (and as the webhook's `blame` payload carries it)."""
        data: dict[str, Any] = {"node": self.node, "reason": self.reason, "evidence": list(self.evidence)}
        if self.until is not None:
            data["until"] = self.until
        return data

    @classmethod
    def from_json(cls, data: object, where: str) -> BlamedNode:
        """Parse one blamed node; RecordError naming the field that is wrong."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "a blamed node is not a JSON object")
        return cls(node=node_field(data, "node", where), reason=field(data, "reason", str, where),
                   evidence=strings_field(data, "evidence", where, default=()),
                   until=number_or_none_field(data, "until", where, default=None))


@dataclass(frozen=True)
class SlurmTimes:
    """Slurm's submit/start/end times of an attempt (epoch seconds; None when Slurm had none)."""

    submit: float | None = None
    start: float | None = None
    end: float | None = None

    def to_json(self) -> dict[str, Any]:
        """As stored."""
        return {"submit": self.submit, "start": self.start, "end": self.end}

    @classmethod
    def from_json(cls, data: object, where: str) -> SlurmTimes:
        """Parse the times; an empty object (a lost job) has none."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "field `times` is not a JSON object")
        return cls(*(number_or_none_field(data, key, where, default=None) for key in ("submit", "start", "end")))


@dataclass(frozen=True, kw_only=True)
class Created:
    """The run directory was made."""

    event: ClassVar[EventKind] = EventKind.CREATED
    at: float
    name: str
    source: str | None = None

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"name": self.name, "source": self.source}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> Created:
        """Read the event\'s own fields (the header, `event` and `at` are already read)."""
        return cls(at=at, name=field(data, "name", str, where),
                   source=field(data, "source", _OPTIONAL_STR, where, default=None))


@dataclass(frozen=True, kw_only=True)
class Waiting:
    """Too few usable nodes to submit: the supervisor waits (logged once per distinct message)."""

    event: ClassVar[EventKind] = EventKind.WAITING
    at: float
    message: str

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"message": self.message}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> Waiting:
        """Read the event\'s own fields (the header, `event` and `at` are already read)."""
        return cls(at=at, message=field(data, "message", str, where))


@dataclass(frozen=True, kw_only=True)
class Submitting:
    """About to sbatch an attempt tagged `comment`; without a later `submitted` it is reconciled with Slurm."""

    event: ClassVar[EventKind] = EventKind.SUBMITTING
    at: float
    attempt: int
    comment: str

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"attempt": self.attempt, "comment": self.comment}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> Submitting:
        """Read the event\'s own fields (the header, `event` and `at` are already read)."""
        return cls(at=at, attempt=field(data, "attempt", int, where), comment=field(data, "comment", str, where))


@dataclass(frozen=True, kw_only=True)
class Submitted:
    """Slurm accepted an attempt as `job_id` (`reconciled`: found in Slurm after a supervisor restart)."""

    event: ClassVar[EventKind] = EventKind.SUBMITTED
    at: float
    attempt: int
    job_id: str
    argv: tuple[str, ...] = ()
    resume_from: str | None = None
    exclude: str | None = None
    reconciled: bool = False

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        data = {"attempt": self.attempt, "job_id": self.job_id, "argv": list(self.argv),
                "resume_from": self.resume_from, "exclude": self.exclude}
        return {**data, "reconciled": True} if self.reconciled else data

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> Submitted:
        """Read the event\'s own fields (the header, `event` and `at` are already read)."""
        return cls(at=at, attempt=field(data, "attempt", int, where), job_id=_job_id(data, "job_id", where),
                   argv=strings_field(data, "argv", where, default=()),
                   resume_from=field(data, "resume_from", _OPTIONAL_STR, where, default=None),
                   exclude=field(data, "exclude", _OPTIONAL_STR, where, default=None),
                   reconciled=field(data, "reconciled", bool, where, default=False))


@dataclass(frozen=True, kw_only=True)
class SubmitLost:
    """A `submitting` whose sbatch never reached Slurm: forgotten, so the attempt is made again."""

    event: ClassVar[EventKind] = EventKind.SUBMIT_LOST
    at: float
    attempt: int
    comment: str = ""

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"attempt": self.attempt, "comment": self.comment}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> SubmitLost:
        """Read the event\'s own fields (the header, `event` and `at` are already read)."""
        return cls(at=at, attempt=field(data, "attempt", int, where),
                   comment=field(data, "comment", str, where, default=""))


@dataclass(frozen=True, kw_only=True)
class Ending:
    """The supervisor is cancelling a running attempt because of `blame` (before Slurm notices)."""

    event: ClassVar[EventKind] = EventKind.ENDING
    at: float
    attempt: int
    job_id: str
    blame: tuple[BlamedNode, ...]

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"attempt": self.attempt, "job_id": self.job_id, "blame": [b.to_json() for b in self.blame]}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> Ending:
        """Read the event\'s own fields (the header, `event` and `at` are already read)."""
        return cls(at=at, attempt=field(data, "attempt", int, where), job_id=_job_id(data, "job_id", where),
                   blame=tuple(BlamedNode.from_json(b, where) for b in field(data, "blame", list, where)))


@dataclass(frozen=True, kw_only=True)
class RecoveredInAllocation:
    """Inside job `job_id`, the in-allocation agent ended the step that `blame` broke, gave those nodes
    back to Slurm (`given_back`) and started step `restart` on `nodes` (the new map's node slots,
    spares taken in) from checkpoint `checkpoint_step` in folder `checkpoint` (None: a fresh start, or a
    multi-level checkpoint read at least in part from the nodes' tiers, never a folder it is not in;
    the `resumed` event says where its parts came from); `phases` says how long each part took (seconds)."""

    event: ClassVar[EventKind] = EventKind.RECOVERED
    at: float
    job_id: str
    restart: int
    blame: tuple[BlamedNode, ...]
    nodes: tuple[str, ...]
    given_back: tuple[str, ...] = ()
    checkpoint_step: int | None = None
    checkpoint: str | None = None
    phases: tuple[tuple[str, float], ...] = ()
    reason: str = ""
    """Why, when no node is blamed (every rank hung at once: the step started again on the same nodes)."""
    agent: str = ""
    """The node of the agent that acted ('' in journals written before agents had standbys)."""
    took_over_from: str = ""
    """When this restart followed a takeover: the node of the agent it took over from (its batch host)."""
    stacks: tuple[str, ...] = ()
    """When the step hung: where its ranks' Python stacks were, in a few lines (which call the ranks wait
    in, which never arrived; clusterctl.launcher.pure.hang_stacks), read before the step was ended; the
    records are in the hung step's `stacks/` folder.  Absent from journals written before it was kept."""
    data_parallel_before: int | None = None
    """The data-parallel size of the step that ended; None: the spec's (journals before version 2 hold none)."""
    data_parallel_after: int | None = None
    """The next step's data-parallel size, below `data_parallel_before` when the job shrank; None: the spec's."""

    @property
    def shrank(self) -> bool:
        """The job went on with fewer data-parallel replicas than before."""
        return (self.data_parallel_before is not None and self.data_parallel_after is not None
                and self.data_parallel_after < self.data_parallel_before)

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"job_id": self.job_id, "restart": self.restart, "blame": [b.to_json() for b in self.blame],
                "nodes": list(self.nodes), "given_back": list(self.given_back),
                "checkpoint_step": self.checkpoint_step, "checkpoint": self.checkpoint,
                "phases": {name: seconds for name, seconds in self.phases}, "reason": self.reason,
                "agent": self.agent, "took_over_from": self.took_over_from,
                **({"stacks": list(self.stacks)} if self.stacks else {}),
                **{name: value for name, value in (("data_parallel_before", self.data_parallel_before),
                                                   ("data_parallel_after", self.data_parallel_after))
                   if value is not None}}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> RecoveredInAllocation:
        """Read the event's own fields (the header, `event` and `at` are already read)."""
        phases = field(data, "phases", Mapping, where, default={})
        if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                   for k, v in phases.items()):
            raise RecordError(where, "field `phases` must map names to seconds")
        return cls(at=at, job_id=_job_id(data, "job_id", where), restart=field(data, "restart", int, where),
                   blame=tuple(BlamedNode.from_json(b, where) for b in field(data, "blame", list, where)),
                   nodes=nodes_field(data, "nodes", where),
                   given_back=nodes_field(data, "given_back", where, default=()),
                   checkpoint_step=field(data, "checkpoint_step", _OPTIONAL_INT, where, default=None),
                   checkpoint=field(data, "checkpoint", _OPTIONAL_STR, where, default=None),
                   phases=tuple((k, float(v)) for k, v in phases.items()),
                   reason=field(data, "reason", str, where, default=""),
                   agent=node_field(data, "agent", where) if data.get("agent") else "",
                   took_over_from=node_field(data, "took_over_from", where) if data.get("took_over_from") else "",
                   stacks=strings_field(data, "stacks", where, default=()),
                   data_parallel_before=_replicas(data, "data_parallel_before", where),
                   data_parallel_after=_replicas(data, "data_parallel_after", where))


def _replicas(data: Mapping[str, Any], key: str, where: str) -> int | None:
    """A data-parallel size (a whole number of at least 1), None when absent."""
    value: int | None = field(data, key, _OPTIONAL_INT, where, default=None)
    if value is not None and value < 1:
        raise RecordError(where, f"field `{key}` must be a data-parallel size of at least 1, found {value}")
    return value


RESUME_TIERS = ("local", "buddy", "shared")
"""Where a node's part of a multi-level checkpoint came from: its own copy, a copy on another node, shared storage."""
NAMED_BUDDY_COPIES = 5
"""A `resumed` event names this many copies read from other nodes, then counts the rest."""


@dataclass(frozen=True, kw_only=True)
class Resumed:
    """Inside job `job_id`, the step started as restart `restart` (0: the job's first step) resumed from
    multi-level checkpoint `step`: `tiers` counts the nodes whose part came from each tier (`local`,
    `buddy`, `shared`: as the nodes said, else as planned), `buddy_copies` names the first
    NAMED_BUDDY_COPIES copies read from another node ("node2's on node1") and `more_buddy_copies` counts the
    rest; `reported` of `nodes` nodes said how long staging their part took, `read_seconds` the slowest
    (on `slowest_node`; None when no node said before the step ended).  One line per resumed step."""

    event: ClassVar[EventKind] = EventKind.RESUMED
    at: float
    job_id: str
    restart: int
    step: int
    nodes: int
    tiers: tuple[tuple[str, int], ...]
    buddy_copies: tuple[str, ...] = ()
    more_buddy_copies: int = 0
    reported: int = 0
    read_seconds: float | None = None
    slowest_node: str = ""

    def count(self, tier: str) -> int:
        """Nodes whose part came from `tier`."""
        return dict(self.tiers).get(tier, 0)

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"job_id": self.job_id, "restart": self.restart, "step": self.step, "nodes": self.nodes,
                "tiers": dict(self.tiers), "buddy_copies": list(self.buddy_copies),
                "more_buddy_copies": self.more_buddy_copies, "reported": self.reported,
                "read_seconds": self.read_seconds, "slowest_node": self.slowest_node}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> Resumed:
        """Read the event's own fields (the header, `event` and `at` are already read)."""
        tiers = field(data, "tiers", Mapping, where)
        if not all(k in RESUME_TIERS and type(v) is int and v >= 0 for k, v in tiers.items()):
            raise RecordError(where, f"field `tiers` must map {', '.join(RESUME_TIERS)} to node counts")
        return cls(at=at, job_id=_job_id(data, "job_id", where), restart=field(data, "restart", int, where),
                   step=field(data, "step", int, where), nodes=field(data, "nodes", int, where),
                   tiers=tuple((t, tiers[t]) for t in RESUME_TIERS if t in tiers),
                   buddy_copies=strings_field(data, "buddy_copies", where),
                   more_buddy_copies=field(data, "more_buddy_copies", int, where),
                   reported=field(data, "reported", int, where),
                   read_seconds=number_or_none_field(data, "read_seconds", where),
                   slowest_node=node_field(data, "slowest_node", where) if data.get("slowest_node") else "")


@dataclass(frozen=True, kw_only=True)
class AgentEnded:
    """An agent that took job `job_id` over from its batch host ended the job itself (the batch script
    that would have ended it died with that node): how its last step ended, in the supervisor's terms,
    with the nodes it blamed.  The supervisor reads this instead of the job's CANCELLED state."""

    event: ClassVar[EventKind] = EventKind.AGENT_ENDED
    at: float
    job_id: str
    agent: str
    epoch: int
    exit_code: int
    outcome: OutcomeKind
    message: str
    blame: tuple[BlamedNode, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"job_id": self.job_id, "agent": self.agent, "epoch": self.epoch, "exit_code": self.exit_code,
                "outcome": self.outcome.value, "message": self.message, "blame": [b.to_json() for b in self.blame]}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> AgentEnded:
        """Read the event\'s own fields (the header, `event` and `at` are already read)."""
        return cls(at=at, job_id=_job_id(data, "job_id", where), agent=node_field(data, "agent", where),
                   epoch=field(data, "epoch", int, where), exit_code=field(data, "exit_code", int, where),
                   outcome=_choice(OutcomeKind, data, "outcome", where), message=field(data, "message", str, where),
                   blame=tuple(BlamedNode.from_json(b, where) for b in field(data, "blame", list, where)))


STRAGGLER_ACTIONS = ("reported", "excluded", "swapped")
"""What the agent did about a straggler: journaled only; avoided from the next resubmission on; swapped for a spare."""


@dataclass(frozen=True, kw_only=True)
class StragglerFound:
    """Inside job `job_id`, the ranks on `node` computed `ratio` times slower than the job's `reference`
    seconds per step for `steps` steps from `since_step` (clusterctl.launcher.pure.straggler_watch), costing
    `lost_s` seconds so far.  `hardware`: what the node's GPUs said (healthd evidence) that explains a
    slowdown, empty when nothing did; `action` what was done, `blame` the node blamed for it (avoided by
    later attempts) and `drain` what became of draining it (empty: not tried)."""

    event: ClassVar[EventKind] = EventKind.STRAGGLER
    at: float
    job_id: str
    node: str
    ranks: tuple[int, ...]
    ratio: float
    seconds: float
    reference: float
    steps: int
    since_step: int
    lost_s: float
    evidence: tuple[str, ...]
    hardware: tuple[str, ...] = ()
    action: str = "reported"
    blame: tuple[BlamedNode, ...] = ()
    drain: str = ""

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"job_id": self.job_id, "node": self.node, "ranks": list(self.ranks), "ratio": self.ratio,
                "seconds": self.seconds, "reference": self.reference, "steps": self.steps,
                "since_step": self.since_step, "lost_s": self.lost_s, "evidence": list(self.evidence),
                "hardware": list(self.hardware), "action": self.action, "blame": [b.to_json() for b in self.blame],
                "drain": self.drain}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> StragglerFound:
        """Read the event's own fields (the header, `event` and `at` are already read)."""
        ranks = field(data, "ranks", list, where)
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise RecordError(where, "field `ranks` must be a list of whole numbers")
        action = field(data, "action", str, where)
        if action not in STRAGGLER_ACTIONS:
            raise RecordError(where, f"field `action` is {action!r}, which this clusterctl does not know "
                                     f"(known: {', '.join(STRAGGLER_ACTIONS)}); upgrade clusterctl on this host")
        return cls(at=at, job_id=_job_id(data, "job_id", where), node=node_field(data, "node", where),
                   ranks=tuple(ranks),
                   ratio=number_field(data, "ratio", where), seconds=number_field(data, "seconds", where),
                   reference=number_field(data, "reference", where), steps=field(data, "steps", int, where),
                   since_step=field(data, "since_step", int, where), lost_s=number_field(data, "lost_s", where),
                   evidence=strings_field(data, "evidence", where), hardware=strings_field(data, "hardware", where),
                   action=action, blame=tuple(BlamedNode.from_json(b, where) for b in field(data, "blame", list, where)),
                   drain=field(data, "drain", str, where))


@dataclass(frozen=True, kw_only=True)
class Decided:
    """An attempt ended: what Slurm said, how the supervisor read it, and what it decided."""

    event: ClassVar[EventKind] = EventKind.DECIDED
    at: float
    attempt: int
    job_id: str | None
    state: str  # Slurm's final state, or LOST
    exit_code: int | None
    outcome: OutcomeKind
    message: str
    blame: tuple[BlamedNode, ...]
    checkpoint_step: int | None
    checkpoint: str | None
    action: DecisionAction
    delay: float = 0.0
    times: SlurmTimes | None = None  # None: the job was lost, Slurm had no times

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"attempt": self.attempt, "job_id": self.job_id, "state": self.state, "exit_code": self.exit_code,
                "outcome": self.outcome.value, "message": self.message, "blame": [b.to_json() for b in self.blame],
                "checkpoint_step": self.checkpoint_step, "checkpoint": self.checkpoint, "action": self.action.value,
                "delay": self.delay, "times": self.times.to_json() if self.times is not None else {}}

    @classmethod
    def parse(cls, at: float, data: Mapping[str, Any], where: str) -> Decided:
        """Read the event\'s own fields (the header, `event` and `at` are already read)."""
        job_id = field(data, "job_id", (str, int, type(None)), where)
        times = data.get("times") or None
        return cls(at=at, attempt=field(data, "attempt", int, where), job_id=None if job_id is None else str(job_id),
                   state=field(data, "state", str, where), exit_code=field(data, "exit_code", _OPTIONAL_INT, where),
                   outcome=_choice(OutcomeKind, data, "outcome", where), message=field(data, "message", str, where),
                   blame=tuple(BlamedNode.from_json(b, where) for b in field(data, "blame", list, where)),
                   checkpoint_step=field(data, "checkpoint_step", _OPTIONAL_INT, where),
                   checkpoint=field(data, "checkpoint", _OPTIONAL_STR, where, default=None),
                   action=_choice(DecisionAction, data, "action", where),
                   delay=number_field(data, "delay", where, default=0.0),
                   times=SlurmTimes.from_json(times, where) if times is not None else None)


@dataclass(frozen=True, kw_only=True)
class RunEnded:
    """The run is over: done (completed), stopped (with why) or cancelled by the user (`jobs` it cancelled)."""

    kind: EventKind  # one of END_KINDS
    at: float
    message: str = ""
    jobs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in END_KINDS:
            raise ValueError(f"{self.kind} does not end a run")

    @property
    def event(self) -> EventKind:
        """Which end: done, stopped or cancelled."""
        return self.kind

    def fields(self) -> dict[str, Any]:
        """The event's own fields, as stored after the header, `event` and `at`."""
        return {"message": self.message, "jobs": list(self.jobs)} if self.kind == EventKind.CANCELLED \
            else {"message": self.message}

    @classmethod
    def parse(cls, kind: EventKind, at: float, data: Mapping[str, Any], where: str) -> RunEnded:
        """Read the event\'s own fields (the header, `event` and `at` are already read)."""
        return cls(kind=kind, at=at, message=field(data, "message", str, where, default=""),
                   jobs=strings_field(data, "jobs", where, default=()))


RunEvent = (Created | Waiting | Submitting | Submitted | SubmitLost | Ending | RecoveredInAllocation
            | Resumed | AgentEnded | StragglerFound | Decided | RunEnded)
"""Any event of a run journal."""

_PARSERS = {cls.event: cls.parse for cls in (Created, Waiting, Submitting, Submitted, SubmitLost, Ending,
                                              RecoveredInAllocation, Resumed, AgentEnded, StragglerFound, Decided)}


def event_to_json(event: RunEvent) -> dict[str, Any]:
    """The JSON object of one journal line."""
    # Only a line that holds what version 2 added says 2: a journal of a run that never shrank stays readable
    # by a clusterctl of before (a login node's install may lag the job's).
    shrink = isinstance(event, RecoveredInAllocation) and (event.data_parallel_before, event.data_parallel_after) != (
        None, None)
    return {**header(KIND, VERSION if shrink else 1), "event": event.event.value, "at": event.at,
            **event.fields()}


def event_from_json(data: object, where: str) -> RunEvent:
    """Parse one journal line; RecordError for an unknown event, a newer version or a wrong field."""
    if isinstance(data, Mapping) and "kind" not in data and "version" not in data and "event" in data:
        body: Mapping[str, Any] = data  # written before journals were versioned: same fields as version 1
    else:
        sent = data.get("version") if isinstance(data, Mapping) and data.get("kind") == KIND else None
        version = sent if sent in READ_VERSIONS and type(sent) is int else VERSION
        body = check_header(data, KIND, version, where)
    kind = _choice(EventKind, body, "event", where)
    at = number_field(body, "at", where)
    if kind in END_KINDS:
        return RunEnded.parse(kind, at, body, where)
    return _PARSERS[kind](at, body, where)


_LOST_COST = {
    EventKind.CREATED: "only the run's name and spec file are unknown to the views",
    EventKind.WAITING: "a wait before a resubmission is not shown",
    EventKind.SUBMITTING: "a submission in flight is unknown: a job it made may be missed (look for the run's "
                          "jobs with squeue)",
    EventKind.SUBMITTED: "a job of this run is unknown: it is not watched, counted, or cancelled by `clusterctl "
                         "cancel` (look for the run's jobs with squeue)",
    EventKind.SUBMIT_LOST: "a submission that left no job is not counted",
    EventKind.ENDING: "an attempt the supervisor was ending may be judged again",
    EventKind.RECOVERED: "a restart inside the allocation is not counted: restarts used and blame may be short",
    EventKind.RESUMED: "where one resume's checkpoint came from and how long reading it took are not shown",
    EventKind.AGENT_ENDED: "how a job whose agent took over ended is unknown: it looks cancelled",
    EventKind.STRAGGLER: "a straggler found is not shown and may be reported again",
    EventKind.DECIDED: "an attempt's end is unknown: attempts and restarts may be counted wrong, and a node "
                       "blamed then may not be excluded",
    EventKind.DONE: "the run's end is lost: it may look live",
    EventKind.STOPPED: "the run's end is lost: it may look live",
    EventKind.CANCELLED: "the run's cancellation is lost: it may look live",
}
_EVENT_NAME = re.compile(rb'"event"\s*:\s*"([a-z-]{1,40})"')


@dataclass(frozen=True)
class DamagedLine:
    """A journal line that could not be read: where it is, what it seems to have held, what losing it may cost."""

    line: int
    """1-based line number."""
    excerpt: str
    """The line's first characters, quoted in ASCII (control characters and the rest escaped)."""
    event: EventKind | None
    """The event the damaged text still names, if any."""
    last: bool
    """The journal's last line: most likely cut short by a crash while it was written."""

    @property
    def cost(self) -> str:
        """What the views and the supervisor may get wrong without this line."""
        if self.event is None:
            return "an event of unknown kind is lost: attempts, restarts and blame may be counted wrong"
        return f"a `{self.event}` event is lost: {_LOST_COST[self.event]}"

    @property
    def warning(self) -> str:
        """One line for a user: where, what was skipped, what it may have cost."""
        how = "cut short (a crash while it was written?)" if self.last else "damaged"
        return f"journal line {self.line} is {how} and was skipped ({self.excerpt}); {self.cost}"


def _damaged_line(number: int, raw: bytes, last: bool) -> DamagedLine:
    found = _EVENT_NAME.search(raw)
    event = None
    if found is not None:
        try:
            event = EventKind(found.group(1).decode())
        except ValueError:
            event = None
    text = raw[:80].decode("utf-8", errors="replace")
    excerpt = ascii(text) + ("..." if len(raw) > 80 else "")
    return DamagedLine(number, excerpt, event, last)


@dataclass(frozen=True)
class RunJournal:
    """A run journal's events in order, and the lines that could not be read (a torn last line is normal)."""

    events: tuple[RunEvent, ...]
    unreadable_lines: tuple[int, ...] = ()
    damaged: tuple[DamagedLine, ...] = ()
    """What each unreadable line seems to have held and what losing it may cost (see `warnings`)."""

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line per damaged line, prefixed with the journal's path by the caller when needed."""
        return tuple(damage.warning for damage in self.damaged)


def read_run_journal(path: Path) -> RunJournal:
    """Every event of the journal at `path` (missing: none), and what its damaged lines may have cost.

    RecordError for a line this clusterctl cannot trust (a known kind with a wrong field, a newer
    version), and for a journal that is not a regular file (a directory, a FIFO) or is too large.
    """
    try:
        lines = read_json_lines(path)
    except UnreadableFileError as exc:
        raise RecordError(str(path), f"not a readable run journal: {exc.reason}") from None
    unreadable = set(lines.unreadable_lines)
    numbers = (n for n in range(1, lines.line_count + 1) if n not in unreadable)
    events = tuple(event_from_json(record, f"{path}:{number}") for record, number in zip(lines.records, numbers))
    damaged = tuple(_damaged_line(number, raw, number == lines.line_count)
                    for number, raw in zip(lines.unreadable_lines, lines.unreadable_text))
    return RunJournal(events, lines.unreadable_lines, damaged)


def append_run_event(path: Path, event: RunEvent) -> None:
    """Append one event (durable when this returns)."""
    append_json_line(path, event_to_json(event))
