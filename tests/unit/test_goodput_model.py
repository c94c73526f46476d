"""The goodput projection for today's synchronous checkpoints against multi-level ones: properties
that hold for any costs, and one worked example at the seeds' size (12,500 nodes)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.launcher.pure.goodput_model import (
    LLAMA3_NODE_MTBF_SECONDS, Job, SyncPath, TieredPath, pair_loss, project_sync, project_tiered)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
seconds = st.floats(min_value=0.0, max_value=5_000.0, allow_nan=False)
jobs = st.builds(Job, nodes=st.integers(1, 200_000), detect_seconds=seconds, restart_seconds=seconds,
                 node_mtbf_seconds=st.floats(min_value=1.0, max_value=1e10),
                 correlated_pair_loss=st.floats(min_value=0.0, max_value=1.0),
                 shortest_interval_seconds=st.floats(min_value=0.0, max_value=600.0))
syncs = st.builds(SyncPath, stall_seconds=seconds, read_seconds=seconds)
tiereds = st.builds(TieredPath, stall_seconds=seconds, local_read_seconds=seconds, shared_read_seconds=seconds,
                    replicate_seconds=seconds, flush_seconds=seconds, flush_every=st.integers(1, 100),
                    background_slowdown=st.floats(min_value=0.0, max_value=1.0))


@SETTINGS
@given(jobs, syncs, tiereds)
def test_goodput_is_a_share_of_time_and_every_figure_is_finite(job: Job, sync: SyncPath, tiered: TieredPath) -> None:
    for projection in (project_sync(job, sync), project_tiered(job, tiered)):
        assert 0.0 <= projection.goodput <= 1.0
        assert 0.0 <= projection.pair_loss <= 1.0
        assert projection.interval_seconds >= 0.0
        assert all(math.isfinite(v) for v in (projection.interval_seconds, projection.young_seconds,
                                              projection.lost_work_seconds, projection.recovery_seconds))


@SETTINGS
@given(jobs, syncs, tiereds, st.floats(min_value=1.0, max_value=100.0))
def test_goodput_never_falls_when_nodes_fail_less_often(job: Job, sync: SyncPath, tiered: TieredPath,
                                                        factor: float) -> None:
    # A pair loss reads from shared storage; it is a worse failure than a single one, which is what the
    # tiers are for (when it is not, a shorter node MTBF makes pair losses, the cheap kind, likelier).
    tiered = replace(tiered, shared_read_seconds=max(tiered.shared_read_seconds,
                                                     tiered.local_read_seconds + tiered.replicate_seconds))
    sturdier = replace(job, node_mtbf_seconds=job.node_mtbf_seconds * factor)
    assert project_sync(sturdier, sync).goodput >= project_sync(job, sync).goodput - 1e-12
    assert project_tiered(sturdier, tiered).goodput >= project_tiered(job, tiered).goodput - 1e-12


@SETTINGS
@given(jobs, syncs, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_the_tiered_path_is_never_worse_when_none_of_its_costs_is_larger(job: Job, sync: SyncPath, stall_share: float,
                                                                         read_share: float) -> None:
    tiered = TieredPath(stall_seconds=sync.stall_seconds * stall_share,
                        local_read_seconds=sync.read_seconds * read_share, shared_read_seconds=sync.read_seconds)
    assert project_tiered(job, tiered).goodput >= project_sync(job, sync).goodput - 1e-12


@SETTINGS
@given(jobs, syncs)
def test_the_same_costs_on_both_paths_project_the_same(job: Job, sync: SyncPath) -> None:
    # every resume from shared storage (a pair lost every time), every checkpoint flushed, no lag
    job = replace(job, correlated_pair_loss=1.0)
    tiered = TieredPath(stall_seconds=sync.stall_seconds, local_read_seconds=0.0, shared_read_seconds=sync.read_seconds)
    assert project_tiered(job, tiered).goodput == pytest.approx(project_sync(job, sync).goodput, abs=1e-12)


def test_a_cheap_checkpoint_on_a_long_lived_job_is_youngs_interval() -> None:
    job = Job(nodes=1, detect_seconds=0.0, restart_seconds=0.0, node_mtbf_seconds=1e7, shortest_interval_seconds=0.0)
    projection = project_sync(job, SyncPath(stall_seconds=10.0, read_seconds=0.0))
    assert projection.interval_seconds + 10.0 == pytest.approx(math.sqrt(2 * 10.0 * 1e7))
    assert projection.young_seconds == pytest.approx(math.sqrt(2 * 10.0 * 1e7))


def test_the_llama3_rate_is_one_interruption_per_node_every_264_days() -> None:
    assert LLAMA3_NODE_MTBF_SECONDS / 86_400 == pytest.approx(54 * 2048 / 419)
    assert Job(nodes=12_500, detect_seconds=0, restart_seconds=0).mtbf_seconds == pytest.approx(1824.37, abs=0.01)


def test_worked_example_at_twelve_thousand_five_hundred_nodes() -> None:
    """12,500 nodes at Llama 3's rate fail every 1,824 s (30 min).  Detection 30 s, restart 120 s.

    Today: a 20 s synchronous save, a 20 s read back.  A = 30 + 120 + 20 + 20 (a failure during the
    save loses it) = 190 s, B = 1: s* = sqrt(2 · 20 · (1824.37 − 190)) = 255.69 s (235.69 s of
    training, then the save); goodput = (1 − 20/255.69) · (1 − (190 + 255.69/2) / 1824.37)
    = 0.9218 · 0.8258 = 0.7612.

    Multi-level: a 1 s stall, 4 s to read from local + buddy, 20 s from shared storage, the buddy's
    copy complete 10 s and the flush 20 s after the save returns, every 10th checkpoint flushed.
    q = 1 − exp(−(30 + 120 + 4) / 22,804,651) = 6.75e-6 (the buddy failing before its copy is read).
    A = 150 + (1 − q) · (4 + 1 + 10) + q · (20 + 1 + 20) ≈ 165.0 s, B = 1 + 9q:
    s* = sqrt(2 · 1 · (1824.37 − 165.0) / B) = 57.61 s (56.61 s of training);
    goodput = (1 − 1/57.61) · (1 − (165.0 + 57.61/2) / 1824.37) = 0.9826 · 0.8938 = 0.8783.
    """
    job = Job(nodes=12_500, detect_seconds=30.0, restart_seconds=120.0)
    today = project_sync(job, SyncPath(stall_seconds=20.0, read_seconds=20.0))
    tiers = TieredPath(stall_seconds=1.0, local_read_seconds=4.0, shared_read_seconds=20.0, replicate_seconds=10.0,
                       flush_seconds=20.0, flush_every=10)
    new = project_tiered(job, tiers)
    mtbf = 54 * 86_400 * 2048 / 419 / 12_500
    assert today.interval_seconds == pytest.approx(math.sqrt(2 * 20 * (mtbf - 190)) - 20)
    assert today.interval_seconds == pytest.approx(235.69, abs=0.01)
    assert today.goodput == pytest.approx(0.7612, abs=1e-4)
    assert today.lost_work_seconds == pytest.approx(20 + 255.69 / 2, abs=0.01)
    q = -math.expm1(-154 / (mtbf * 12_500))
    assert pair_loss(job, tiers) == pytest.approx(q) == pytest.approx(6.75e-6, rel=1e-3)
    fixed = 150 + (1 - q) * 15 + q * 41
    s = math.sqrt(2 * 1 * (mtbf - fixed) / (1 + 9 * q))
    assert new.interval_seconds == pytest.approx(s - 1) == pytest.approx(56.61, abs=0.01)
    assert new.goodput == pytest.approx((1 - 1 / s) * (1 - (fixed + (1 + 9 * q) * s / 2) / mtbf))
    assert new.goodput == pytest.approx(0.8783, abs=1e-4)
    assert new.flush_interval_seconds == pytest.approx(10 * s)


def simulate(job: Job, stall: float, interval: float, lag: float, flush_lag: float, flush_every: int,
             pair: float, recover_near: float, recover_far: float, failures: int, seed: int) -> float:
    """Goodput of a run simulated failure by failure: checkpoint j is taken at j·s (its progress then is
    j·τ), usable after the stall and its lag; a failure goes back to the newest usable one (with
    probability `pair` to the newest flushed one), then recovery; no failure strikes a recovery."""
    rng = random.Random(seed)
    s = interval + stall
    kept = wall = 0.0
    for _ in range(failures):
        at = rng.expovariate(1 / job.mtbf_seconds)
        far = rng.random() < pair
        newest = int(at // s)
        while newest > 0 and (newest * s + stall + (flush_lag if far else lag) > at
                              or (far and newest % flush_every)):
            newest -= 1
        kept += newest * interval
        wall += at + (recover_far if far else recover_near)
    return kept / wall


def test_the_first_order_model_agrees_with_a_simulated_run() -> None:
    # failures rare against the costs (the model's premise): λ·(A + s) about 2%
    job = Job(nodes=100, detect_seconds=30.0, restart_seconds=60.0, correlated_pair_loss=0.2,
              node_mtbf_seconds=100 * 100_000.0)
    today = project_sync(job, SyncPath(stall_seconds=10.0, read_seconds=20.0))
    simulated = simulate(job, 10.0, today.interval_seconds, 0.0, 0.0, 1, 0.0, 110.0, 110.0, 20_000, 1)
    assert simulated == pytest.approx(today.goodput, abs=5e-4)
    tiers = TieredPath(stall_seconds=1.0, local_read_seconds=5.0, shared_read_seconds=20.0, replicate_seconds=30.0,
                       flush_seconds=200.0, flush_every=5)
    new = project_tiered(job, tiers)
    simulated = simulate(job, 1.0, new.interval_seconds, 30.0, 200.0, 5, new.pair_loss, 95.0, 110.0, 20_000, 2)
    assert simulated == pytest.approx(new.goodput, abs=5e-4)


def test_the_interval_never_outruns_the_background_copies() -> None:
    # a near-free stall would advise a checkpoint every few seconds; the buddy copy takes 30 s
    job = Job(nodes=12_500, detect_seconds=30.0, restart_seconds=120.0)
    tiers = TieredPath(stall_seconds=0.01, local_read_seconds=4.0, shared_read_seconds=20.0, replicate_seconds=30.0,
                       flush_seconds=600.0, flush_every=10)
    projection = project_tiered(job, tiers)
    assert projection.interval_seconds + 0.01 == pytest.approx(60.0)  # k·s ≥ the flush's 600 s
    assert project_tiered(job, replace(tiers, flush_seconds=0.0)).interval_seconds + 0.01 == pytest.approx(30.0)


def test_a_failure_that_takes_a_node_and_its_buddy_goes_back_to_the_last_flush() -> None:
    job = Job(nodes=1_250, detect_seconds=30.0, restart_seconds=120.0, correlated_pair_loss=0.5)
    tiers = TieredPath(stall_seconds=1.0, local_read_seconds=4.0, shared_read_seconds=20.0, flush_every=10)
    rarely_flushed = project_tiered(job, tiers)
    assert rarely_flushed.pair_loss == pytest.approx(0.5, abs=1e-4)
    assert rarely_flushed.goodput < project_tiered(job, replace(tiers, flush_every=1)).goodput
    assert rarely_flushed.goodput < project_tiered(replace(job, correlated_pair_loss=0.0), tiers).goodput
