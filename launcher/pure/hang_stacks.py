"""Why a step hung, from its ranks' Python stacks: which nodes to ask, and what their answers say.  (pure)

Before the agent ends a hung step it asks a few nodes for their ranks' stacks (`py-spy dump`, run there:
clusterctl.launcher.job.rank_stacks).  `nodes_to_dump` bounds who is asked, whatever the job's size:
the nodes the hang watch names (at most MAX_STUCK_NODES) and COMPARE_NODES healthy ones beside them, so
that "where the stuck ranks are" can be told from "where everyone else waits".  `summarize_stacks` reads
their records (clusterctl.records.node_stacks) into a few lines for the journal and `clusterctl report`:

    ranks 0-2,4-6 on node[1-2] in all_reduce (distributed_c10d.py:2501) from train.py:42
    ranks 3,7 on node2 in load_batch (loader.py:88) from train.py:40
    ranks 3,7 never arrived at all_reduce (distributed_c10d.py:2501) from train.py:42, where 6 other ranks wait

A stack is placed by its innermost frame (where the thread waits) and the innermost frame of the
program's own code (not the standard library's or an installed package's: the line of train.py that
called into torch), so ranks waiting in the same collective from the same line fall in one group.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from clusterctl.launcher.pure.hang_watch import ranks_text
from clusterctl.records.node_stacks import Frame, NodeStacks
from clusterctl.slurm import hostlist

MAX_STUCK_NODES = 8
"""At most this many of the nodes the hang watch names are asked for stacks (the first ones it names)."""
COMPARE_NODES = 2
"""Healthy nodes asked beside them (or, when the whole job stopped at once, the step's first nodes)."""
MAX_GROUPS = 6
"""Distinct stacks named in a summary; the rest are counted in one line."""

STATUS_WHY = {
    "gone": "the process had ended",
    "no-py-spy": "py-spy is not installed on the node",
    "refused": "the kernel refused to let py-spy read it (ptrace permission)",
    "timed-out": "py-spy did not answer in time",
    "failed": "py-spy failed",
    "not-tried": "not tried: the node's time bound was spent",
}
"""Why a rank has no stack, by its record's status."""

_LIBRARY = re.compile(r"/(site-packages|dist-packages)/|/lib/python3[.\d]*/|^<")


def nodes_to_dump(suspects: Sequence[str], step_nodes: Sequence[str], *, max_stuck: int = MAX_STUCK_NODES,
                  compare: int = COMPARE_NODES) -> tuple[str, ...]:
    """The nodes to ask for their ranks' stacks: the first `max_stuck` of `suspects` that are in the
    step, then `compare` of the step's other nodes, in the step's order.  Never more than
    `max_stuck + compare` nodes, whatever the job's size."""
    in_step = set(step_nodes)
    stuck = tuple(dict.fromkeys(n for n in suspects if n in in_step))[:max_stuck]
    others = tuple(n for n in dict.fromkeys(step_nodes) if n not in stuck)[:compare]
    return stuck + others


def _file_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def where_stuck(frames: Sequence[Frame]) -> str:
    """Where a stack (innermost frame first) waits: `function (file:line)`, and `from file:line`, the
    innermost frame of the program's own code when that is not the innermost frame itself."""
    inner = frames[0]
    place = f"{inner.function} ({_file_name(inner.file)}:{inner.line})"
    own = next((f for f in frames if not _LIBRARY.search(f.file)), None)
    if own is not None and own is not inner:
        place += f" from {_file_name(own.file)}:{own.line}"
    return place


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose stacks end in the same place (`where`, see `where_stuck`), with their nodes."""

    where: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]


def stack_groups(records: Iterable[NodeStacks]) -> tuple[StackGroup, ...]:
    """The dumped ranks of `records` grouped by where their stacks end, the largest group first (ties by
    `where`); each rank in one group only (a rank reported twice: its first node's answer, by name)."""
    places: dict[str, dict[int, str]] = {}
    seen: set[int] = set()
    for record in sorted(records, key=lambda r: r.node):
        for rank in sorted(record.ranks, key=lambda r: r.rank):
            if rank.status == "dumped" and rank.frames and rank.rank not in seen:
                seen.add(rank.rank)
                places.setdefault(where_stuck(rank.frames), {})[rank.rank] = record.node
    groups = (StackGroup(where, tuple(sorted(members)), tuple(sorted(set(members.values()))))
              for where, members in places.items())
    return tuple(sorted(groups, key=lambda g: (-len(g.ranks), g.where)))


def _members(ranks: Collection[int], nodes: Iterable[str]) -> str:
    return f"{ranks_text(ranks)} on {hostlist.compress(sorted(set(nodes)))}"


def summarize_stacks(records: Sequence[NodeStacks], asked: Sequence[str] = (),
                     first_stopped: Collection[int] = ()) -> tuple[str, ...]:
    """A hung step's stacks in a few lines (at most MAX_GROUPS + 5): where each group of ranks waits,
    which ranks never arrived where the most wait, which ranks have no stack and why, which of the
    `asked` nodes did not answer, and the flight-recorder dumps kept.  `first_stopped`: the ranks the
    hang watch saw stop first, named when the stacks alone do not tell the late ranks apart."""
    lines: list[str] = []
    groups = stack_groups(records)
    for group in groups[:MAX_GROUPS]:
        lines.append(f"{_members(group.ranks, group.nodes)} in {group.where}")
    if len(groups) > MAX_GROUPS:
        rest = [r for g in groups[MAX_GROUPS:] for r in g.ranks]
        lines.append(f"{ranks_text(rest)} in {len(groups) - MAX_GROUPS} other places (see the stack records)")
    if len(groups) > 1 and len(groups[0].ranks) > len(groups[1].ranks):
        late = [r for g in groups[1:] for r in g.ranks]
        lines.append(f"{ranks_text(late)} never arrived at {groups[0].where}, where {len(groups[0].ranks)} other "
                     f"rank{'s' if len(groups[0].ranks) != 1 else ''} wait")
    elif first_stopped:
        lines.append(f"the hang watch saw {ranks_text(first_stopped)} stop first")
    missing: dict[str, list[tuple[int, str]]] = {}
    dumped = {r for g in groups for r in g.ranks}
    for record in records:
        for rank in record.ranks:
            if rank.rank not in dumped:
                why = STATUS_WHY.get(rank.status, rank.status)
                if rank.status == "failed" and rank.note:
                    why += f": {rank.note.splitlines()[0][:120]}"
                missing.setdefault(why, []).append((rank.rank, record.node))
    reasons = sorted(missing.items(), key=lambda item: min(r for r, _ in item[1]))
    for why, members in reasons[:2]:
        lines.append(f"{_members([r for r, _ in members], [n for _, n in members])}: no stack ({why})")
    if len(reasons) > 2:
        lines.append(f"{sum(len(m) for _, m in reasons[2:])} more ranks without a stack (see the stack records)")
    answered = {r.node for r in records}
    silent = [n for n in asked if n not in answered]
    if silent:
        lines.append(f"no stacks from {hostlist.compress(sorted(silent))} (no answer in time)")
    kept = sorted((r.node, len(r.flight_recorder)) for r in records if r.flight_recorder)
    if kept:
        lines.append(f"flight-recorder dumps kept: {', '.join(f'{n} ({c})' for n, c in kept)}")
    elif records:
        lines.append("no PyTorch flight-recorder dump on the nodes asked (the job must set "
                     "TORCH_NCCL_TRACE_BUFFER_SIZE; NCCL only)")
    return tuple(lines)
