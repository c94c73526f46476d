"""Multi-level checkpoints (issue #25, being built): whose copy each node keeps, and where a resume
loads each node's shards from.

A checkpoint lives in up to three tiers (`clusterctl.records.checkpoint_manifest`): each node's
own storage (`local`), a copy of each node's shards on its **buddy** node (`buddy`), and, for every
k-th checkpoint, shared storage (`shared`).  Two decisions are made here, both pure:

- `buddy_map`: which node keeps whose copy.  Every node keeps exactly one other node's copy (the
  memory each node spends on copies is the same), never its own, and under another leaf switch
  whenever the topology allows, so that one switch's failure does not take a node and its copy.
- `plan_resume`: the newest checkpoint complete across tiers given the nodes gone now, and for each
  node of the map that saved it where its shards come from: its own local copy when the node
  survives and the copy verifies, else the copy on its buddy when that node survives and the copy
  verifies, else shared storage.  Every newer checkpoint passed over is said with its reason.  A
  checkpoint whose resume already failed FAILED_RESUMES_BEFORE_FALLBACK times is passed over for
  the newest checkpoint complete on shared storage alone (the last flushed one), and the plan says why.

Reading manifests and checking shards' checksums happen elsewhere; their results come in as data
(`CopyCheck`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from clusterctl.records.checkpoint_holdings import CheckpointHoldings, LastResume
from clusterctl.records.checkpoint_manifest import CheckpointManifest
from clusterctl.records.run_journal import NAMED_BUDDY_COPIES, RESUME_TIERS, Resumed
from clusterctl.text import one_line

FAILED_RESUMES_BEFORE_FALLBACK = 2
"""A checkpoint whose resume failed this many times is passed over for the last flushed checkpoint."""
NAMED_NODES = 5
"""A skipped checkpoint's reason names this many nodes' troubles, then counts the rest."""


def buddy_map(nodes: Iterable[str], leaf_of: Mapping[str, str]) -> dict[str, str]:
    """Each node's buddy: `{node: the node that keeps a copy of node's shards}`.

    The map is a bijection on `nodes` (every node keeps exactly one other node's copy), no node is
    its own buddy, and it depends only on the set of nodes and their leaves (not on the order
    given).  A node's buddy is under another leaf switch whenever the largest leaf's group holds at
    most half of the nodes; when one leaf holds more, as many nodes as possible (twice the nodes
    outside that leaf) have a buddy under another leaf and the rest of that leaf's nodes keep each
    other's copies.  A node missing from `leaf_of` counts in one group of nodes whose leaf is
    unknown (no claim is made that its copy crosses a switch).

    Fewer than two nodes: an empty map (one node has no other node to keep its copy; its
    checkpoints are safe only once flushed to shared storage).  A node listed twice: ValueError.
    """
    listed = list(nodes)
    if len(set(listed)) != len(listed):
        twice = sorted(node for node, count in Counter(listed).items() if count > 1)
        raise ValueError(f"node {twice[0]!r} is listed twice")
    if len(listed) < 2:
        return {}
    groups: dict[str, list[str]] = {}
    for node in listed:
        groups.setdefault(leaf_of.get(node, ""), []).append(node)
    ordered = [sorted(groups[leaf]) for leaf in sorted(groups)]
    largest = max(len(g) for g in ordered)
    total = len(listed)
    if 2 * largest <= total:
        # Leaves laid end to end; each node's buddy is `largest` places on, cyclically.  A leaf's
        # block is at most `largest` long and the way round is at least twice that, so the node
        # `largest` places on lies past the end of its leaf's block and before its start again.
        ring = [node for group in ordered for node in group]
        return {node: ring[(i + largest) % total] for i, node in enumerate(ring)}
    # One leaf holds more than half: one cycle through every node that alternates a node of the big
    # leaf with one of the others while the others last, then runs through the rest of the big leaf.
    big_index = next(i for i, g in enumerate(ordered) if len(g) == largest)
    big = ordered[big_index]
    others = [node for i, group in enumerate(ordered) if i != big_index for node in group]
    cycle = [node for pair in zip(big, others) for node in pair] + big[len(others):]
    return {node: cycle[(i + 1) % total] for i, node in enumerate(cycle)}


@dataclass(frozen=True)
class CopyCheck:
    """One copy (its manifest) and what verifying its shards against the manifest found.

    `problem` is '' for a copy whose every shard is there with its size and checksum; else a phrase
    that follows "the copy", as a user reads it: `fails its checksum (shard 7.distcp)`,
    `is missing shard 3.distcp`.
    """

    manifest: CheckpointManifest
    problem: str = ""

    @property
    def verified(self) -> bool:
        """Every shard of the copy checked out."""
        return not self.problem


@dataclass(frozen=True)
class SavedCheckpoint:
    """One checkpoint: its step, the nodes of the map that saved it (each saved a part: take them from
    the rank map at save time, not from the manifests found, or a node that wrote none goes unnoticed),
    and every copy of those parts found, in any tier (copies of other nodes are not looked at)."""

    step: int
    nodes: frozenset[str]
    copies: tuple[CopyCheck, ...] = ()

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError(f"step {self.step}: a checkpoint is saved by at least one node")
        wrong = [c.manifest for c in self.copies if c.manifest.step != self.step]
        if wrong:
            raise ValueError(f"step {self.step}: {wrong[0].where} is of step {wrong[0].step}")


@dataclass(frozen=True)
class ResumeFacts:
    """What a resume is planned from: the checkpoints, the nodes gone now (their tiers with them),
    and how many resumes from each step have failed already (`{step: count}`)."""

    checkpoints: tuple[SavedCheckpoint, ...]
    gone: frozenset[str] = frozenset()
    failed_resumes: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        steps = [c.step for c in self.checkpoints]
        if len(set(steps)) != len(steps):
            raise ValueError(f"step {sorted(s for s in steps if steps.count(s) > 1)[0]} is given twice")


@dataclass(frozen=True)
class ShardSource:
    """Where one node's shards are loaded from: `node` saved them; `copy` is the verified copy to
    load (its tier, the node holding it, its shards).  The node that loads them is the one in
    `node`'s slot of the new map: `node` itself when it survives, else its replacement."""

    node: str
    copy: CheckpointManifest

    @property
    def tier(self) -> str:
        """`local`, `buddy` or `shared`."""
        return self.copy.tier

    @property
    def held_on(self) -> str | None:
        """The node whose tier holds the copy (None: shared storage)."""
        return self.copy.held_on


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint newer than the one chosen, and why it was passed over (`why` reads
    `step 40: node3's shards: local copy gone with node3; ...`).  `missing`: the nodes whose shards
    no usable copy holds (empty when the checkpoint was passed over for its failed resumes)."""

    step: int
    why: str
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResumePlan:
    """The checkpoint to resume from (`step`; None: none is complete, the program starts from its
    beginning), each node's source (one per node of the map that saved it, by node name), every
    newer checkpoint passed over (newest first), and `fallback`: why only checkpoints complete on
    shared storage were taken ('' when resumes failed too few times for that)."""

    step: int | None
    sources: tuple[ShardSource, ...] = ()
    skipped: tuple[SkippedCheckpoint, ...] = ()
    fallback: str = ""

    def lines(self) -> list[str]:
        """What a user reads about this plan: each checkpoint passed over, the fallback, the choice."""
        said = [f"skipping checkpoint {s.why}" for s in self.skipped]
        if self.fallback:
            said.append(self.fallback)
        if self.step is None:
            said.append("no checkpoint is complete across its tiers: the program starts from its beginning")
            return said
        by_tier: dict[str, list[ShardSource]] = {"local": [], "buddy": [], "shared": []}
        for source in self.sources:
            by_tier[source.tier].append(source)
        parts = []
        if by_tier["local"]:
            parts.append(f"{len(by_tier['local'])} node(s) from their own copies")
        if by_tier["buddy"]:
            parts.append(f"{len(by_tier['buddy'])} node(s) from a buddy's copy ("
                         + _named([f"{s.node}'s on {s.held_on}" for s in by_tier["buddy"]]) + ")")
        if by_tier["shared"]:
            parts.append(f"{len(by_tier['shared'])} node(s) from shared storage")
        said.append(f"resuming from step {self.step}: " + ", ".join(parts))
        return said

    def from_tiers(self, shared_path: str) -> str:
        """What the nodes' tiers give of the chosen checkpoint, as a user reads it: `in the nodes' tiers:
        1 own copy, 1 buddy copy` (and `; 1 part on shared storage: <shared_path>` when some parts are read
        from there); '' when every part is read from shared storage, or no checkpoint is chosen."""
        counts = Counter(source.tier for source in self.sources)
        near = [f"{n} {label} cop{'y' if n == 1 else 'ies'}"
                for tier, label in (("local", "own"), ("buddy", "buddy")) if (n := counts[tier])]
        if not near:
            return ""
        shared = counts["shared"]
        return "in the nodes' tiers: " + ", ".join(near) + (
            f"; {shared} part{'' if shared == 1 else 's'} on shared storage: {shared_path}" if shared else "")


def plan_resume(facts: ResumeFacts) -> ResumePlan:
    """The newest checkpoint whose every node's shards have a usable copy, and where each comes from.

    A copy is usable when it verified and the node holding it is not gone (a shared copy is held on
    no node).  Each node's shards come from its own local copy when it can, else from a copy on
    another node (its buddy), else from shared storage.  A checkpoint whose resume failed
    FAILED_RESUMES_BEFORE_FALLBACK times or more is passed over, and from then on only a checkpoint
    complete on shared storage alone is taken, every node's shards from there: the same failure
    twice says the fast tiers cannot be trusted with it.
    """
    return _plan(sorted(facts.checkpoints, key=lambda c: c.step, reverse=True), facts.gone, facts.failed_resumes)


def _plan(newest_first: Iterable[SavedCheckpoint], gone: frozenset[str], failed_resumes: Mapping[int, int]
          ) -> ResumePlan:
    """plan_resume over the checkpoints given newest first (each looked at only until one is complete)."""
    skipped: list[SkippedCheckpoint] = []
    fallback = ""
    for checkpoint in newest_first:
        failures = failed_resumes.get(checkpoint.step, 0)
        if failures >= FAILED_RESUMES_BEFORE_FALLBACK:
            skipped.append(SkippedCheckpoint(checkpoint.step, f"step {checkpoint.step}: resuming from it failed "
                                             f"{failures} times; falling back to the newest checkpoint on shared "
                                             "storage"))
            fallback = fallback or (f"resuming from step {checkpoint.step} failed {failures} times: only a "
                                    "checkpoint flushed to shared storage is taken")
            continue
        sources, troubles = _sources(checkpoint, gone, shared_only=bool(fallback))
        if troubles:
            missing = tuple(node for node, _ in troubles)
            said = [f"{node}'s shards: {why}" for node, why in troubles[:NAMED_NODES]]
            if len(troubles) > NAMED_NODES:
                said.append(f"and {len(troubles) - NAMED_NODES} more nodes' shards have no usable copy")
            prefix = f"step {checkpoint.step}: " + ("not complete on shared storage: " if fallback else "")
            skipped.append(SkippedCheckpoint(checkpoint.step, prefix + ". ".join(said), missing))
            continue
        return ResumePlan(checkpoint.step, tuple(sources), tuple(skipped), fallback)
    return ResumePlan(None, (), tuple(skipped), fallback)


def _sources(checkpoint: SavedCheckpoint, gone: frozenset[str], *, shared_only: bool
             ) -> tuple[list[ShardSource], list[tuple[str, str]]]:
    """Each node's source, or for each node without one why not (node, reasons joined by '; ')."""
    copies: dict[tuple[str, str], list[CopyCheck]] = {}
    for check in checkpoint.copies:
        copies.setdefault((check.manifest.of_node, check.manifest.tier), []).append(check)
    # Sorted, so that which of two equal copies is taken never depends on the order they were found in (each
    # node's copies in a tier sorted apart: a stable sort orders them as sorting all the copies did).
    for checks in copies.values():
        if len(checks) > 1:
            checks.sort(key=lambda c: (c.manifest.held_on or "", c.manifest.written_at, c.problem))
    sources: list[ShardSource] = []
    troubles: list[tuple[str, str]] = []
    for node in sorted(checkpoint.nodes):
        reasons: list[str] = []
        chosen = None
        if not shared_only:
            chosen = _local(node, copies.get((node, "local"), []), gone, reasons)
            chosen = chosen or _buddy(node, copies.get((node, "buddy"), []), gone, reasons)
        chosen = chosen or _shared(copies.get((node, "shared"), []), reasons)
        if chosen is not None:
            sources.append(ShardSource(node, chosen.manifest))
        else:
            troubles.append((node, "; ".join(reasons)))
    return sources, troubles


def _local(node: str, checks: list[CopyCheck], gone: frozenset[str], reasons: list[str]) -> CopyCheck | None:
    if node in gone:
        reasons.append(f"local copy gone with {node}")
        return None
    if not checks:
        reasons.append("no local copy")
        return None
    usable = [c for c in checks if c.verified]
    if usable:
        return usable[0]
    reasons.append(f"local copy {_problem(checks[0])}")
    return None


def _buddy(node: str, checks: list[CopyCheck], gone: frozenset[str], reasons: list[str]) -> CopyCheck | None:
    if not checks:
        reasons.append("no copy on a buddy node")
        return None
    for check in sorted(checks, key=lambda c: c.manifest.held_on or ""):
        held_on = check.manifest.held_on
        if held_on in gone:
            reasons.append(f"buddy copy on {held_on} gone with {held_on}")
        elif not check.verified:
            reasons.append(f"buddy copy on {held_on} {_problem(check)}")
        else:
            return check
    return None


def _shared(checks: list[CopyCheck], reasons: list[str]) -> CopyCheck | None:
    if not checks:
        reasons.append("not flushed to shared storage")
        return None
    usable = [c for c in checks if c.verified]
    if usable:
        return usable[0]
    reasons.append(f"copy on shared storage {_problem(checks[0])}")
    return None


def _problem(check: CopyCheck) -> str:
    return one_line(check.problem[:200])


def _named(items: list[str]) -> str:
    """The first NAMED_NODES items by name, then how many more."""
    shown = ", ".join(items[:NAMED_NODES])
    return shown + (f" and {len(items) - NAMED_NODES} more" if len(items) > NAMED_NODES else "")


def copy_key(manifest: CheckpointManifest) -> tuple[int, str, str, str | None]:
    """What names one copy: (step, of_node, tier, held_on)."""
    return (manifest.step, manifest.of_node, manifest.tier, manifest.held_on)


def resume_facts(copies: Iterable[CheckpointManifest], *, gone: Iterable[str] = (),
                 problems: Mapping[tuple[int, str, str, str | None], str] | None = None,
                 failed_resumes: Mapping[int, int] | None = None) -> ResumeFacts:
    """The facts `plan_resume` plans from, given every copy known (from the nodes' holdings and shared
    storage; their shards need not be listed: they are verified where they are loaded), the problems
    found with some of them (by `copy_key`: a copy a resume could not load), the nodes gone and the
    failed resumes so far.

    A checkpoint's nodes are the nodes that saved each slot of its map (`slot`, `slots` of its copies);
    a slot no copy is known of is named `slot <s>`, so that such a checkpoint is never taken as complete.
    """
    return ResumeFacts(tuple(_saved_checkpoints(copies, problems or {}, newest_first=False)), frozenset(gone),
                       dict(failed_resumes or {}))


def plan_resume_from_copies(copies: Iterable[CheckpointManifest], *, gone: Iterable[str] = (),
                            problems: Mapping[tuple[int, str, str, str | None], str] | None = None,
                            failed_resumes: Mapping[int, int] | None = None) -> ResumePlan:
    """`plan_resume(resume_facts(...))` of the same arguments, the same plan, with each checkpoint's facts made
    only when the plan comes to it (newest first, until one is complete).

    What the agent plans with after a node loss, on the recovery's critical path: at 12,500 nodes its
    100,000 copies belong to a handful of checkpoints, and the newest is usually the one taken."""
    return _plan(_saved_checkpoints(copies, problems or {}, newest_first=True), frozenset(gone),
                 dict(failed_resumes or {}))


def _saved_checkpoints(copies: Iterable[CheckpointManifest], problems: Mapping[tuple[int, str, str, str | None], str],
                       *, newest_first: bool) -> Iterator[SavedCheckpoint]:
    """Each step's checkpoint (see resume_facts), made as it is asked for, oldest or newest first."""
    by_step: dict[int, list[CheckpointManifest]] = {}
    for manifest in copies:
        by_step.setdefault(manifest.step, []).append(manifest)
    for step in sorted(by_step, reverse=newest_first):
        found = by_step[step]
        slots = max(m.slots for m in found)
        # A slot's saver is the node of its newest copy (by written_at, then of_node).
        newest: dict[int, tuple[float, str]] = {}
        for m in found:
            known = newest.get(m.slot)
            if known is None or (m.written_at, m.of_node) > known:
                newest[m.slot] = (m.written_at, m.of_node)
        nodes = frozenset(newest[slot][1] if slot in newest else f"slot {slot}" for slot in range(slots))
        # One copy per copy_key (a later one replaces an earlier one), in the order of (of_node, tier, held_on):
        # held_on is None for a shared copy only, and '' is no node's name.
        unique = {(m.of_node, m.tier, m.held_on or ""): m for m in found}
        checks = tuple(CopyCheck(m, problems.get(copy_key(m), "") if problems else "")
                       for name in sorted(unique) if (m := unique[name]).of_node in nodes)
        yield SavedCheckpoint(step, nodes, checks)


@dataclass(frozen=True)
class PartsHeld:
    """Where the parts of checkpoint `step` are: of its `parts` (the slots of the map that saved it), how many
    have a copy on the node that saved it (`local`), on another node (`buddy`), on shared storage (`shared`),
    counting the nodes not gone.  `saved_at`: when its last part was saved on its node (epoch s, that node's
    clock), else its newest copy's time; None when no copy says (a checkpoint known from complete.json alone)."""

    step: int
    parts: int
    local: int = 0
    buddy: int = 0
    shared: int = 0
    saved_at: float | None = None

    def to_json(self) -> dict[str, object]:
        """As `status --json` shows it (`checkpoint.tiers`)."""
        return {"step": self.step, "parts": self.parts, "local": self.local, "buddy": self.buddy,
                "shared": self.shared, "saved_at": self.saved_at}


def parts_held(copies: Iterable[CheckpointManifest], step: int, gone: Iterable[str] = ()) -> PartsHeld:
    """Where the parts of checkpoint `step` are held, from every copy known (the nodes' holdings and shared
    storage's complete.json), the copies on the nodes `gone` not counted."""
    lost = frozenset(gone)
    slots = 0
    held: dict[str, set[int]] = {tier: set() for tier in ("local", "buddy", "shared")}
    saved: dict[str, float] = {"local": 0.0, "any": 0.0}
    for copy in copies:
        if copy.step != step:
            continue
        slots = max(slots, copy.slots)
        if copy.held_on is not None and copy.held_on in lost:
            continue
        held[copy.tier].add(copy.slot)
        saved["any"] = max(saved["any"], copy.written_at)
        if copy.tier == "local":
            saved["local"] = max(saved["local"], copy.written_at)
    return PartsHeld(step, slots, len(held["local"]), len(held["buddy"]), len(held["shared"]),
                     saved["local"] or saved["any"] or None)


@dataclass(frozen=True)
class FlushedCheckpoint:
    """Checkpoint `step`, every slot's part on shared storage: `nodes[s]` is the node whose part slot s
    holds (the node that had slot s when it was saved)."""

    step: int
    nodes: tuple[str, ...]
    save_seconds: float | None = None
    """The slowest slot's save (seconds training stalled for it: the local save, or the synchronous write to
    shared storage of a node whose local tier was unusable); None when unknown."""


def flushed_whole(holdings: Iterable[CheckpointHoldings], done: Iterable[int] = ()) -> list[FlushedCheckpoint]:
    """The checkpoints not in `done` every slot of which some node's holdings report flushed to shared
    storage, oldest first (each ready for its complete.json)."""
    finished = set(done)
    flushed: dict[int, dict[int, str]] = {}
    slots: dict[int, int] = {}
    stall: dict[int, float] = {}  # the slowest slot's save: what training waited for
    for held in holdings:
        for c in held.copies:
            if c.tier == "shared" and c.step not in finished:
                flushed.setdefault(c.step, {})[c.slot] = c.of_node
                slots[c.step] = max(slots.get(c.step, 0), c.slots)
                stall[c.step] = max(stall.get(c.step, 0.0), c.save_seconds)
    return [FlushedCheckpoint(step, tuple(flushed[step][s] for s in range(slots[step])), stall[step])
            for step in sorted(flushed) if sorted(flushed[step]) == list(range(slots[step]))]


@dataclass(frozen=True)
class SlotSource:
    """Where the node in one slot of a new map finds that slot's shards: `tier` `local` (its own copy),
    `buddy` (the copy of `of_node`'s shards held on node `held_on`, fetched over the network),
    `shared`, or '' (a fresh start: nothing to load)."""

    slot: int
    node: str
    buddy: str
    tier: str = ""
    of_node: str = ""
    held_on: str = ""


def holding_nodes(plan: ResumePlan) -> frozenset[str]:
    """The nodes whose tiers hold a copy the plan reads (none for shared copies or a fresh start)."""
    return frozenset(s.held_on for s in plan.sources if s.held_on is not None and s.tier != "shared")


def nodes_for_map(nodes: Sequence[str], in_map: Sequence[str], holders: Iterable[str]) -> list[str] | None:
    """The nodes to make a step's map of so that every node of `nodes` holding a copy the resume reads
    (`holders`) runs ranks: a node outside the map runs no copy server, so a copy on it cannot be
    fetched.  `in_map`: the nodes the map made of all of `nodes` took (the rest are spares).  The result
    is `nodes` (in their order) less as many nodes that hold nothing as the map leaves out: the spares
    that hold nothing first, then the map's own nodes that hold nothing, its last first.  None when the
    map already takes every holder, or cannot (more holders than the map has nodes)."""
    held = set(holders) & set(nodes)
    taken = set(in_map)
    if held <= taken:
        return None
    spare_count = len(nodes) - len(in_map)
    drop = [n for n in nodes if n not in taken and n not in held]
    drop += [n for n in reversed(in_map) if n not in held]
    if len(drop) < spare_count:
        return None
    dropped = set(drop[:spare_count])
    return [n for n in nodes if n not in dropped]


def slot_sources(plan: ResumePlan, slots: Sequence[str], buddies: Mapping[str, str]) -> list[SlotSource]:
    """For each slot of the new map (`slots`: its nodes in slot order), where its shards come from.

    The shards of slot s are the ones saved by the node that had slot s when the checkpoint was saved
    (the copy's `slot`).  A copy local to another node than the one now in the slot is fetched from
    that node like a buddy's copy.  ValueError when the plan's checkpoint was saved by a map of
    another size (its ranks would not match the new map's)."""
    by_slot = {source.copy.slot: source for source in plan.sources}
    if plan.step is not None and (len(by_slot) != len(slots) or any(s.copy.slots != len(slots) for s in plan.sources)):
        raise ValueError(f"the checkpoint of step {plan.step} was saved by a map of "
                         f"{plan.sources[0].copy.slots if plan.sources else 0} nodes, the new map has {len(slots)}")
    result = []
    for slot, node in enumerate(slots):
        buddy = buddies.get(node, "")
        source = by_slot.get(slot)
        if source is None:
            result.append(SlotSource(slot, node, buddy))
        elif source.tier == "shared":
            result.append(SlotSource(slot, node, buddy, "shared", source.node))
        elif source.held_on == node and source.tier == "local":
            result.append(SlotSource(slot, node, buddy, "local", source.node, node))
        else:
            result.append(SlotSource(slot, node, buddy, "buddy", source.node, source.held_on or ""))
    return result


def resumed_event(*, at: float, job_id: str, restart: int, step: int, planned: Sequence[SlotSource],
                  said: Mapping[str, LastResume]) -> Resumed:
    """The journal's one line about a resumed step: for every slot of the step (`planned`, from its tier
    index), the tier its node said its part came from (`said`: the nodes' resumes of this step, from their
    holdings), else the planned one; the copies read from other nodes (the first few named); and the slowest
    staging among the nodes that said."""
    tiers = {tier: 0 for tier in RESUME_TIERS}
    copies: list[str] = []
    slowest: tuple[float, str] | None = None
    for source in planned:
        resumed = said.get(source.node)
        if resumed is not None:
            tier, of_node, held_on = resumed.tier, resumed.of_node, resumed.held_on
            if slowest is None or resumed.seconds > slowest[0]:
                slowest = (resumed.seconds, source.node)
        else:
            tier, of_node, held_on = source.tier or "shared", source.of_node, source.held_on
        tiers[tier] += 1
        if tier == "buddy":
            copies.append(f"{of_node}'s on {held_on}")
    reported = sum(1 for s in planned if s.node in said)
    return Resumed(at=at, job_id=job_id, restart=restart, step=step, nodes=len(planned),
                   tiers=tuple((t, n) for t, n in tiers.items() if n), buddy_copies=tuple(copies[:NAMED_BUDDY_COPIES]),
                   more_buddy_copies=max(0, len(copies) - NAMED_BUDDY_COPIES), reported=reported,
                   read_seconds=slowest[0] if slowest else None, slowest_node=slowest[1] if slowest else "")


def resume_said(holdings: Mapping[str, CheckpointHoldings], nodes: Iterable[str], step: int, since: float,
                before: Mapping[str, LastResume | None]) -> dict[str, LastResume]:
    """The resumes of checkpoint `step` the `nodes` said in their `holdings` for a step started at `since`
    (epoch s): a node's resume counts when it is of that step, is not the one it said before the step
    started (`before`: an earlier launch's, left in its holdings) and is not older than the step
    (CLOCK_SLACK_SECONDS allowed between the agent's clock and the node's)."""
    found = {}
    for node in nodes:
        held = holdings.get(node)
        resumed = held.last_resume if held is not None else None
        if resumed is not None and resumed.step == step and resumed != before.get(node) and \
                resumed.at >= since - CLOCK_SLACK_SECONDS:
            found[node] = resumed
    return found


CLOCK_SLACK_SECONDS = 5.0
"""How far a node's clock may lag the agent's when telling a resume of this step from an earlier one."""


def resumed_text(resumed: Resumed) -> str:
    """One resume in a user's words: where the nodes' parts came from and how long the slowest read took."""
    parts = []
    if n := resumed.count("local"):
        parts.append(f"{n} node(s) from their own copies")
    if n := resumed.count("buddy"):
        more = f" and {resumed.more_buddy_copies} more" if resumed.more_buddy_copies else ""
        parts.append(f"{n} node(s) from a buddy's copy ({', '.join(resumed.buddy_copies)}{more})")
    if n := resumed.count("shared"):
        parts.append(f"{n} node(s) from shared storage")
    if resumed.read_seconds is None:
        read = "read time unknown (no node said before the step ended)"
    else:
        unsaid = f", {resumed.reported} of {resumed.nodes} nodes said" if resumed.reported < resumed.nodes else ""
        read = f"read in {resumed.read_seconds:.2f} s (slowest: {resumed.slowest_node}{unsaid})"
    return f"step {resumed.step}: {', '.join(parts)}; {read}"
