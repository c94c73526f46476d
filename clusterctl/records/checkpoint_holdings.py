"""What one node holds of a run's multi-level checkpoints: `<tier root>/holdings.json`.

Rewritten by the training program's checkpoint thread on the node (clusterctl.checkpoint) after every
change (a copy saved, received from another node, flushed to shared storage, or removed by retention);
read by the node's reporter, which carries it to the job's agent in its node reports.  The agent plans a
resume from the holdings of every node (launcher/pure/checkpoint_tiers.py): no file per node on shared
storage, no Slurm call.

A copy is named by (step, of_node, tier): `local`, the node's own part; `buddy`, `of_node`'s part kept
here for it; `shared`, `of_node`'s part this node flushed to shared storage.

Version 2 adds `last_resume`: the node's newest resume (the step, the tier its slot's files came from,
whose copy and where it was held, what staging it took, when), written by the rank that staged it, or
null.  The agent journals one `resumed` event per resumed step from these (how long the slowest node
read).  Version 1 files (an older clusterctl's, left in a tier root) are still read, as no resume.

Version 3 adds `copies_refused`: the connections the node's checkpoint copy server (in its first rank,
clusterctl/checkpoint/copy_server.py) turned away since it started, by reason (`CopyRefusals`: when it
started and at most one small count per reason of COPY_REFUSALS), or null while it refused none.  The
agent's summary names a node whose count grew.  Version 1 and 2 files are read as none refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.checkpoint_manifest import TIERS
from clusterctl.records.versioned import (
    MAX_WHOLE, RecordError, check_header, choice_field, field, header, node_field, read_json_record,
    refuse_unknown, seconds_field, whole_field,
)
from clusterctl.slurm.names import node_name_problem

KIND = "checkpoint-holdings"
VERSION = 3
READS_VERSIONS = (1, 2, 3)
"""Version 1 (before `last_resume`) is read as holdings without a resume, 1 and 2 (before `copies_refused`)
as none refused."""
HOLDINGS_NAME = "holdings.json"
MAX_HELD = 256
"""The most copies one node's holdings list (retention keeps a handful)."""
HOLDINGS_LIMIT = 256 << 10
_FIELDS_V1 = frozenset({"kind", "version", "node", "copies", "written_at"})
_FIELDS_V2 = _FIELDS_V1 | {"last_resume"}
_FIELDS = _FIELDS_V2 | {"copies_refused"}
COPY_REFUSALS = ("busy", "handshakes", "per peer", "timed out", "wrong key", "broken")
"""Why a copy server turns a connection away (CopyServer.refused): every transfer slot taken by the job's own
copies; too many handshakes at once; one address's connections; no whole request before the deadline; not the
job's key; not the protocol."""
_REFUSED_FIELDS = frozenset({"since", "counts"})
_RESUME_FIELDS = frozenset({"step", "tier", "of_node", "held_on", "seconds", "at"})
_COPY_FIELDS = frozenset({"step", "of_node", "tier", "slot", "slots", "written_at", "save_seconds"})


@dataclass(frozen=True)
class HeldCopy:
    """One complete, verified copy a node holds (or, tier `shared`, flushed): whose part of which step, the
    slot it was saved under in a map of `slots` nodes, when it was complete and what saving it took."""

    step: int
    of_node: str
    tier: str  # one of checkpoint_manifest.TIERS
    slot: int
    slots: int
    written_at: float
    save_seconds: float

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"tier {self.tier!r} is not one of {', '.join(TIERS)}")
        if (problem := node_name_problem(self.of_node)):
            raise ValueError(f"of_node: {problem}")
        if not 0 <= self.slot < self.slots:
            raise ValueError(f"slot {self.slot} is not a slot of a map of {self.slots}")

    def to_json(self) -> dict[str, Any]:
        """The copy's entry."""
        return {"step": self.step, "of_node": self.of_node, "tier": self.tier, "slot": self.slot,
                "slots": self.slots, "written_at": self.written_at, "save_seconds": self.save_seconds}

    @classmethod
    def from_json(cls, data: object, where: str) -> HeldCopy:
        """Parse one entry; RecordError for anything not understood."""
        if not isinstance(data, dict):
            raise RecordError(where, "must be an object")
        refuse_unknown(data, _COPY_FIELDS, where)
        slots = whole_field(data, "slots", where)
        slot = whole_field(data, "slot", where)
        if not 0 <= slot < slots:
            raise RecordError(where, f"field `slot` is {slot}: a slot of a map of {slots} (0 to {slots - 1})")
        return cls(step=whole_field(data, "step", where), of_node=node_field(data, "of_node", where),
                   tier=choice_field(data, "tier", TIERS, where), slot=slot, slots=slots,
                   written_at=seconds_field(data, "written_at", where),
                   save_seconds=seconds_field(data, "save_seconds", where))


@dataclass(frozen=True)
class LastResume:
    """The node's newest resume: its slot's files of checkpoint `step` came from `tier` (`local`: the
    node's own copy; `buddy`: `of_node`'s copy held on node `held_on`, this one or another; `shared`:
    shared storage), staging and verifying them took `seconds`, finished at `at` (epoch s)."""

    step: int
    tier: str  # one of checkpoint_manifest.TIERS
    of_node: str
    held_on: str
    """The node that held the copy ('' for shared storage)."""
    seconds: float
    at: float

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"tier {self.tier!r} is not one of {', '.join(TIERS)}")
        for name in ("of_node",) + (("held_on",) if self.held_on else ()):
            if (problem := node_name_problem(getattr(self, name))):
                raise ValueError(f"{name}: {problem}")

    def to_json(self) -> dict[str, Any]:
        """The resume's entry."""
        return {"step": self.step, "tier": self.tier, "of_node": self.of_node, "held_on": self.held_on,
                "seconds": self.seconds, "at": self.at}

    @classmethod
    def from_json(cls, data: object, where: str) -> LastResume:
        """Parse the entry; RecordError for anything not understood."""
        if not isinstance(data, dict):
            raise RecordError(where, "must be an object")
        refuse_unknown(data, _RESUME_FIELDS, where)
        tier = choice_field(data, "tier", TIERS, where)
        held_on = field(data, "held_on", str, where)
        if held_on:
            held_on = node_field(data, "held_on", where)
        elif tier != "shared":
            raise RecordError(where, f"field `held_on` is empty: a {tier} copy is held on a node")
        return cls(step=whole_field(data, "step", where), tier=tier, of_node=node_field(data, "of_node", where),
                   held_on=held_on, seconds=seconds_field(data, "seconds", where), at=seconds_field(data, "at", where))


