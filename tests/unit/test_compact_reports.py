"""The agent reading compact reports (version 5: the ranks' columns packed) judges exactly as it did reading
one JSON object per rank: the same signals, stragglers and hang verdicts, heartbeat after heartbeat; and the
straggler watch fed the nodes' rank columns (as the agent feeds it, no record per rank) says what the
record-at-a-time watch said, on any sequence of heartbeats."""

from __future__ import annotations

import hashlib
import hmac
import json
import statistics
from typing import Any, NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.launcher.pure.hang_watch import HangPolicy, HangWatch
from clusterctl.launcher.pure.node_signals import NodeSignals, SignalPolicy
from clusterctl.launcher.pure.straggler_watch import StragglerPolicy, StragglerWatch
from clusterctl.records.node_report import (
    MAGIC, RANK_COLUMNS, NodeHealth, NodeReport, RankBeat, RankColumns, decode, encode,
)
from clusterctl.records.rank_progress import RankProgress

KEY = bytes(range(32))
T0 = 1_800_000_000.0
RANKS = 4


def as_version_4(report: NodeReport) -> bytes:
    """`report` as a version-4 reporter signed it: all JSON, one object per rank (what the agent read before)."""
    body = report.to_json()
    columns = body["ranks"]
    body["ranks"] = [dict(zip(RANK_COLUMNS, values)) for values in zip(*(columns[name] for name in RANK_COLUMNS))]
    body["version"] = 4
    raw = json.dumps(body, separators=(",", ":")).encode()
    return MAGIC + hmac.digest(KEY, raw, hashlib.sha256) + raw


def heartbeat(index: int, beat: int, speed: float, frozen_at: int | None, drained_at: int | None) -> NodeReport:
    """Node `index`'s report at heartbeat `beat` (10 s each): its ranks compute `speed` s per step at one
    step a second; from `frozen_at` on its processes are stopped; from `drained_at` on healthd drains it."""
    node = f"gpu{index:03d}"
    now = T0 + 10.0 * beat
    frozen = frozen_at is not None and beat >= frozen_at
    stopped_since = T0 + 10.0 * frozen_at if frozen and frozen_at is not None else 0.0
    step = 10 * (min(beat, frozen_at) if frozen and frozen_at is not None else beat)
    beats = tuple(RankBeat(RankProgress(index * RANKS + r, node, step, "step", T0 + step, 1000 + r,
                                        round(speed * step, 6), step, stopped_since or now),
                           "stopped" if frozen else "running", stopped_since)
                  for r in range(RANKS))
    drained = drained_at is not None and beat >= drained_at
    return NodeReport("42", "0", node, beat + 1, now, beats,
                      NodeHealth("drain" if drained else "ok", ("healthd: drained",) if drained else (), now))


def watched(speeds: list[float], frozen: list[int | None], drained: list[int | None], compact: bool) -> list[tuple[Any, ...]]:
    """What the agent's watches say after each of 16 heartbeats of these nodes' reports, read from compact
    datagrams (`compact`) or from version-4 JSON ones."""
    nodes = [f"gpu{i:03d}" for i in range(len(speeds))]
    policy = SignalPolicy(heartbeat=10.0, silent_after=32.0, startup_grace=120.0, stopped_grace=1.0)
    expected = {r: node for i, node in enumerate(nodes) for r in range(i * RANKS, (i + 1) * RANKS)}
    signals = NodeSignals.start(policy, "42", "0", nodes, T0 - 1.0)
    hangs = HangWatch.start(HangPolicy(), T0 - 1.0, expected)
    stragglers = StragglerWatch.start(StragglerPolicy(), T0 - 1.0)
    seen: list[tuple[Any, ...]] = []
    for beat in range(16):
        now = T0 + 10.0 * beat + 0.5
        reports = [heartbeat(i, beat, speed, frozen[i], drained[i]) for i, speed in enumerate(speeds)]
        signals = signals.observe([decode(encode(r, KEY) if compact else as_version_4(r), KEY, "test")
                                   for r in reports], now)
        if compact:  # as the agent feeds them now: the straggler watch reads the nodes' columns
            signals, columns = signals.take_fresh_columns()
            records = tuple(progress for ranks in columns for progress in ranks.progress())
            hangs, stragglers = hangs.observe(records), stragglers.observe_nodes(columns)
        else:
            signals, records = signals.take_fresh()
            hangs, stragglers = hangs.observe(records), stragglers.observe(records)
        seen.append((signals.judge(now), hangs.verdict(now), stragglers.found, stragglers.nodes, signals.records()))
    return seen


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=3, max_size=6), st.data())
def test_compact_and_json_reports_give_the_watches_the_same_verdicts(speeds: list[float], data: st.DataObject) -> None:
    frozen = data.draw(st.lists(st.none() | st.integers(3, 12), min_size=len(speeds), max_size=len(speeds)))
    drained = data.draw(st.lists(st.none() | st.integers(3, 12), min_size=len(speeds), max_size=len(speeds)))
    assert watched(speeds, frozen, drained, compact=True) == watched(speeds, frozen, drained, compact=False)


