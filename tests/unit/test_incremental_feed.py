"""The agent feeds its hang and straggler watches only the records of the nodes heard from since the last
feed, in parts, and judges the same as if it fed every rank's record whole every time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.launcher.pure.hang_watch import HangPolicy, HangWatch, judge
from clusterctl.launcher.pure.in_parts import PART_RECORDS, next_part, to_the_end
from clusterctl.launcher.pure.node_signals import NodeSignals, SignalPolicy
from clusterctl.launcher.pure.straggler_watch import StragglerPolicy, StragglerWatch
from clusterctl.records.node_report import NodeHealth, NodeReport, RankBeat
from clusterctl.records.rank_progress import RankProgress

T0 = 1795305600.0
NODES = ("node1", "node2", "node3", "node4", "node5")
RANKS = 2
HANGS = HangPolicy(startup_timeout=40.0, checkpoint_timeout=30.0, min_step_timeout=6.0, warmup_steps=1,
                   silence_gap=2.0, liveness_gap=1.0)
STRAGGLERS = StragglerPolicy(action="report", margin=1.2, window_steps=4, warmup_steps=1)

# One node's report: (node index, steps it advanced, compute seconds per step, phase, seconds of silence).
reports_strategy = st.tuples(st.integers(0, len(NODES) - 1), st.integers(0, 3), st.sampled_from([0.2, 0.21, 0.3, 0.5]),
                             st.sampled_from(["step", "step", "step", "checkpoint-save"]), st.integers(0, 8))
# A poll: the reports that arrive, and whether a heartbeat's feed follows it.
polls_strategy = st.lists(st.tuples(st.lists(reports_strategy, max_size=4), st.booleans()), min_size=1, max_size=30)


def node_report(node: str, seq: int, at: float, step: int, compute: float, phase: str) -> NodeReport:
    first = NODES.index(node) * RANKS
    beats = tuple(RankBeat(RankProgress(rank, node, step, phase, at, 100 + rank, compute, step, at), "running", 0.0)
                  for rank in range(first, first + RANKS))
    return NodeReport("42", "0", node, seq, at, beats, NodeHealth("ok", (), at))


def expected_ranks() -> dict[int, str]:
    return {NODES.index(node) * RANKS + r: node for node in NODES for r in range(RANKS)}


@settings(max_examples=150, deadline=None)
@given(polls_strategy)
def test_feeding_only_the_fresh_nodes_in_parts_judges_as_feeding_every_record_whole(polls):
    signals = NodeSignals.start(SignalPolicy(), "42", "0", NODES, T0)
    whole = (HangWatch.start(HANGS, T0, expected_ranks()), StragglerWatch.start(STRAGGLERS, T0))
    fresh = whole
    state = {node: [0, 0, 0.0] for node in NODES}  # seq, step, compute so far
    now = T0
    for arrived, feed in polls:
        now += 1.0
        reports = []
        for index, steps, seconds, phase, silence in arrived:
            node = NODES[index]
            seq, step, compute = state[node]
            state[node] = [seq + 1, step + steps, compute + steps * seconds]
            reports.append(node_report(node, seq + 1, now - silence, step + steps, compute + steps * seconds, phase))
        signals = signals.observe(reports, now)
        if not feed:
            continue
        everything = signals.records()
        whole = (whole[0].observe(everything), whole[1].observe(everything))
        signals, changed = signals.take_fresh()
        fresh = (to_the_end(fresh[0].observing(changed)), to_the_end(fresh[1].observing(changed)))
        assert fresh[0] == whole[0]
        assert (fresh[1].found, fresh[1].nodes, fresh[1].reference) == (whole[1].found, whole[1].nodes,
                                                                         whole[1].reference)
        for later in (0.0, 5.0, 20.0, 60.0):
            assert fresh[0].verdict(now + later) == whole[0].verdict(now + later)


@settings(max_examples=150, deadline=None)
@given(polls_strategy, st.floats(0.0, 120.0))
def test_the_watch_s_quick_look_never_misses_a_hang_the_full_judgement_finds(polls, later):
    watch = HangWatch.start(HANGS, T0, expected_ranks())
    now = T0
    step = 0
    for arrived, _ in polls:
        now += 1.0
        step += 1
        records = [RankProgress(NODES.index(NODES[i]) * RANKS + r, NODES[i], step + s, phase, now - silence, 7, 0.0,
                                step, now - silence)
                   for i, s, _, phase, silence in arrived for r in range(RANKS)]
        watch = watch.observe(records)
    full = judge(watch.latest.values(), HANGS, now + later, T0, expected_ranks=watch.expected_ranks,
                 step_times=watch.step_times, first_steps=watch.first_steps, logged=watch.logged)
    assert watch.verdict(now + later) == full


def test_a_large_feed_pauses_between_parts_and_ends_as_the_whole_feed():
    records = [RankProgress(rank, f"node{rank // 8}", 120, "step", T0 + 10, 100, 0.4 * 120, 120, T0 + 10)
               for rank in range(3 * PART_RECORDS)]
    later = [RankProgress(r.rank, r.node, 140, "step", T0 + 30, 100, r.compute_s + 20 * (0.6 if r.rank < 8 else 0.4),
                          140, T0 + 30) for r in records]
    stragglers = StragglerWatch.start(StragglerPolicy(warmup_steps=1), T0).observe(records)
    parts = stragglers.observing(later)
    pauses = 0
    while True:
        finished, watch = next_part(parts)
        if finished:
            break
        pauses += 1
    assert pauses >= 3
    assert watch == stragglers.observe(later)
    assert watch is not None and round(watch.nodes["node0"].ratio or 0.0, 6) == 1.5