@dataclass(frozen=True)
class CopyRefusals:
    """The connections the node's copy server turned away since it started at `since` (epoch s, the node's
    clock): (reason, count) pairs, reasons from COPY_REFUSALS in that order, each count at least 1."""

    since: float
    counts: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, since: float, refused: Mapping[str, int]) -> CopyRefusals | None:
        """The refusals a server counted (`CopyServer.refused`); None when it refused none.  A reason not in
        COPY_REFUSALS (a newer server's) is counted as `broken`."""
        counts = dict.fromkeys(COPY_REFUSALS, 0)
        for reason, count in refused.items():
            counts[reason if reason in counts else "broken"] += max(int(count), 0)
        kept = tuple((reason, min(count, MAX_WHOLE)) for reason, count in counts.items() if count > 0)
        return cls(since, kept) if kept else None

    @property
    def total(self) -> int:
        """Connections refused, whatever the reason."""
        return sum(count for _, count in self.counts)

    def to_json(self) -> dict[str, Any]:
        """The entry (a handful of small numbers: at most 6 reasons)."""
        return {"since": self.since, "counts": dict(self.counts)}

    @classmethod
    def from_json(cls, data: object, where: str) -> CopyRefusals:
        """Parse the entry; RecordError for anything not understood."""
        if not isinstance(data, dict):
            raise RecordError(where, "must be an object")
        refuse_unknown(data, _REFUSED_FIELDS, where)
        counts = field(data, "counts", dict, where)
        if not counts or not set(counts) <= set(COPY_REFUSALS):
            raise RecordError(where, f"field `counts` must count one or more of {', '.join(COPY_REFUSALS)}")
        kept = tuple((reason, whole_field(counts, reason, f"{where}: counts")) for reason in COPY_REFUSALS
                     if reason in counts)
        if any(count == 0 for _, count in kept):
            raise RecordError(where, "field `counts` lists a reason with no connection refused")
        return cls(seconds_field(data, "since", where), kept)


@dataclass(frozen=True)
class CheckpointHoldings:
    """Everything one node holds, as of `written_at` (epoch s), its newest resume (None: none known) and
    what its copy server refused (None: nothing)."""

    node: str
    copies: tuple[HeldCopy, ...] = ()
    written_at: float = 0.0
    last_resume: LastResume | None = None
    copies_refused: CopyRefusals | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as stored and as carried in a node report."""
        return {**header(KIND, VERSION), "node": self.node, "copies": [c.to_json() for c in self.copies],
                "written_at": self.written_at,
                "last_resume": self.last_resume.to_json() if self.last_resume is not None else None,
                "copies_refused": self.copies_refused.to_json() if self.copies_refused is not None else None}

    @classmethod
    def from_json(cls, data: object, where: str) -> CheckpointHoldings:
        """Parse the record (version 1, 2 or 3); RecordError naming `where` and the key for anything not exactly
        understood."""
        sent = data.get("version") if isinstance(data, dict) and data.get("kind") == KIND else None
        version = sent if sent in READS_VERSIONS and type(sent) is int else VERSION
        body = check_header(data, KIND, version, where)
        refuse_unknown(body, {1: _FIELDS_V1, 2: _FIELDS_V2}.get(version, _FIELDS), where)
        entries = field(body, "copies", list, where)
        if len(entries) > MAX_HELD:
            raise RecordError(where, f"field `copies` lists {len(entries)} copies: at most {MAX_HELD}")
        for key, since, meaning in (("last_resume", 2, "the node has not resumed"),
                                    ("copies_refused", 3, "its copy server refused none")):
            if version >= since and key not in body:
                raise RecordError(where, f"missing field `{key}` (null when {meaning})")
        resumed, refused = body.get("last_resume"), body.get("copies_refused")
        return cls(node=node_field(body, "node", where),
                   copies=tuple(HeldCopy.from_json(e, f"{where}: copies[{i}]") for i, e in enumerate(entries)),
                   written_at=seconds_field(body, "written_at", where),
                   last_resume=None if resumed is None else LastResume.from_json(resumed, f"{where}: last_resume"),
                   copies_refused=None if refused is None else CopyRefusals.from_json(refused,
                                                                                      f"{where}: copies_refused"))


def write_holdings(path: Path, holdings: CheckpointHoldings) -> Path:
    """Write the node's holdings atomically (the reporter reads the old file or the new one)."""
    return atomic_write(path, json.dumps(holdings.to_json(), sort_keys=True) + "\n", mode=0o600)


def read_holdings(path: Path) -> CheckpointHoldings | None:
    """The node's holdings; None when there is no file yet; RecordError when damaged, too large, not a
    regular file (never followed through a symlink) or from a newer clusterctl."""
    data = read_json_record(path, missing_ok=True, limit=HOLDINGS_LIMIT, follow_symlinks=False)
    return None if data is None else CheckpointHoldings.from_json(data, str(path))