def test_a_slow_node_a_frozen_node_and_a_drained_node_are_named_alike_from_either_format() -> None:
    speeds, frozen, drained = [1.0, 1.0, 1.0, 1.6, 1.0], [None, None, 9, None, None], [None, 5, None, None, None]
    new, old = watched(speeds, frozen, drained, compact=True), watched(speeds, frozen, drained, compact=False)
    assert new == old
    assert any(node.node == "gpu003" for _, _, found, _, _ in new for node in found)
    last = new[-1][0]
    assert last.frozen is not None and [s.node for s in last.frozen.suspects] == ["gpu002"]
    assert last.drained == ("gpu001",)


# ---- the straggler watch fed columns against the record-at-a-time watch (7aa7098), kept as its specification ----

class Streak(NamedTuple):
    node: str
    seconds: float
    ratio: float
    slow_steps: int = 0
    since: int | None = None
    until: int | None = None
    ratios: tuple[float, ...] = ()
    clear_steps: int = 0
    straggler: bool = False


class Spec:
    """The straggler watch as it was, one record at a time: what a rank's sample is, how its streak moves,
    and what each node shows; the watch fed columns must say the same."""

    def __init__(self, policy: StragglerPolicy, started_at: float) -> None:
        self.policy, self.started_at = policy, started_at
        self.previous: dict[int, RankProgress] = {}
        self.ranks: dict[int, Streak] = {}
        self.nodes: dict[str, tuple[Any, ...]] = {}
        self.reference: float | None = None
        self.found: list[tuple[str, tuple[int, ...]]] = []

    def observe(self, records: list[RankProgress]) -> None:
        policy, samples = self.policy, []
        self.found = []
        for record in records:
            if record.at < self.started_at:
                continue
            before, self.previous[record.rank] = self.previous.get(record.rank), record
            if before is None or before.pid != record.pid or before.compute_steps < policy.warmup_steps:
                continue
            grown, seconds = record.compute_steps - before.compute_steps, record.compute_s - before.compute_s
            if grown > 0 and seconds >= 0:
                samples.append((record.node, record.rank, seconds / grown, grown, record.step))
        if not samples or len({s[0] for s in samples}) == 1:
            return
        reference = statistics.median_low(s[2] for s in samples)
        if reference <= 0:
            return
        self.reference = reference
        changed: dict[str, set[int]] = {}
        steps: dict[str, int] = {}
        for node, rank, seconds, taken, at_step in samples:
            held = self.ranks.get(rank)
            if held is not None and held.node != node:
                changed.setdefault(held.node, set())
            self.ranks[rank] = advance(held, node, seconds, taken, at_step, reference, policy)
            changed.setdefault(node, set()).add(rank)
            steps[node] = max(steps.get(node, 0), taken)
        slowest = max(samples, key=lambda s: s[2])
        lost = {slowest[0]: slowest[3] * (slowest[2] - reference)} if slowest[2] >= policy.margin * reference else {}
        for node in sorted(changed):
            before = self.nodes.get(node) or (node, (), None, None, 0, 0, False, 0.0)
            group = [r for r in sorted(changed[node].union(before[1])) if self.ranks[r].node == node]
            if not group:
                self.nodes.pop(node, None)
                continue
            worst = max(group, key=lambda r: self.ranks[r].ratio)
            straggler = any(self.ranks[r].straggler for r in group)
            self.nodes[node] = (node, tuple(group), self.ranks[worst].seconds, self.ranks[worst].ratio,
                                before[4] + steps.get(node, 0), max(self.ranks[r].slow_steps for r in group),
                                straggler, before[7] + lost.get(node, 0.0))
            if straggler and not before[6]:
                self.found.append((node, tuple(r for r in group if self.ranks[r].straggler)))
        self.nodes = dict(sorted(self.nodes.items()))


