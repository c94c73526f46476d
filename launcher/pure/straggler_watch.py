"""Stragglers: the node whose ranks compute persistently slower than the job's, and by how much.  (pure)

Every collective runs at the speed of the slowest rank, so in data-parallel training every rank's
*step* takes the same time; what tells a slow node apart is each rank's *compute* time, the part of
the step before it waits for its peers.  Ranks report it through clusterctl.progress.beat
(`compute_seconds`), summed into their progress records; between two reads of a rank the watch
takes the growth, compute seconds over compute steps, as that rank's time per step.

Each read ("sample") gives the job a reference, the lower median of its ranks' times (with one rank
on each of two nodes, the faster one), and each rank a ratio, its time over the reference; a
slowdown of the whole job (a shared-filesystem stall, a slower data shard for everyone) moves the
reference with it and flags nobody.  A rank is slow when its samples stay at or above `margin` for
at least `window_steps` steps in a row after its first slow sample (which may have begun before the
slowdown did), so a short blip ends its streak first (judging ranks, not
nodes, keeps one rank's hiccup from extending another's streak).  A sample below `clear_margin` ends
a streak and, after `window_steps` such steps, a straggler's state (hysteresis: samples in between
neither add nor clear).  A node is a straggler while one of its ranks is (one throttled GPU slows
the whole job).  The first `warmup_steps` steps of each rank (compilation, cache warm-up) are not
judged; checkpoint saves are not compute, so they never count.

The job waits for its slowest rank in every collective: each sample, when that rank is at or above
the margin, its excess over the reference times the steps is time lost, put on its node (`lost_s`),
from the first slow sample on, detected or not.  Nothing here reads a clock or a
file: the caller passes the progress records in, each poll, or (the agent, 100,000 ranks a heartbeat at
12,500 nodes) each node's ranks as the columns its compact report carries (`observe_nodes`): the watch takes
them a few hundred nodes at a time in C-level passes over the columns, and keeps what it knows of each rank
in one dict per field, so that no object is made per rank and read.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from bisect import bisect_right
from itertools import accumulate, chain, repeat
from operator import add, sub, truediv
from typing import NamedTuple, Protocol

from clusterctl.launcher.pure.hang_watch import ranks_text
from clusterctl.launcher.pure.in_parts import PART_RECORDS, Parts, to_the_end
from clusterctl.records.rank_progress import RankProgress
from clusterctl.records.run_journal import StragglerFound

ACTIONS = ("off", "report", "exclude", "swap")
"""What a run does with a straggler: nothing; journal it and show it; also avoid the node from the
next resubmission on; or take it out of the job now and start again from the last checkpoint on a spare."""


@dataclass(frozen=True)
class StragglerPolicy:
    """When a node counts as a straggler (`[stragglers]` of the job spec)."""

    action: str = "report"
    margin: float = 1.2
    """A node is slow while its compute time per step is at least this many times the job's reference."""
    window_steps: int = 30
    """...for this many steps in a row (and a straggler recovers after this many steps below clear_margin)."""
    warmup_steps: int = 10
    """Each rank's first steps are not judged (compilation, caches, the first data loads)."""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {', '.join(ACTIONS)}")
        if not self.margin > 1.0 or self.margin > 100:
            raise ValueError(f"margin {self.margin!r} must be above 1 (1.2: 20% slower than the job) and at most 100")
        if self.window_steps < 1 or self.warmup_steps < 0:
            raise ValueError("window_steps must be at least 1 and warmup_steps not negative")

    @property
    def clear_margin(self) -> float:
        """Below this ratio a sample counts as back to normal: halfway between 1 and `margin`."""
        return 1.0 + (self.margin - 1.0) / 2


class RankStats(NamedTuple):
    """One rank's streaks: how many steps in a row it has been slow (or back to normal).  A tuple, not
    a dataclass: a read at 100,000 ranks makes one per rank, and a frozen dataclass costs 10x more."""

    rank: int
    node: str
    seconds: float | None = None
    ratio: float | None = None
    slow_steps: int = 0
    """Steps of the current streak counted towards the window (its first read's are not)."""
    slow_since_step: int | None = None
    slow_until_step: int | None = None
    slow_ratios: tuple[float, ...] = ()
    clear_steps: int = 0
    straggler: bool = False


