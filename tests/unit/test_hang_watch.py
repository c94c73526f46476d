"""A rank that stops progressing is caught within its phase's timeout, learned from the job's own step
time, and its node is named with the evidence; a whole-job stall, a slow checkpoint save and the first
slow steps are not blamed on a node."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.launcher.pure.hang_watch import (
    HANG_REASON, HangPolicy, HangWatch, StepTimes, judge, phase_timeout, progress_from_log_line, step_timeout)
from clusterctl.records.rank_progress import RankProgress

START = 1_700_000_000.0
NODES = {rank: f"node{rank // 8 + 1}" for rank in range(32)}  # 4 nodes × 8 GPUs
POLICY = HangPolicy()


def reports(step: int, at: float, ranks=NODES, phase: str = "step") -> list[RankProgress]:
    """Every rank of `ranks` reporting `step` at `at`."""
    return [RankProgress(rank, node, step, phase, at, 1000 + rank) for rank, node in ranks.items()]


def trained(steps: int, step_seconds: float = 12.0, first_at: float = START + 60) -> HangWatch:
    """A watch that saw every rank step in lockstep from step 0 at `first_at` through step `steps`."""
    watch = HangWatch.start(POLICY, START, NODES)
    for step in range(steps + 1):
        watch = watch.observe(reports(step, first_at + step * step_seconds))
    return watch


def test_one_nodes_ranks_going_silent_while_the_rest_step_on_names_that_node_with_the_evidence():
    watch = trained(41)
    last_at = START + 60 + 41 * 12
    others = {r: n for r, n in NODES.items() if n != "node3"}
    for step in range(42, 50):  # a job whose ranks do not wait on each other keeps stepping
        watch = watch.observe(reports(step, last_at + (step - 41) * 12, others))

    assert not watch.verdict(last_at + 59).hung
    verdict = watch.verdict(last_at + 95)

    assert verdict.hung and not verdict.whole_job
    assert verdict.suspect_nodes == ("node3",)
    assert verdict.stuck_ranks == tuple(range(16, 24))
    assert verdict.evidence == (
        "ranks 16-23 on node3 last reported step 41 (phase step) 95 s ago; "
        "timeout 60 s learned from median step 12 s × 5",)
    assert [(b.node, b.reason, b.evidence) for b in verdict.blames()] == [("node3", HANG_REASON, verdict.evidence)]


def test_a_rank_stopped_mid_job_stalls_everyone_but_is_named_because_it_went_silent_first():
    watch = trained(41)
    stopped_at = START + 60 + 41 * 12
    # Rank 9 (node2) is stopped; the others finish their step and block in the next collective.
    watch = watch.observe(reports(42, stopped_at + 12, {r: n for r, n in NODES.items() if r != 9}))

    verdict = watch.verdict(stopped_at + 12 + 61)

    assert verdict.hung and not verdict.whole_job
    assert verdict.suspect_nodes == ("node2",)
    assert verdict.evidence == (
        "rank 9 on node2 last reported step 41 (phase step) 73 s ago; timeout 60 s learned from median step "
        "12 s × 5; every other rank kept reporting until 12 s later (then waited on these, it seems)",)


def test_every_rank_stopping_together_is_a_whole_job_stall_and_names_no_node():
    watch = trained(41)
    verdict = watch.verdict(START + 60 + 41 * 12 + 95)

    assert verdict.hung and verdict.whole_job
    assert verdict.suspects == () and verdict.blames() == ()
    assert verdict.stuck_ranks == tuple(range(32))
    assert verdict.evidence == (
        "every rank (ranks 0-31 on node[1-4]) silent: the newest report, step 41 (phase step) from rank 0, "
        "is 95 s old; timeout 60 s learned from median step 12 s × 5; the whole job stopped at once "
        "(a shared-filesystem or network stall?), no node to blame",)


def test_ranks_that_never_report_while_the_others_do_are_stuck_after_the_startup_timeout():
    started = {r: n for r, n in NODES.items() if n != "node4"}
    watch = HangWatch.start(POLICY, START, NODES).observe(reports(0, START + 30, started, phase="startup"))
    for step in range(5):
        watch = watch.observe(reports(step, START + 500 + step, started))

    assert not watch.verdict(START + 599).hung
    verdict = watch.verdict(START + 610)

    assert verdict.suspect_nodes == ("node4",)
    assert verdict.evidence == ("ranks 24-31 on node4 never reported progress in 610 s since the step started; "
                                "start-up timeout 600 s; every other rank reported, last 106 s ago",)


def test_a_program_that_never_reports_is_a_whole_job_hang_that_asks_whether_it_reports_at_all():
    verdict = HangWatch.start(POLICY, START, NODES).verdict(START + 601)
    assert verdict.whole_job and verdict.suspects == ()
    assert "does the program call clusterctl.progress.beat or log its steps?" in verdict.evidence[0]


def test_a_slow_checkpoint_save_by_rank_0_while_the_others_wait_is_no_hang_until_the_checkpoint_timeout():
    watch = trained(41)
    save_at = START + 60 + 41 * 12 + 1
    watch = watch.observe([RankProgress(0, "node1", 41, "checkpoint-save", save_at, 1000)])

    assert not watch.verdict(save_at + 899).hung  # the other ranks wait in a barrier, silent in phase step
    verdict = watch.verdict(save_at + 901)
    assert verdict.hung


def test_slow_first_steps_are_judged_with_the_startup_timeout():
    watch = HangWatch.start(POLICY, START, NODES).observe(reports(0, START + 60))
    watch = watch.observe(reports(1, START + 400))  # compiling: 340 s for one step

    assert not watch.verdict(START + 400 + 599).hung
    assert phase_timeout(POLICY, watch.step_times, "step", 1).why == \
        "start-up timeout 600 s (within the first 3 warm-up steps)"


def test_stale_reports_of_an_earlier_launch_are_not_progress_of_this_one():
    stale = reports(900, START - 5)
    verdict = judge(stale, POLICY, START + 601, START, expected_ranks=NODES)
    assert verdict.whole_job and "no rank" in verdict.evidence[0]


def test_a_program_that_only_logs_its_steps_is_watched_through_its_log():
    pattern = r"step (?P<step>\d+)/\d+"
    watch = HangWatch.start(POLICY, START, NODES)
    for step in range(20):
        parsed = progress_from_log_line(f"[rank 0] step {step}/1000 loss 2.31", pattern)
        assert parsed == step
        watch = watch.observe_log_step(parsed, START + 60 + step * 2.0)

    assert step_timeout(POLICY, watch.step_times.learned or 0) == 30  # 2 s × 5, raised to the minimum
    assert not watch.verdict(START + 60 + 19 * 2 + 29).hung
    verdict = watch.verdict(START + 60 + 19 * 2 + 31)
    assert verdict.whole_job  # the log of one rank cannot say which node stopped


@pytest.mark.parametrize(("line", "pattern", "step"), [
    ("it=17 loss=3.2", r"it=(\d+)", 17),
    ("epoch 2 step 345", r"epoch (\d+) step (?P<step>\d+)", 345),
    ("4096", r"\d+", 4096),
    ("loss 3.2", r"step (\d+)", None),
    ("step ?", r"step (\S+)", None),
])
def test_a_step_number_is_read_from_a_log_line(line, pattern, step):
    assert progress_from_log_line(line, pattern) == step


def test_a_policy_whose_bounds_cross_is_refused():
    with pytest.raises(ValueError, match="min_step_timeout 60 s exceeds max_step_timeout 30 s"):
        HangPolicy(min_step_timeout=60, max_step_timeout=30)


POLICIES = st.builds(HangPolicy, safety_factor=st.floats(1, 20), min_step_timeout=st.floats(1, 100),
                     max_step_timeout=st.floats(100, 5000), warmup_steps=st.integers(0, 5))


@given(POLICIES, st.floats(1e-4, 1e5))
def test_the_learned_step_timeout_always_lies_within_its_bounds(policy, learned):
    assert policy.min_step_timeout <= step_timeout(policy, learned) <= policy.max_step_timeout
    times = StepTimes().with_sample(learned)
    timeout = phase_timeout(policy, times, "step", policy.warmup_steps)
    assert policy.min_step_timeout <= timeout.seconds <= policy.max_step_timeout


# `late` stops short of 1: with safety_factor 1 a report exactly one learned step late sits on the
# timeout, and epoch seconds (~1.7e9) round it either way.
@given(POLICIES, st.lists(st.floats(0.05, 60), min_size=5, max_size=80), st.floats(0, 0.99))
def test_a_rank_that_keeps_reporting_within_the_learned_step_time_is_never_judged_stuck(policy, durations, late):
    watch = HangWatch.start(policy, START, {0: "node1", 1: "node2"})
    at, step = START + 10, 0
    for seconds in durations:
        at += seconds
        step += 1
        watch = watch.observe([RankProgress(0, "node1", step, "step", at, 1), RankProgress(1, "node2", step, "step", at, 2)])
        learned = watch.step_times.learned
        if learned is not None:
            # Judged anywhere up to one learned step time after the last report: never a hang.
            assert not watch.verdict(at + late * learned).hung


@given(POLICIES, st.floats(0, 1), st.integers(0, 7))
def test_a_slow_checkpoint_save_within_the_checkpoint_timeout_is_never_a_hang(policy, fraction, saver):
    watch = HangWatch.start(policy, START, NODES)
    for step in range(10):
        watch = watch.observe(reports(step, START + 60 + step * 3.0))
    save_at = START + 60 + 9 * 3.0 + 0.5
    watch = watch.observe([RankProgress(saver, NODES[saver], 9, "checkpoint-save", save_at, 1)])
    assert not watch.verdict(save_at + fraction * policy.checkpoint_timeout).hung


def _alive(step: int, at: float, alive_at: dict[str, float]) -> list[RankProgress]:
    """Every rank last stepped `step` at `at`; its process last ran at alive_at[its node]."""
    return [RankProgress(rank, node, step, "step", at, 1000 + rank, alive_at=alive_at[node]) for rank, node in NODES.items()]


def test_when_every_rank_stopped_stepping_at_once_the_node_whose_processes_also_stopped_running_is_named():
    watch = trained(41)
    last_at = START + 60 + 41 * 12
    now = last_at + 95
    # Lockstep: every rank stopped at step 41 together; node2's processes froze (SIGSTOP) then, the
    # others block in the next collective with their liveness threads still running.
    watch = watch.observe(_alive(41, last_at, {"node1": now - 1, "node2": last_at, "node3": now - 1,
                                               "node4": now - 0.5}))
    verdict = watch.verdict(now)
    assert verdict.hung and not verdict.whole_job and verdict.suspect_nodes == ("node2",)
    assert verdict.evidence == ("every rank stopped stepping, but ranks 8-15 on node2 also stopped running: their "
                                "processes last showed life 94 s before the other ranks' latest, which are alive and "
                                "waiting (in a collective, it seems)",)


@pytest.mark.parametrize("alive", ["every process alive", "every process frozen"])
def test_every_rank_stopped_and_their_processes_alike_is_still_a_whole_job_stall(alive):
    watch = trained(41)
    last_at = START + 60 + 41 * 12
    now = last_at + 95
    seen = now - 1 if alive == "every process alive" else last_at
    watch = watch.observe(_alive(41, last_at, dict.fromkeys(("node1", "node2", "node3", "node4"), seen)))
    verdict = watch.verdict(now)
    assert verdict.hung and verdict.whole_job and verdict.suspect_nodes == ()
    expected = "1 s ago" if alive == "every process alive" else "95 s ago"
    assert f"every rank's process last showed life {expected} (liveness), none apart from the others; the whole " \
           "job stopped at once" in verdict.evidence[0]


def test_liveness_too_close_to_tell_apart_is_shown_as_a_range_of_ages():
    watch = trained(41)
    last_at = START + 60 + 41 * 12
    now = last_at + 95
    watch = watch.observe(_alive(41, last_at, {"node1": now - 1, "node2": now - 2.5, "node3": now - 1,
                                               "node4": now - 1}))
    verdict = watch.verdict(now)
    assert verdict.whole_job
    assert "every rank's process last showed life 1-2.5 s ago (liveness), none apart from the others" \
        in verdict.evidence[0]


def test_lockstep_ranks_whose_rate_limited_reports_end_apart_are_judged_together_once_all_are_overdue():
    watch = trained(41)
    last_at = START + 60 + 41 * 12
    # Every rank stopped in one collective, but rank 0's last report (a phase change, written at once)
    # came 0.8 s after the others' rate-limited ones; node2's processes froze, the rest wait alive.
    stopped = [RankProgress(r.rank, r.node, 41, "step", last_at + (0.8 if r.rank == 0 else 0.0), r.pid,
                            alive_at=last_at + 0.8 if r.node == "node2" else last_at + 61)
               for r in reports(41, last_at)]
    watch = watch.observe(stopped)

    assert not watch.verdict(last_at + 60.5).hung  # ranks 1-31 overdue, rank 0 not yet: not told apart
    verdict = watch.verdict(last_at + 61)
    assert verdict.hung and verdict.suspect_nodes == ("node2",)
    assert "ranks 8-15 on node2 also stopped running" in verdict.evidence[0]
