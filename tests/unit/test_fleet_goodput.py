"""The simulated day of a large job's failures (issue #43): properties that hold for any fleet and seed."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from clusterctl.launcher.pure.fleet_goodput import (
    POLICIES, RESUBMIT, SHRINK, SPARES, Fleet, FleetModelError, simulate)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOUR = 3600.0
seconds = st.floats(min_value=0.0, max_value=2 * HOUR, allow_nan=False)


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    replica = draw(st.integers(1, 40))
    replicas = draw(st.integers(1, 400))
    nodes = replica * replicas
    return Fleet(
        nodes=nodes, replica_nodes=replica, spares=draw(st.integers(0, 40)),
        min_nodes=draw(st.integers(0, nodes)),
        node_mtbf_seconds=nodes * draw(st.floats(min_value=60.0, max_value=48 * HOUR)),
        repair_median_seconds=draw(st.floats(min_value=60.0, max_value=48 * HOUR)),
        repair_sigma=draw(st.floats(min_value=0.0, max_value=2.0)),
        checkpoint_interval_seconds=draw(st.floats(min_value=1.0, max_value=2 * HOUR)),
        checkpoint_stall_seconds=draw(st.floats(min_value=0.0, max_value=600.0)),
        in_allocation_seconds=draw(seconds), batch_host_recovery_seconds=draw(seconds),
        resubmit_seconds=draw(seconds), queue_seconds=draw(st.floats(min_value=0.0, max_value=8 * HOUR)),
        grow_wait_seconds=draw(st.one_of(st.none(), seconds)),
        window_seconds=draw(st.floats(min_value=HOUR, max_value=48 * HOUR)))


@SETTINGS
@given(fleets(), st.sampled_from(POLICIES), st.integers(0, 2**32))
def test_every_node_second_is_counted_once_and_goodput_is_a_share(fleet: Fleet, policy: str, seed: int) -> None:
    day = simulate(fleet, policy, random.Random(seed))
    shares = (day.goodput, day.checkpoint_share, day.lost_work_share, day.restart_share, day.queue_share,
              day.capacity_share)
    assert all(-1e-9 <= share <= 1 + 1e-9 for share in shares)
    assert sum(shares) == pytest.approx(1.0, abs=1e-9)
    assert 0.0 <= day.held_goodput <= 1 + 1e-9
    assert day.failures == day.swaps + day.shrinks + day.resubmissions
    if policy != SHRINK:
        assert day.capacity_share == day.shrinks == day.grows == 0


@SETTINGS
@given(fleets(), st.sampled_from(POLICIES), st.integers(0, 2**32))
def test_with_no_failures_goodput_is_what_the_checkpoints_leave(fleet: Fleet, policy: str, seed: int) -> None:
    fleet = replace(fleet, node_mtbf_seconds=1e30)
    day = simulate(fleet, policy, random.Random(seed))
    cycle = fleet.checkpoint_interval_seconds + fleet.checkpoint_stall_seconds
    assert day.failures == 0
    # Up to one cycle cut by the end of the window.
    assert abs(day.goodput - fleet.checkpoint_interval_seconds / cycle) <= cycle / fleet.window_seconds + 1e-9
    assert day.restart_share == day.queue_share == day.capacity_share == 0


@SETTINGS
@given(fleets(), st.integers(1, 40), st.integers(0, 2**32))
def test_more_spares_never_lower_spares_then_resubmit(fleet: Fleet, more: int, seed: int) -> None:
    # A swap in the allocation must be no dearer than a resubmission; the batch host costs the same either way.
    fleet = replace(fleet, in_allocation_seconds=min(fleet.in_allocation_seconds,
                                                     fleet.resubmit_seconds + fleet.queue_seconds))
    fewer = simulate(fleet, SPARES, random.Random(seed))
    richer = simulate(replace(fleet, spares=fleet.spares + more), SPARES, random.Random(seed))
    assert richer.goodput >= fewer.goodput - 1e-9


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(fleets())
def test_shrink_and_grow_beats_resubmitting_when_the_queue_is_longer_than_a_recovery(fleet: Fleet) -> None:
    # In the regime the policy (and the model: no failure during a recovery) is for: a replica is at most 1% of
    # the job; a checkpoint cycle and a recovery each at most a tenth of the job MTBF; a window of at most 50
    # job MTBFs (to keep the test quick).
    assume(fleet.nodes >= 100 * fleet.replica_nodes)
    mtbf = fleet.job_mtbf_seconds
    fleet = replace(fleet, checkpoint_interval_seconds=min(fleet.checkpoint_interval_seconds, mtbf / 20),
                    checkpoint_stall_seconds=min(fleet.checkpoint_stall_seconds, mtbf / 20),
                    in_allocation_seconds=min(fleet.in_allocation_seconds, mtbf / 10),
                    batch_host_recovery_seconds=min(fleet.batch_host_recovery_seconds, mtbf / 10),
                    window_seconds=min(fleet.window_seconds, 50 * mtbf))
    # The queue wait is at least twice what a failure costs a shrink (its recovery, the grow's, and the work
    # since the last checkpoint), plus a dropped replica missing for the whole window.  Compared over days, not
    # day by day: on one day the policy that runs more may meet a failure more, at a dearer place in its cycle.
    cycle = fleet.checkpoint_interval_seconds + fleet.checkpoint_stall_seconds
    queue = 2 * (2 * fleet.in_allocation_seconds + cycle) + fleet.replica_nodes * fleet.window_seconds / fleet.nodes
    fleet = replace(fleet, queue_seconds=max(fleet.queue_seconds, queue))
    seeds = range(32)
    shrink = sum(simulate(fleet, SHRINK, random.Random(seed)).goodput for seed in seeds)
    resubmit = sum(simulate(fleet, RESUBMIT, random.Random(seed)).goodput for seed in seeds)
    assert shrink >= resubmit - 1e-9


@SETTINGS
@given(fleets(), st.integers(0, 2**32))
def test_spares_then_resubmit_with_no_spares_is_resubmit_only(fleet: Fleet, seed: int) -> None:
    plain = simulate(replace(fleet, spares=0), SPARES, random.Random(seed))
    assert replace(plain, policy=RESUBMIT) == simulate(fleet, RESUBMIT, random.Random(seed))


def test_the_seeds_day_a_queue_of_hours_costs_resubmit_only_most_of_its_time() -> None:
    fleet = Fleet(queue_seconds=4 * HOUR)
    days = {policy: simulate(fleet, policy, random.Random(7)) for policy in POLICIES}
    assert days[RESUBMIT].queue_share > 0.3
    assert days[SHRINK].goodput > 0.95 > days[RESUBMIT].goodput
    assert days[SHRINK].shrinks > 0 and days[SHRINK].capacity_share > 0


@pytest.mark.parametrize("change, names", [
    ({"nodes": 100, "replica_nodes": 30}, "multiple of replica_nodes"),
    ({"queue_seconds": -1.0}, "queue_seconds"),
    ({"checkpoint_interval_seconds": 0.0}, "checkpoint_interval_seconds"),
    ({"node_mtbf_seconds": float("nan")}, "node_mtbf_seconds"),
])
def test_a_parameter_out_of_range_is_named(change: dict[str, float], names: str) -> None:
    with pytest.raises(FleetModelError, match=names):
        Fleet(**change)  # type: ignore[arg-type]


def test_an_unknown_policy_is_named() -> None:
    with pytest.raises(FleetModelError, match="requeue"):
        simulate(Fleet(), "requeue", random.Random(0))
