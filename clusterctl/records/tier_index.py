"""Where each slot of a step finds its checkpoint: `<launch dir>/tiers.idx`, a fixed-width index.

Written by the job's agent before it starts a step with multi-level checkpoints on
(launcher/job/checkpoint_plan.py); read by the training program's `clusterctl.checkpoint` on every
node, which reads the header and the one line of its own slot — a few hundred bytes of shared storage
per node, whatever the size of the job (like `rank_index.py`, whose layout this follows).

    {"kind": "tier-index", "record_bytes": 41, "slots": 3, "step": 200, "version": 1}
    node3 node7 local node3 node3␠␠␠␠
    spare node1 buddy node2 node4␠␠␠␠
    node1 node5 shared node1 -␠␠␠␠␠␠

Each line: the slot's node, its buddy (who keeps a copy of its part; `-` for none), and where the
slot's part of the resume checkpoint is: the tier (`local`, `buddy`, `shared`; `-` for a fresh
start), whose part it is (`of_node`: the node that had the slot when the checkpoint was saved) and
the node holding that copy (`held_on`; `-` for shared storage).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.checkpoint_manifest import TIERS
from clusterctl.records.versioned import RecordError, check_header, field, header, refuse_unknown, whole_field
from clusterctl.slurm.names import node_name_problem

KIND = "tier-index"
VERSION = 1
FILE_NAME = "tiers.idx"
HEADER_MAX_BYTES = 1024
HEADER_FIRST_BYTES = 256
"""A node reads this much first (a header is about 90 bytes), the rest of HEADER_MAX_BYTES only when it
holds no line end: what every node reads stays a few hundred bytes."""
NONE = "-"
_FIELDS = frozenset({"kind", "version", "step", "slots", "record_bytes"})


@dataclass(frozen=True)
class TierSlot:
    """One slot's line: its node and buddy, and where its part of the resume checkpoint is (`-`: none)."""

    node: str
    buddy: str = NONE
    tier: str = NONE
    of_node: str = NONE
    held_on: str = NONE

    def __post_init__(self) -> None:
        if (problem := _slot_problem(self)):
            raise ValueError(problem)

    def line(self) -> str:
        """The slot's fields, blank-separated."""
        return " ".join((self.node, self.buddy, self.tier, self.of_node, self.held_on))


def _slot_problem(slot: TierSlot) -> str | None:
    if (problem := node_name_problem(slot.node)):
        return f"node: {problem}"
    for key, value in (("buddy", slot.buddy), ("of_node", slot.of_node), ("held_on", slot.held_on)):
        if value != NONE and (problem := node_name_problem(value)):
            return f"{key}: {problem}"
    if slot.tier not in (*TIERS, NONE):
        return f"tier {slot.tier!r} is not one of {', '.join(TIERS)} or {NONE}"
    if (slot.tier == NONE) != (slot.of_node == NONE):
        return "a slot with a copy to load names whose part it is (of_node), and only then"
    if slot.tier in ("local", "buddy") and slot.held_on == NONE:
        return f"a {slot.tier} copy is held on a node (held_on)"
    return None


def tier_index_text(step: int | None, slots: Sequence[TierSlot]) -> str:
    """The index's text; ValueError for an empty map or a step without copies to load (or the reverse)."""
    if not slots:
        raise ValueError("a tier index has at least one slot")
    if any((step is None) != (s.tier == NONE) for s in slots):
        raise ValueError("a resume step names where every slot's part is, and a fresh start names none")
    width = max(len(s.line().encode("utf-8")) for s in slots) + 1
    head = json.dumps({**header(KIND, VERSION), "step": step, "slots": len(slots), "record_bytes": width},
                      sort_keys=True) + "\n"
    return head + "".join(s.line() + " " * (width - 1 - len(s.line().encode("utf-8"))) + "\n" for s in slots)


def write_tier_index(path: Path, step: int | None, slots: Sequence[TierSlot]) -> Path:
    """Write the index atomically (no rank reads half of it); its path."""
    return atomic_write(path, tier_index_text(step, slots))


def read_tier_slot(path: Path, slot: int) -> tuple[int | None, int, TierSlot]:
    """(the resume step or None, the slots in the map, slot `slot`'s line), reading the header and that line
    only.  FileNotFoundError without an index; RecordError when it is damaged, foreign, from a newer
    clusterctl, or has no such slot."""
    where = str(path)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        first = os.pread(fd, HEADER_FIRST_BYTES, 0)
        end = first.find(b"\n")
        if end < 0 and len(first) == HEADER_FIRST_BYTES:
            first = os.pread(fd, HEADER_MAX_BYTES, 0)
            end = first.find(b"\n")
        if end < 0:
            raise RecordError(where, f"no header line in the first {HEADER_MAX_BYTES} bytes; not a tier index")
        try:
            parsed: Any = json.loads(first[:end].decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise RecordError(where, f"header is not a readable JSON record ({exc.__class__.__name__})") from None
        body = check_header(parsed, KIND, VERSION, where)
        refuse_unknown(body, _FIELDS, where)
        step = field(body, "step", (int, type(None)), where)
        if step is not None:
            step = whole_field(body, "step", where)
        slots, width = whole_field(body, "slots", where), whole_field(body, "record_bytes", where, maximum=4096)
        if slots < 1 or width < 2:
            raise RecordError(where, "fields `slots` and `record_bytes` must be positive")
        if os.fstat(fd).st_size != end + 1 + slots * width:
            raise RecordError(where, f"the header promises {slots} slots of {width} bytes; the file is damaged "
                                     "or half-copied")
        if not 0 <= slot < slots:
            raise RecordError(where, f"no slot {slot}: the map has {slots} (0 to {slots - 1})")
        raw = os.pread(fd, width, end + 1 + slot * width)
    finally:
        os.close(fd)
    parts = raw[:-1].decode("utf-8", errors="replace").split()
    if not raw.endswith(b"\n") or len(parts) != 5:
        raise RecordError(where, f"the line of slot {slot} is damaged")
    try:
        return step, slots, TierSlot(*parts)
    except ValueError as exc:
        raise RecordError(where, f"slot {slot}: {exc}") from None
