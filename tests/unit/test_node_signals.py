"""What a step's node reports say: frozen ranks, healthd's drains, silent nodes, and what is ignored."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, strategies as st

from clusterctl.launcher.job.signal_watch import SignalWatch
from clusterctl.launcher.pure.node_signals import NodeSignals, SignalPolicy, heartbeat_seconds, slurm_sweep_seconds
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy
from clusterctl.records.node_report import NodeHealth, NodeReport, RankBeat
from clusterctl.records.rank_progress import RankProgress

T0 = 1795305600.0
NODES = ("node1", "node2", "node3", "node4")


def report(node, seq, at, *, process="running", stopped_since=0.0, verdict="ok", launch="0", job="42", ranks=2):
    first = NODES.index(node) * ranks if node in NODES else 100
    beats = tuple(RankBeat(RankProgress(r, node, 10, "step", at, 7, alive_at=at), process, stopped_since)
                  for r in range(first, first + ranks))
    return NodeReport(job, launch, node, seq, at, beats, NodeHealth(verdict, (), at))


POLICY = SignalPolicy(heartbeat=1.0, silent_after=5.0, startup_grace=30.0, stopped_grace=1.0)


def watching():
    return NodeSignals.start(POLICY, "42", "0", NODES, T0)


def everyone(at, seq=1, **overrides):
    return [overrides.get(n) or report(n, seq, at) for n in NODES]


@given(st.integers(min_value=0, max_value=10**7))
def test_the_heartbeat_grows_with_the_step_and_stays_between_one_and_twenty_seconds(nodes):
    assert 1.0 <= heartbeat_seconds(nodes) <= 20.0
    assert heartbeat_seconds(nodes) <= heartbeat_seconds(nodes + 1000)
    assert heartbeat_seconds(12_500) == 20.0 and heartbeat_seconds(4) == 1.0


def test_small_steps_are_swept_node_by_node_and_large_ones_read_the_table_once_a_minute():
    assert slurm_sweep_seconds(4) == 1.0 and slurm_sweep_seconds(32) == 8.0
    assert slurm_sweep_seconds(12_500) == 60.0


def test_a_node_whose_ranks_are_stopped_while_the_others_run_is_frozen_once_the_grace_passed():
    stopped = report("node2", 2, T0 + 10, process="stopped", stopped_since=T0 + 9.8)
    signals = watching().observe(everyone(T0 + 10, node2=stopped), T0 + 10)
    assert signals.judge(T0 + 10).frozen is None  # stopped 0.2 s: a debugger's pause, perhaps
    verdict = signals.judge(T0 + 11).frozen
    assert verdict is not None and verdict.suspect_nodes == ("node2",) and verdict.stuck_ranks == (2, 3)
    assert "ranks 2-3 on node2 stopped stepping and also stopped running" in verdict.evidence[0]
    assert "3 other nodes run" in verdict.evidence[0]


def test_every_node_stopped_at_once_is_a_suspended_job_not_a_fault():
    reports = [report(n, 2, T0 + 10, process="stopped", stopped_since=T0) for n in NODES]
    assert watching().observe(reports, T0 + 10).judge(T0 + 20).frozen is None


def test_a_node_with_a_clock_far_ahead_cannot_make_itself_or_others_look_frozen_longer():
    # The node's clock is 1000 s ahead: only differences within its own report count.
    ahead = report("node2", 2, T0 + 1010, process="stopped", stopped_since=T0 + 1009.9)
    signals = watching().observe(everyone(T0 + 10, node2=ahead), T0 + 10)
    assert signals.judge(T0 + 10.5).frozen is None
    assert signals.judge(T0 + 11).frozen is not None


def test_healthd_s_drain_verdict_points_the_agent_at_the_node():
    drained = report("node3", 2, T0 + 10, verdict="drain")
    assert watching().observe(everyone(T0 + 10, node3=drained), T0 + 10).judge(T0 + 10).drained == ("node3",)


def test_a_node_silent_past_the_limit_is_named_and_one_never_heard_only_after_the_startup_grace():
    signals = watching().observe([report(n, 1, T0 + 1) for n in ("node1", "node2", "node3")], T0 + 1)
    assert signals.judge(T0 + 5).silent == ()
    later = signals.observe([report(n, 2, T0 + 30) for n in ("node1", "node3")], T0 + 30)
    judged = later.judge(T0 + 31)
    assert judged.silent == ("node2", "node4") and judged.reporting == 2 and judged.channel_silent == 0


def test_most_nodes_silent_at_once_is_the_channel_s_trouble_and_names_nobody():
    signals = watching().observe([report("node1", 1, T0 + 1)], T0 + 1)
    judged = signals.observe([report("node1", 2, T0 + 40)], T0 + 40).judge(T0 + 40)
    assert judged.silent == () and judged.channel_silent == 3 and judged.reporting == 1


def test_reports_of_another_job_launch_or_node_and_stale_ones_are_ignored():
    signals = watching().observe([report("node1", 5, T0 + 5)], T0 + 5)
    signals = signals.observe([report("node1", 9, T0 + 9, job="43"), report("node1", 9, T0 + 9, launch="1"),
                               report("node9", 9, T0 + 9), report("node1", 4, T0 + 4, verdict="drain")], T0 + 9)
    assert signals.ignored == 4 and signals.heard["node1"].report.seq == 5


def test_a_restarted_reporter_counting_from_one_again_is_heard_by_its_newer_send_time():
    signals = watching().observe([report("node1", 50, T0 + 5)], T0 + 5)
    signals = signals.observe([report("node1", 1, T0 + 6, verdict="drain")], T0 + 6)
    assert signals.heard["node1"].report.seq == 1 and signals.judge(T0 + 6).drained == ("node1",)


def test_the_records_are_every_rank_s_newest():
    signals = watching().observe(everyone(T0 + 1), T0 + 1).observe([report("node2", 2, T0 + 2)], T0 + 2)
    records = {r.rank: r for r in signals.records()}
    assert sorted(records) == list(range(8)) and records[2].at == T0 + 2 and records[0].at == T0 + 1


@given(st.lists(st.tuples(st.sampled_from(NODES + ("node9",)), st.integers(0, 50), st.floats(0, 100),
                          st.sampled_from(("running", "stopped", "gone", "unknown")),
                          st.sampled_from(("ok", "drain", "unknown"))), max_size=40),
       st.floats(0, 200))
def test_any_mix_of_reports_judges_without_error_and_names_only_the_step_s_nodes(entries, later):
    signals = watching()
    for node, seq, at, process, verdict in entries:
        signals = signals.observe([report(node, seq, T0 + at, process=process, stopped_since=T0 + at / 2 if
                                          process == "stopped" else 0.0, verdict=verdict)], T0 + at)
    judged = signals.judge(T0 + later)
    named = set(judged.drained) | set(judged.silent) | set(judged.frozen.suspect_nodes if judged.frozen else ())
    assert named <= set(NODES)
    assert judged.reporting + len(judged.silent) + judged.channel_silent <= len(NODES)


class Inbox:
    """Reports waiting to be drained (the agent's UDP inbox, as data)."""

    def __init__(self) -> None:
        self.waiting: list[NodeReport] = []
        self.port, self.refused = 9, {}
        self.drains_cut_short = 0

    def drain(self, limit: int = 1 << 20) -> list[NodeReport]:
        taken, self.waiting = self.waiting, []
        return taken


def holding(node: str, *steps: int) -> CheckpointHoldings:
    return CheckpointHoldings(node, tuple(HeldCopy(s, node, "local", NODES.index(node), 4, T0 + s, 1.0)
                                          for s in steps), T0 + max(steps, default=0))


def test_the_watch_keeps_each_nodes_newest_holdings_and_a_report_without_any_leaves_them():
    inbox = Inbox()
    watch = SignalWatch(inbox, "42", "0", NODES, POLICY, T0, clock=lambda: T0 + 1)
    inbox.waiting = [replace(report("node1", 1, T0), checkpoints=holding("node1", 10)),
                     replace(report("node2", 1, T0), checkpoints=holding("node2", 10)), report("node3", 1, T0)]
    watch.poll()
    assert watch.holdings() == {"node1": holding("node1", 10), "node2": holding("node2", 10)}
    kept = watch.holdings()["node2"]
    inbox.waiting = [replace(report("node1", 2, T0 + 1), checkpoints=holding("node1", 10, 20)),
                     replace(report("node2", 2, T0 + 1), checkpoints=holding("node2", 10)),  # unchanged
                     replace(report("node3", 1, T0), checkpoints=holding("node3", 99)),  # older than the one held
                     replace(report("node4", 1, T0, launch="1"), checkpoints=holding("node4", 99)),  # another step's
                     report("node1", 3, T0 + 2)]  # none told (a damaged file): node1's stay
    watch.poll()
    assert watch.holdings() == {"node1": holding("node1", 10, 20), "node2": holding("node2", 10)}
    assert watch.holdings()["node2"] is kept


def test_a_node_its_neighbour_no_longer_hears_is_suspected_until_the_neighbour_hears_it_again():
    from clusterctl.records.node_report import SilentPeer
    lost = replace(report("node1", 2, T0 + 10), silent_peers=(SilentPeer("node2", 3.0), SilentPeer("node9", 4.0)))
    signals = watching().observe(everyone(T0 + 10, node1=lost), T0 + 10)
    judged = signals.judge(T0 + 10.5)
    assert list(judged.witnessed) == ["node2"]  # node9 is not in the step
    assert judged.witnessed["node2"] == "its neighbour node1 has not heard its beats for 3.5 s"
    again = signals.observe([report("node1", 3, T0 + 11)], T0 + 11)
    assert again.judge(T0 + 11).witnessed == {}


def test_a_witness_that_is_itself_silent_suspects_nobody():
    from clusterctl.records.node_report import SilentPeer
    lost = replace(report("node1", 2, T0 + 10), silent_peers=(SilentPeer("node2", 3.0),))
    signals = watching().observe(everyone(T0 + 10, node1=lost), T0 + 10)
    fresh = signals.observe([report(n, 3, T0 + 20) for n in ("node2", "node3", "node4")], T0 + 20)
    assert fresh.judge(T0 + 20).witnessed == {}  # node1 silent itself: its word is not taken


def test_the_watch_polled_every_moment_names_a_node_silent_exactly_when_judging_afresh_would():
    inbox, now = Inbox(), [T0 + 1]
    watch = SignalWatch(inbox, "42", "0", NODES, POLICY, T0, clock=lambda: now[0])
    inbox.waiting = everyone(T0 + 1)
    for tick in range(1, 120):  # every 0.1 s; node4 stops reporting after the first second
        now[0] = T0 + 1 + tick / 10
        inbox.waiting = [report(n, tick + 1, now[0]) for n in NODES if n != "node4" or tick < 10]
        seen = watch.poll()
        assert seen == watch.signals.judge(now[0]), now[0] - T0
    assert seen.silent == ("node4",) and seen.reporting == 3
    now[0] -= 30.0  # the clock stepped back: the reports held look newer than now, and nobody is silent
    inbox.waiting = [report(n, 500, now[0]) for n in NODES if n != "node4"]
    assert watch.poll() == watch.signals.judge(now[0])