def advance(held: Streak | None, node: str, seconds: float, steps: int, at_step: int, reference: float,
            policy: StragglerPolicy) -> Streak:
    ratio = seconds / reference
    held = held or Streak(node, seconds, ratio)
    if ratio >= policy.margin:
        streak = held.since is not None
        slow_steps = held.slow_steps + steps if streak else 0
        return Streak(node, seconds, ratio, slow_steps, held.since if streak else max(0, at_step - steps + 1),
                      at_step, (*held.ratios, ratio)[-64:], 0, held.straggler or slow_steps >= policy.window_steps)
    if ratio < policy.clear_margin:
        clear = held.clear_steps + steps
        return Streak(node, seconds, ratio, clear_steps=clear, straggler=held.straggler and clear < policy.window_steps)
    return held._replace(node=node, seconds=seconds, ratio=ratio)


EVENTS = st.sampled_from(["ok"] * 10 + ["restart", "stall", "before the launch", "silent", "moves", "twice"])


def as_columns(records: list[RankProgress]) -> list[RankColumns]:
    """The records as the nodes' reports would carry them: each run of one node's records, as columns."""
    runs: list[list[RankProgress]] = []
    for record in records:
        if not runs or runs[-1][0].node != record.node:
            runs.append([])
        runs[-1].append(record)
    return [RankColumns(run[0].node, *(tuple(getattr(r, name) for r in run) for name in (
        "rank", "step", "phase", "at", "pid", "compute_s", "compute_steps", "alive_at")),
        ("running",) * len(run), (0.0,) * len(run)) for run in runs]


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.integers(1, 4), st.integers(0, 3), st.data())
def test_the_straggler_watch_fed_columns_says_what_the_record_at_a_time_watch_said(
        nodes: int, per_node: int, window: int, warmup: int, data: st.DataObject) -> None:
    policy = StragglerPolicy(margin=1.2, window_steps=window, warmup_steps=warmup)
    spec, watch = Spec(policy, T0), StragglerWatch.start(policy, T0)
    ranks = {r: [f"gpu{r // per_node}", 1, 0.0, 0, 0] for r in range(nodes * per_node)}  # node, pid, s, steps, step
    for beat in range(data.draw(st.integers(1, 14))):
        records = []
        for index in data.draw(st.permutations(range(nodes))):
            for rank in [r for r, held in ranks.items() if held[0] == f"gpu{index}"]:
                held, event = ranks[rank], data.draw(EVENTS)
                speed = data.draw(st.sampled_from([1.0, 1.0, 0.9, 1.1, 1.15, 1.3, 2.0, 0.0]))
                if event == "silent":
                    continue
                if event == "restart":
                    held[1:4] = [held[1] + 1, 0.0, 0]
                grown = 0 if event == "stall" else data.draw(st.integers(1, 3))
                held[2], held[3], held[4] = round(held[2] + speed * grown, 6), held[3] + grown, held[4] + grown
                at = T0 - 50.0 if event == "before the launch" else T0 + beat
                records += [RankProgress(rank, held[0], held[4], "step", at, held[1], held[2], held[3], at)] * (
                    2 if event == "twice" else 1)
                if event == "moves":
                    held[0] = f"gpu{data.draw(st.integers(0, nodes - 1))}"
        spec.observe(records)
        watch = watch.observe_nodes(as_columns(records))
        assert watch.reference == spec.reference
        assert {node: tuple(stats) for node, stats in watch.nodes.items()} == spec.nodes
        assert list(watch.nodes) == list(spec.nodes)
        assert [(found.node, found.ranks) for found in watch.found] == spec.found
        assert {rank: (s.node, s.seconds, s.ratio, s.slow_steps, s.slow_since_step, s.slow_until_step, s.slow_ratios,
                       s.clear_steps, s.straggler) for rank, s in watch.ranks.items()} == \
            {rank: tuple(s) for rank, s in spec.ranks.items()}


def test_two_nodes_equally_slow_lose_time_to_the_one_read_first_as_before() -> None:
    policy = StragglerPolicy(margin=1.2, window_steps=2, warmup_steps=0)
    spec, watch = Spec(policy, T0), StragglerWatch.start(policy, T0)
    speeds = {"gpu002": 2.0, "gpu000": 1.0, "gpu001": 2.0, "gpu003": 1.0, "gpu004": 1.0}  # read in this order
    for beat in range(1, 6):
        records = [RankProgress(index, node, 10 * beat, "step", T0 + beat, 7, speed * 10 * beat, 10 * beat)
                   for index, (node, speed) in enumerate(speeds.items())]
        spec.observe(records)
        watch = watch.observe_nodes(as_columns(records))
        assert {node: tuple(stats) for node, stats in watch.nodes.items()} == spec.nodes
    assert watch.nodes["gpu002"].lost_s > 0 and watch.nodes["gpu001"].lost_s == 0
