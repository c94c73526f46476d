"""The straggler watch finds the node whose ranks compute persistently slower than the job's, says by how
much and since when, and leaves alone a job that slowed as a whole, a short blip and the warm-up."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.launcher.pure.straggler_watch import StragglerPolicy, StragglerWatch
from clusterctl.records.rank_progress import RankProgress

NODES = {"node1": (0, 1), "node2": (2, 3), "node3": (4, 5), "node4": (6, 7)}
POLICY = StragglerPolicy(action="swap", margin=1.2, window_steps=30, warmup_steps=10)


def run(compute: Callable[[int, int, str], float], steps: int, *, nodes: dict = NODES, every: int = 4,
        policy: StragglerPolicy = POLICY) -> tuple[StragglerWatch, list[tuple[int, str]]]:
    """Train `steps` steps, rank r on node n computing compute(step, r, n) s in step `step`; the watch
    reads every rank's progress record every `every` steps.  Returns the watch and (step, node) found."""
    watch = StragglerWatch.start(policy)
    totals = {rank: 0.0 for ranks in nodes.values() for rank in ranks}
    found = []
    for step in range(1, steps + 1):
        for node, ranks in nodes.items():
            for rank in ranks:
                totals[rank] += compute(step, rank, node)
        if step % every == 0:
            records = [RankProgress(rank, node, step, "step", 1000.0 + step, 100 + rank, totals[rank], step)
                       for node, ranks in nodes.items() for rank in ranks]
            watch = watch.observe(records)
            found += [(step, s.node) for s in watch.found]
    return watch, found


def test_a_throttled_node_is_found_after_the_window_with_the_numbers_that_say_so():
    watch, found = run(lambda step, rank, node: 0.5 if node == "node3" and step > 40 and rank == 5 else 0.2, 120)
    # Slow from step 41: the read at 44 starts the streak (its own steps are not counted: a read may begin
    # before a slowdown), and by the read at 76, 32 more steps count (>= 30).
    assert found == [(76, "node3")]
    node3 = watch.nodes["node3"]
    assert node3.straggler and node3.ranks == (4, 5) and node3.ratio == pytest.approx(2.5)
    assert node3.lost_s == pytest.approx(80 * 0.3)  # every slow step cost the job 0.3 s
    assert [n.node for n in watch.stragglers] == ["node3"]
    assert not any(n.straggler for name, n in watch.nodes.items() if name != "node3")


def test_the_evidence_line_names_the_ranks_the_times_and_the_stretch():
    found = []
    watch = StragglerWatch.start(POLICY)
    totals = dict.fromkeys(range(8), 0.0)
    for step in range(1, 81):
        for node, ranks in NODES.items():
            for rank in ranks:
                totals[rank] += 0.5 if node == "node2" and step > 20 else 0.2
        if step % 4 == 0:
            watch = watch.observe([RankProgress(r, n, step, "step", 1.0 * step, 9, totals[r], step)
                                   for n, rs in NODES.items() for r in rs])
            found += watch.found
    assert len(found) == 1
    assert found[0].evidence == ("ranks 2-3 on node2 computed 0.5 s per step against the job's 0.2 s (2.50x, median "
                                 "over the slow stretch) for 36 steps from step 21; a straggler after 30 steps at "
                                 "1.2x or more; 10.8 s lost so far",)


def test_a_whole_job_slowdown_flags_nobody():
    # A shared-filesystem stall: every rank three times slower for 60 steps.
    watch, found = run(lambda step, rank, node: 0.6 if 40 < step <= 100 else 0.2, 160)
    assert found == [] and watch.lost_s == 0


def test_a_blip_shorter_than_the_window_flags_nobody():
    watch, found = run(lambda step, rank, node: 1.0 if node == "node1" and 40 < step <= 60 else 0.2, 160)
    assert found == []
    assert watch.nodes["node1"].lost_s == pytest.approx(20 * 0.8)  # the blip still cost time


@given(start=st.integers(11, 80), length=st.integers(1, POLICY.window_steps - 3), factor=st.floats(1.3, 10))
def test_a_blip_of_any_shape_a_few_steps_shorter_than_the_window_flags_nobody(start, length, factor):
    # Reads every 4 steps: a blip starting or ending mid-read makes that whole read look slow.
    _, found = run(lambda step, rank, node: factor * 0.2 if node == "node1" and start <= step < start + length
                   else 0.2, 160)
    assert found == []


def test_warm_up_steps_are_not_judged():
    watch, found = run(lambda step, rank, node: 2.0 if node == "node4" and step <= 10 else 0.2, 60)
    assert found == [] and watch.nodes["node4"].lost_s == 0


def test_a_straggler_recovers_after_the_window_below_the_clear_margin():
    watch, found = run(lambda step, rank, node: 0.4 if node == "node2" and 20 < step <= 80 else 0.2, 200)
    assert found == [(56, "node2")]
    assert not watch.nodes["node2"].straggler


def test_with_two_nodes_the_faster_one_is_the_reference():
    two = {"node1": (0,), "node2": (1,)}
    watch, found = run(lambda step, rank, node: 0.3 if node == "node2" and step > 20 else 0.2, 100, nodes=two)
    assert [node for _, node in found] == ["node2"] and watch.reference == pytest.approx(0.2)


def test_a_restarted_rank_process_starts_its_counters_again_and_is_not_a_sample():
    policy = StragglerPolicy(window_steps=1, warmup_steps=0)
    watch = StragglerWatch.start(policy)
    watch = watch.observe([RankProgress(0, "node1", 10, "step", 1, 1, 2.0, 10),
                           RankProgress(1, "node2", 10, "step", 1, 2, 2.0, 10)])
    # rank 1 restarted (new pid): its small counters must not read as a fast node making rank 0 slow
    watch = watch.observe([RankProgress(0, "node1", 20, "step", 2, 1, 4.0, 20),
                           RankProgress(1, "node2", 2, "step", 2, 3, 0.1, 2)])
    assert watch.found == () and watch.reference is None


def test_reports_from_before_the_launch_are_ignored():
    watch = StragglerWatch.start(StragglerPolicy(window_steps=1, warmup_steps=0), started_at=100.0)
    old = [RankProgress(0, "node1", 50, "step", 99.0, 1, 50.0, 50), RankProgress(1, "node2", 50, "step", 99.0, 2, 5.0, 50)]
    assert watch.observe(old).observe(old).nodes == {}


@pytest.mark.parametrize("bad", [dict(action="evict"), dict(margin=1.0), dict(window_steps=0),
                                 dict(warmup_steps=-1)])
def test_a_policy_that_makes_no_sense_is_refused(bad):
    with pytest.raises(ValueError):
        StragglerPolicy(**bad)


@given(noise=st.lists(st.floats(0.9, 1.1), min_size=8, max_size=8), scale=st.floats(0.01, 100))
def test_ranks_within_ten_percent_of_each_other_are_never_stragglers_at_any_speed(noise, scale):
    watch, found = run(lambda step, rank, node: scale * noise[(rank + step) % 8], 120)
    assert found == [] and not watch.stragglers


@given(slow=st.sampled_from(sorted(NODES)), factor=st.floats(1.3, 10), scale=st.floats(0.01, 100),
       onset=st.integers(11, 60))
def test_any_node_persistently_slower_by_more_than_the_margin_is_found_within_window_and_one_read(
        slow, factor, scale, onset):
    watch, found = run(lambda step, rank, node: scale * (factor if node == slow and step >= onset else 1.0), 200)
    assert [node for _, node in found] == [slow]
    assert found[0][0] - onset < POLICY.window_steps + 3 * 4  # the window, plus at most three reads' worth of steps
