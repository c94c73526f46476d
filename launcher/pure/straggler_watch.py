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
file: the caller passes the progress records in, each poll.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

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


@dataclass(frozen=True)
class NodeStats:
    """What the watch knows of one node: its slowest rank's latest numbers, its streak, the time it cost."""

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


class _Sample(NamedTuple):
    """One rank's compute time per step between two reads (a tuple: 100,000 are made per read)."""

    node: str
    rank: int
    seconds: float
    steps: int
    at_step: int


@dataclass(frozen=True)
class StragglerWatch:
    """The straggler watch of one launched step, carried from one poll to the next.

    Each poll: `watch = watch.observe(read_progress(job_dir)[0])`, then `watch.found` are the nodes
    that became stragglers in that poll and `watch.nodes` every node's numbers (for status).
    """

    policy: StragglerPolicy
    started_at: float = 0.0
    previous: Mapping[int, RankProgress] = field(default_factory=dict)
    ranks: Mapping[int, RankStats] = field(default_factory=dict)
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
        previous = dict(self.previous)
        samples: list[_Sample] = []
        policy = self.policy
        started_at, warmup = self.started_at, policy.warmup_steps
        # 100,000 records a heartbeat at 12,500 nodes: the sample is taken inline, not in a call per record.
        for count, record in enumerate(records, 1):
            if count % PART_RECORDS == 0:
                yield
            if record.at < started_at:
                continue
            rank = record.rank
            before = previous.get(rank)
            previous[rank] = record
            # The compute time per step since the rank's previous record, once it is past its warm-up; a
            # new process (a restarted rank) starts its counters again.
            if before is None or before.pid != record.pid or before.compute_steps < warmup:
                continue
            grown = record.compute_steps - before.compute_steps
            seconds = record.compute_s - before.compute_s
            if grown > 0 and seconds >= 0:
                samples.append(_Sample(record.node, rank, seconds / grown, grown, record.step))
        if not samples or all(s.node == samples[0].node for s in samples):
            return replace(self, previous=previous, found=())  # nothing to compare with: judge nothing
        yield
        reference = statistics.median_low(s.seconds for s in samples)
        if reference <= 0:
            return replace(self, previous=previous, found=())
        ranks = dict(self.ranks)
        changed: dict[str, set[int]] = {}
        """The nodes whose numbers change (a rank sampled, or one that left for another node), and those ranks."""
        steps: dict[str, int] = {}
        clear = policy.clear_margin
        for count, sample in enumerate(samples, 1):
            if count % PART_RECORDS == 0:
                yield
            node, rank, seconds, taken = sample.node, sample.rank, sample.seconds, sample.steps
            held = ranks.get(rank)
            if held is not None and held.node != node:
                changed.setdefault(held.node, set())
            ratio = seconds / reference
            if held is not None and ratio < clear and not held.straggler:
                # Most ranks, most of the time: back to (or still) normal; what _advance gives, without the call.
                ranks[rank] = RankStats(rank, node, seconds, ratio, 0, None, None, (), held.clear_steps + taken, False)
            else:
                ranks[rank] = _advance(held, sample, reference, policy)
            members = changed.get(node)
            if members is None:
                members = changed[node] = set()
            members.add(rank)
            if taken > steps.get(node, 0):
                steps[node] = taken
        nodes, found = yield from self._nodes(ranks, samples, reference, changed, steps)
        return replace(self, previous=previous, ranks=ranks, nodes=nodes, reference=reference, found=found)

    def _nodes(self, ranks: Mapping[int, RankStats], samples: list[_Sample], reference: float,
               changed: dict[str, set[int]],
               steps: Mapping[str, int]) -> Parts[tuple[dict[str, NodeStats], tuple[StragglerFound, ...]]]:
        # The job waits for its slowest rank in every collective: that rank's excess is the time lost.
        slowest = max(samples, key=lambda s: s.seconds)
        lost = {slowest.node: slowest.steps * (slowest.seconds - reference)} \
            if slowest.seconds >= self.policy.margin * reference else {}
        nodes = dict(self.nodes)
        found = []
        for count, node in enumerate(sorted(changed), 1):
            if count % (PART_RECORDS // 8) == 0:
                yield
            before = self.nodes.get(node) or NodeStats(node)
            members = sorted(changed[node].union(before.ranks))
            group = [stats for stats in (ranks[rank] for rank in members) if stats.node == node]
            if not group:
                del nodes[node]  # every rank it had moved to another node
                continue
            worst = slow = group[0]  # the first of the highest ratio, and of the longest streak (as max gives)
            for r in group:
                if (r.ratio or 0.0) > (worst.ratio or 0.0):
                    worst = r
                if r.slow_steps > slow.slow_steps:
                    slow = r
            stats = NodeStats(node, tuple(r.rank for r in group), worst.seconds, worst.ratio,
                              before.steps + steps.get(node, 0), slow.slow_steps, any(r.straggler for r in group),
                              before.lost_s + lost.get(node, 0.0))
            if stats.straggler and not before.straggler:
                found.append(_straggler(stats, [r for r in group if r.straggler], reference, self.policy))
            nodes[node] = stats
        if len(nodes) != len(self.nodes) or any(node not in self.nodes for node in changed):
            nodes = dict(sorted(nodes.items()))  # by name, as status shows them
        return nodes, tuple(found)


def _advance(stats: RankStats | None, sample: _Sample, reference: float, policy: StragglerPolicy) -> RankStats:
    """One rank's streaks after one sample (None: its first).  One RankStats made per call, never a
    `replace` chain: at 100,000 ranks a read's cost is mostly this."""
    ratio = sample.seconds / reference
    steps = sample.steps
    if stats is None:
        stats = RankStats(sample.rank, sample.node)
    if ratio >= policy.margin:
        # The first slow read of a streak may cover steps from before the slowdown began (a blip
        # starting mid-read reads as slow for the whole read): its steps do not count towards the window.
        streak = stats.slow_since_step is not None
        since = stats.slow_since_step if streak else max(0, sample.at_step - steps + 1)
        slow_steps = stats.slow_steps + steps if streak else 0
        return RankStats(sample.rank, sample.node, sample.seconds, ratio, slow_steps, since, sample.at_step,
                         (*stats.slow_ratios, ratio)[-64:], 0,
                         stats.straggler or slow_steps >= policy.window_steps)
    if ratio < policy.clear_margin:
        clear_steps = stats.clear_steps + steps
        return RankStats(sample.rank, sample.node, sample.seconds, ratio, 0, None, None, (), clear_steps,
                         stats.straggler and clear_steps < policy.window_steps)
    # Between the two margins: neither extends a streak nor ends one.
    return RankStats(sample.rank, sample.node, sample.seconds, ratio, stats.slow_steps, stats.slow_since_step,
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