class NodeStats(NamedTuple):
    """What the watch knows of one node: its slowest rank's latest numbers, its streak, the time it cost.  A
    tuple, not a dataclass: a read at 12,500 nodes makes one per node."""

    node: str
    ranks: tuple[int, ...] = ()
    seconds: float | None = None
    """The latest compute time per step of its slowest rank."""
    ratio: float | None = None
    """...over the job's reference."""
    steps: int = 0
    """Steps judged on this node so far."""
    slow_steps: int = 0
    """Steps of the longest current streak of one of its ranks at or above the margin."""
    straggler: bool = False
    lost_s: float = 0.0
    """Seconds the job lost to this node: per step, its slowest rank's time over the reference, when that
    rank was the job's slowest and at or above the margin."""


class NodeRead(Protocol):
    """One node's ranks as columns, one tuple per field (a compact report's RankColumns is one): what the
    watch reads of each rank, without an object per rank."""

    @property
    def node(self) -> str: ...
    @property
    def rank(self) -> tuple[int, ...]: ...
    @property
    def step(self) -> tuple[int, ...]: ...
    @property
    def at(self) -> tuple[float, ...]: ...
    @property
    def pid(self) -> tuple[int, ...]: ...
    @property
    def compute_s(self) -> tuple[float, ...]: ...
    @property
    def compute_steps(self) -> tuple[int, ...]: ...


class _Read(NamedTuple):
    """A run of progress records of one node, as columns (`observe` of records)."""

    node: str
    rank: tuple[int, ...]
    step: tuple[int, ...]
    at: tuple[float, ...]
    pid: tuple[int, ...]
    compute_s: tuple[float, ...]
    compute_steps: tuple[int, ...]


class _Samples(NamedTuple):
    """The samples of a run of nodes in one read, flat: node i's are at [bounds[i], bounds[i + 1])."""

    nodes: list[str]
    bounds: list[int]
    rank: list[int]
    seconds: list[float]
    steps: list[int]
    at_step: list[int]


def _normal(stats: RankStats) -> bool:
    """Whether a rank's streak fields are all at rest (no streak, not a straggler): most ranks, most of the time."""
    return not stats.slow_steps and stats.slow_since_step is None and stats.slow_until_step is None \
        and not stats.slow_ratios and not stats.straggler


@dataclass(frozen=True)
class StragglerWatch:
    """The straggler watch of one launched step, carried from one poll to the next.

    Each poll: `watch = watch.observe(read_progress(job_dir)[0])` (or `observe_nodes` of the nodes' rank
    columns), then `watch.found` are the nodes that became stragglers in that poll and `watch.nodes` every
    node's numbers (for status).

    At 12,500 nodes a read has 100,000 ranks: what the watch keeps of each rank is held as one dict per field
    (rank → value), filled a node at a time from columns, and a RankStats is kept only for a rank with a
    streak (`streaks`): no object is made per rank and read.
    """

    policy: StragglerPolicy
    started_at: float = 0.0
    previous_pid: Mapping[int, int] = field(default_factory=dict)
    previous_compute_s: Mapping[int, float] = field(default_factory=dict)
    previous_compute_steps: Mapping[int, int] = field(default_factory=dict)
    previous_step: Mapping[int, int] = field(default_factory=dict)
    """Each rank's latest record read (since the launch): its process, counters and step."""
    rank_node: Mapping[int, str] = field(default_factory=dict)
    rank_seconds: Mapping[int, float] = field(default_factory=dict)
    rank_ratio: Mapping[int, float] = field(default_factory=dict)
    rank_clear_steps: Mapping[int, int] = field(default_factory=dict)
    """Each sampled rank's node, latest time per step and ratio, and steps back to normal (RankStats' fields)."""
    streaks: Mapping[int, RankStats] = field(default_factory=dict)
    """The ranks in a streak or stragglers, whole (their RankStats)."""
    nodes: Mapping[str, NodeStats] = field(default_factory=dict)
    reference: float | None = None
    """The job's reference compute time per step in the latest sample (lower median over its ranks)."""
    found: tuple[StragglerFound, ...] = ()
    """The nodes that became stragglers in the latest poll, as measured: the watch reads no clock and
    knows no job, so `at`, `job_id` and what was done are filled in by whoever acts on them
    (launcher/shared/straggler_actions.py)."""

    @classmethod
    def start(cls, policy: StragglerPolicy, started_at: float = 0.0) -> StragglerWatch:
        """A watch for a step launched at `started_at` (epoch s): earlier reports belong to an earlier launch."""
        return cls(policy, started_at)

    @property
    def ranks(self) -> dict[int, RankStats]:
        """Every sampled rank's streaks (made on each call: for tests and tools, not for each read)."""
        streaks = self.streaks
        return {rank: streaks.get(rank) or RankStats(rank, node, self.rank_seconds[rank], self.rank_ratio[rank],
                                                     clear_steps=self.rank_clear_steps[rank])
                for rank, node in self.rank_node.items()}

    @property
    def step(self) -> int:
        """The highest step among the ranks' latest records (0: none read)."""
        return max(self.previous_step.values(), default=0)

    @property
    def stragglers(self) -> tuple[NodeStats, ...]:
        """The nodes that are stragglers now, slowest first."""
        return tuple(sorted((n for n in self.nodes.values() if n.straggler), key=lambda n: -(n.ratio or 0.0)))

    @property
    def slowest(self) -> NodeStats | None:
        """The node whose slowest rank took longest per step in its latest sample (None: none measured yet)."""
        return max((n for n in self.nodes.values() if n.seconds is not None), key=lambda n: n.seconds or 0.0,
                   default=None)

    @property
    def lost_s(self) -> float:
        """Seconds the job lost to slow nodes so far."""
        return sum(n.lost_s for n in self.nodes.values())

    def observe(self, records: Iterable[RankProgress]) -> StragglerWatch:
        """The watch after one read of the ranks' progress records.

        Only the records that changed since the last read need be passed: a rank whose record is the
        one read before gives no sample, and a node none of whose ranks gave one keeps its numbers."""
        return to_the_end(self.observing(records))

    def observing(self, records: Iterable[RankProgress]) -> Parts[StragglerWatch]:
        """`observe` in parts of PART_RECORDS ranks (launcher/pure/in_parts.py); returns the same watch."""
        return self.observing_nodes(_runs(records))

    def observe_nodes(self, reads: Iterable[NodeRead]) -> StragglerWatch:
        """`observe` of the same ranks given a node at a time as columns (a compact report's RankColumns), in
        the records' order: the same watch, without a record per rank."""
        return to_the_end(self.observing_nodes(reads))

    def observing_nodes(self, reads: Iterable[NodeRead]) -> Parts[StragglerWatch]:
        """`observe_nodes` in parts of about PART_RECORDS ranks; returns the same watch."""
        pids, spent, counted, steps_of = (dict(self.previous_pid), dict(self.previous_compute_s),
                                          dict(self.previous_compute_steps), dict(self.previous_step))
        sampled: list[_Samples] = []
        for group in _groups(reads):
            yield
            sampled += _sampled(group, self.started_at, self.policy.warmup_steps, pids, spent, counted, steps_of)
        unchanged = replace(self, previous_pid=pids, previous_compute_s=spent, previous_compute_steps=counted,
                            previous_step=steps_of, found=())
        first = sampled[0].nodes[0] if sampled else None
        if not sampled or all(node == first for s in sampled for node in s.nodes):
            return unchanged  # nothing to compare with: judge nothing
        yield
        reference = statistics.median_low([seconds for s in sampled for seconds in s.seconds])
        if reference <= 0:
            return unchanged
        return (yield from unchanged._judged(sampled, reference))

    def _judged(self, sampled: list[_Samples], reference: float) -> Parts[StragglerWatch]:
        """The watch after one read's samples, against the job's `reference`."""
        policy = self.policy
        clear = policy.clear_margin
        rank_node, rank_seconds, rank_ratio = dict(self.rank_node), dict(self.rank_seconds), dict(self.rank_ratio)
        rank_clear, streaks = dict(self.rank_clear_steps), dict(self.streaks)
        changed: dict[str, list[int]] = {}
        """The nodes whose numbers change (a rank sampled, or one that left for another node), and those ranks."""
        steps: dict[str, int] = {}
        moved = False
        for s in sampled:
            yield
            ranks, steps_taken = s.rank, s.steps
            ratios = list(map(truediv, s.seconds, repeat(reference)))
            on = list(chain.from_iterable(map(repeat, s.nodes, map(sub, s.bounds[1:], s.bounds))))
            held_on = list(map(rank_node.get, ranks))
            if held_on != on:
                for held_node, node in zip(held_on, on):
                    if held_node is not None and held_node != node:
                        moved = True
                        changed.setdefault(held_node, [])
            if max(ratios) < clear and (not streaks or streaks.keys().isdisjoint(ranks)):
                # Most reads: every rank back to (or still) normal, in a few passes over the columns.
                rank_clear.update(zip(ranks, map(add, map(rank_clear.get, ranks, repeat(0)), steps_taken)))
            else:
                for rank, node, seconds, ratio, taken, at_step in zip(ranks, on, s.seconds, ratios, steps_taken,
                                                                      s.at_step):
                    held = streaks.get(rank)
                    if ratio < clear and (held is None or not held.straggler):
                        rank_clear[rank] = (held.clear_steps if held is not None else rank_clear.get(rank, 0)) + taken
                        if held is not None:
                            del streaks[rank]
                        continue
                    if held is None and rank in rank_node:
                        held = RankStats(rank, rank_node[rank], rank_seconds[rank], rank_ratio[rank],
                                         clear_steps=rank_clear[rank])
                    stats = _advance(held, rank, node, seconds, taken, at_step, reference, policy)
                    if _normal(stats):
                        rank_clear[rank] = stats.clear_steps
                        streaks.pop(rank, None)
                    else:
                        streaks[rank] = stats
            rank_node.update(zip(ranks, on))
            rank_seconds.update(zip(ranks, s.seconds))
            rank_ratio.update(zip(ranks, ratios))
            bounds = s.bounds
            for index, node in enumerate(s.nodes):
                start, end = bounds[index], bounds[index + 1]
                members = changed.get(node)
                if members is None:
                    changed[node] = ranks[start:end]
                else:
                    members.extend(ranks[start:end])
                most = max(steps_taken[start:end])
                if most > steps.get(node, 0):
                    steps[node] = most
        watch = replace(self, rank_node=rank_node, rank_seconds=rank_seconds, rank_ratio=rank_ratio,
                        rank_clear_steps=rank_clear, streaks=streaks, reference=reference)
        nodes, found = yield from watch._nodes(sampled, reference, changed, steps, moved)
        return replace(watch, nodes=nodes, found=found)

    def _nodes(self, sampled: list[_Samples], reference: float, changed: dict[str, list[int]],
               steps: Mapping[str, int], moved: bool) -> Parts[tuple[dict[str, NodeStats], tuple[StragglerFound, ...]]]:
        # The job waits for its slowest rank in every collective: that rank's excess is the time lost (the
        # first of the slowest, in the read's order).
        slowest, slowest_s = sampled[0], max(sampled[0].seconds)
        for s in sampled:
            most = max(s.seconds)
            if most > slowest_s:
                slowest, slowest_s = s, most
        at = slowest.seconds.index(slowest_s)
        node_at = bisect_right(slowest.bounds, at) - 1
        lost = {slowest.nodes[node_at]: slowest.steps[at] * (slowest_s - reference)} \
            if slowest_s >= self.policy.margin * reference else {}
        rank_node, rank_ratio, streaks = self.rank_node, self.rank_ratio, self.streaks
        before_nodes = self.nodes
        nodes = dict(before_nodes)
        found = []
        for count, node in enumerate(sorted(changed), 1):
            if count % (PART_RECORDS // 8) == 0:
                yield
            before = before_nodes.get(node) or NodeStats(node)
            members = changed[node]
            group: Sequence[int] = before.ranks if tuple(members) == before.ranks \
                else sorted(set(members).union(before.ranks))
            if moved:
                group = [rank for rank in group if rank_node.get(rank) == node]
            if not group:
                nodes.pop(node, None)  # every rank it had moved to another node (or it had none yet)
                continue
            # The first of the highest ratio, and of the longest streak (as max gives).
            worst = max(group, key=rank_ratio.__getitem__)
            held = [streaks[rank] for rank in group if rank in streaks] if streaks else []
            slow = max(held, key=lambda r: r.slow_steps, default=None)
            slow_steps = slow.slow_steps if slow is not None else 0
            slow_ranks = [r for r in held if r.straggler]
            stats = NodeStats(node, tuple(group), self.rank_seconds[worst], rank_ratio[worst],
                              before.steps + steps.get(node, 0), slow_steps, bool(slow_ranks),
                              before.lost_s + lost.get(node, 0.0))
            if stats.straggler and not before.straggler:
                found.append(_straggler(stats, slow_ranks, reference, self.policy))
            nodes[node] = stats
        if len(nodes) != len(before_nodes) or any(node not in before_nodes for node in changed):
            nodes = dict(sorted(nodes.items()))  # by name, as status shows them
        return nodes, tuple(found)


def _runs(records: Iterable[RankProgress]) -> Iterator[_Read]:
    """The records as runs of one node's ranks, in their order (a rank twice in a row starts a new run)."""
    run: list[RankProgress] = []
    seen: set[int] = set()
    for record in records:
        if run and (record.node != run[0].node or record.rank in seen):
            yield _as_read(run)
            run, seen = [], set()
        run.append(record)
        seen.add(record.rank)
    if run:
        yield _as_read(run)


def _unique_runs(read: NodeRead) -> Iterator[_Read]:
    """A node's columns that name a rank twice, as runs that name each rank once (read one after the other)."""
    start, seen = 0, set[int]()
    for index, rank in enumerate(read.rank):
        if rank in seen:
            yield _slice(read, start, index)
            start, seen = index, set()
        seen.add(rank)
    yield _slice(read, start, len(read.rank))


def _slice(read: NodeRead, start: int, end: int) -> _Read:
    return _Read(read.node, read.rank[start:end], read.step[start:end], read.at[start:end], read.pid[start:end],
                 read.compute_s[start:end], read.compute_steps[start:end])


def _as_read(run: list[RankProgress]) -> _Read:
    return _Read(run[0].node, tuple(r.rank for r in run), tuple(r.step for r in run), tuple(r.at for r in run),
                 tuple(r.pid for r in run), tuple(r.compute_s for r in run), tuple(r.compute_steps for r in run))


def _groups(reads: Iterable[NodeRead]) -> Iterator[list[NodeRead]]:
    """The reads in groups of about PART_RECORDS ranks (a part of the work each), a rank named once in each."""
    group: list[NodeRead] = []
    count = 0
    for read in reads:
        parts: Iterable[NodeRead] = (read,) if len(set(read.rank)) == len(read.rank) else _unique_runs(read)
        for part in parts:
            group.append(part)
            count += len(part.rank)
        if count >= PART_RECORDS:
            yield group
            group, count = [], 0
    if group:
        yield group


def _sampled(reads: list[NodeRead], started_at: float, warmup: int, pids: dict[int, int], spent: dict[int, float],
             counted: dict[int, int], steps_of: dict[int, int]) -> list[_Samples]:
    """The samples of a group of node reads, their ranks' latest counters kept in the dicts (see `_sample`): one
    run of samples, or several when a rank was sampled on two nodes."""
    ranks = list(chain.from_iterable(read.rank for read in reads))
    pid = list(chain.from_iterable(read.pid for read in reads))
    if ranks and len(set(ranks)) == len(ranks) and list(map(pids.get, ranks)) == pid \
            and min(chain.from_iterable(read.at for read in reads)) >= started_at:
        # Most reads: the same processes as before, every rank read after the launch, each rank once: a few
        # passes over the columns.
        before = list(map(counted.__getitem__, ranks))
        compute_s = list(chain.from_iterable(read.compute_s for read in reads))
        compute_steps = list(chain.from_iterable(read.compute_steps for read in reads))
        grown = list(map(sub, compute_steps, before))
        seconds = list(map(sub, compute_s, map(spent.__getitem__, ranks)))
        if min(before) >= warmup and min(grown) > 0 and min(seconds) >= 0:
            step = list(chain.from_iterable(read.step for read in reads))
            pids.update(zip(ranks, pid))
            spent.update(zip(ranks, compute_s))
            counted.update(zip(ranks, compute_steps))
            steps_of.update(zip(ranks, step))
            return [_Samples([read.node for read in reads], [0, *accumulate(len(read.rank) for read in reads)], ranks,
                             list(map(truediv, seconds, grown)), grown, step)]
    # Rank by rank; a rank sampled twice (on two nodes) starts a new run of samples, so that each run names a
    # rank once and runs are judged one after the other, as the records came.
    runs = [_Samples([], [0], [], [], [], [])]
    named: set[int] = set()
    for read in reads:
        node = _sample(read, started_at, warmup, pids, spent, counted, steps_of)
        if node is None:
            continue
        if not named.isdisjoint(node[0]):
            runs.append(_Samples([], [0], [], [], [], []))
            named = set()
        named.update(node[0])
        run = runs[-1]
        run.nodes.append(read.node)
        run.bounds.append(run.bounds[-1] + len(node[0]))
        run.rank.extend(node[0])
        run.seconds.extend(node[1])
        run.steps.extend(node[2])
        run.at_step.extend(node[3])
    return [run for run in runs if run.rank]


def _sample(read: NodeRead, started_at: float, warmup: int, pids: dict[int, int], spent: dict[int, float],
            counted: dict[int, int], steps_of: dict[int, int]) -> tuple[list[int], list[float], list[int], list[int]] | None:
    """One node's samples of a read, rank by rank (None: no rank gave one), its ranks' latest counters kept
    in the dicts.

    A rank's sample is its compute time per step since its previous record, once it is past its warm-up;
    a new process (a restarted rank) starts its counters again; a record from before the launch is skipped."""
    picked: tuple[list[int], list[float], list[int], list[int]] = ([], [], [], [])
    for rank, step, at, process, seconds_now, steps_now in zip(read.rank, read.step, read.at, read.pid,
                                                              read.compute_s, read.compute_steps):
        if at < started_at:
            continue
        before_pid, before_s, before_steps = pids.get(rank), spent.get(rank), counted.get(rank)
        pids[rank], spent[rank], counted[rank], steps_of[rank] = process, seconds_now, steps_now, step
        if before_pid != process or before_steps is None or before_s is None or before_steps < warmup:
            continue
        grown, seconds = steps_now - before_steps, seconds_now - before_s
        if grown > 0 and seconds >= 0:
            picked[0].append(rank)
            picked[1].append(seconds / grown)
            picked[2].append(grown)
            picked[3].append(step)
    return picked if picked[0] else None


def _advance(stats: RankStats | None, rank: int, node: str, seconds: float, steps: int, at_step: int,
             reference: float, policy: StragglerPolicy) -> RankStats:
    """One rank's streaks after one sample (None: its first).  One RankStats made per call, never a
    `replace` chain."""
    ratio = seconds / reference
    if stats is None:
        stats = RankStats(rank, node)
    if ratio >= policy.margin:
        # The first slow read of a streak may cover steps from before the slowdown began (a blip
        # starting mid-read reads as slow for the whole read): its steps do not count towards the window.
        streak = stats.slow_since_step is not None
        since = stats.slow_since_step if streak else max(0, at_step - steps + 1)
        slow_steps = stats.slow_steps + steps if streak else 0
        return RankStats(rank, node, seconds, ratio, slow_steps, since, at_step,
                         (*stats.slow_ratios, ratio)[-64:], 0,
                         stats.straggler or slow_steps >= policy.window_steps)
    if ratio < policy.clear_margin:
        clear_steps = stats.clear_steps + steps
        return RankStats(rank, node, seconds, ratio, 0, None, None, (), clear_steps,
                         stats.straggler and clear_steps < policy.window_steps)
    # Between the two margins: neither extends a streak nor ends one.
    return RankStats(rank, node, seconds, ratio, stats.slow_steps, stats.slow_since_step,
                     stats.slow_until_step, stats.slow_ratios, stats.clear_steps, stats.straggler)


def _straggler(node: NodeStats, slow: list[RankStats], reference: float,
               policy: StragglerPolicy) -> StragglerFound:
    ratios = [ratio for r in slow for ratio in r.slow_ratios]
    ratio = statistics.median(ratios) if ratios else (node.ratio or 0.0)
    since = min((r.slow_since_step for r in slow if r.slow_since_step is not None), default=0)
    until = max((r.slow_until_step for r in slow if r.slow_until_step is not None), default=since)
    steps = until - since + 1
    seconds = max((r.seconds or 0.0) for r in slow)
    ranks = ranks_text(r.rank for r in slow)
    evidence = (f"{ranks} on {node.node} computed {_s(seconds)} s per step against the job's {_s(reference)} s "
                f"({ratio:.2f}x, median over the slow stretch) for {steps} steps from step {since}; "
                f"a straggler after {policy.window_steps} steps at {policy.margin:g}x or more; "
                f"{_s(node.lost_s)} s lost so far")
    return StragglerFound(at=0.0, job_id="", node=node.node, ranks=tuple(sorted(r.rank for r in slow)),
                          ratio=round(ratio, 3), seconds=round(seconds, 6), reference=round(reference, 6), steps=steps,
                          since_step=since, lost_s=round(node.lost_s, 3), evidence=(evidence,))


def _s(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
