"""The job's training metrics from its nodes' reports: tokens/s, FLOP/s and steps/s over a window of each
node's own clock, MFU against the GPUs' peak, the lowest rank's loss; restarts and silent nodes never
show as throughput."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from clusterctl.launcher.pure.training_metrics import (
    MIN_WINDOW_SECONDS, Peak, TrainingMeter, job_peak, table_peak, window_seconds,
)
from clusterctl.records.node_report import NodeMetrics

T0 = 1_800_000_000.0
H100 = "NVIDIA H100 80GB HBM3"


def metrics(at: float, tokens: float, flops: float = 0.0, step: int = 0, *, epoch: int = 1, ranks: int = 8,
            loss: float | None = None, loss_rank: int | None = None, gpu: str = H100) -> NodeMetrics:
    return NodeMetrics(at, ranks, epoch, step, at, tokens, flops, loss, step if loss is not None else None,
                       loss_rank if loss is not None else None, gpu=gpu)


@st.composite
def nodes_training(draw: st.DrawFn) -> tuple[list[tuple[float, float, float, float, float]], float]:
    """Nodes each processing tokens at its own steady rate, 10 steps a second, its clock off the agent's by
    its own offset, reporting every heartbeat of its own from its own phase: (tokens/s, FLOPs per token,
    clock offset, heartbeat, phase); and how often the agent looks (its summary interval)."""
    nodes = [(draw(st.floats(1.0, 1e7)), draw(st.floats(1.0, 1e9)), draw(st.floats(-3600.0, 3600.0)),
              draw(st.floats(1.0, 20.0)), draw(st.floats(0.0, 1.0)))
             for _ in range(draw(st.integers(1, 6)))]
    return nodes, draw(st.floats(2.0, 20.0))


def newest_report(node: tuple[float, float, float, float, float], look: float) -> tuple[NodeMetrics, float] | None:
    """What a node last sent by `look` (agent-clock seconds from T0), and when; None before its first report."""
    rate, per_token, offset, heartbeat, phase = node
    sent = math.floor((look - phase * heartbeat) / heartbeat) * heartbeat + phase * heartbeat
    if sent < 0:
        return None
    step = math.floor(sent * 10)
    node_clock = T0 + offset
    return NodeMetrics(node_clock + sent, 8, 1, step, node_clock + step / 10, rate * sent,
                       rate * per_token * sent, gpu=H100), T0 + sent


@settings(max_examples=200, deadline=None)
@given(nodes_training())
def test_tokens_flops_and_steps_per_second_are_the_nodes_rates_whatever_their_clocks_and_heartbeats(case) -> None:
    nodes, every = case
    meter = TrainingMeter(window=window_seconds(20.0))
    look = 0.0
    while look < 120.0:
        look += every
        told = [(f"node{i}", *sent) for i, node in enumerate(nodes) if (sent := newest_report(node, look))]
        meter = meter.observe(told)
    reading = meter.reading(T0 + look, gpus=8 * len(nodes), peak=Peak(989.0, "nvml", H100))
    assert reading is not None and reading.nodes == reading.nodes_reporting == len(nodes)
    tokens = sum(rate for rate, *_ in nodes)
    flops = sum(rate * per_token for rate, per_token, *_ in nodes)
    assert reading.tokens_per_s == pytest.approx(tokens, rel=1e-6)
    assert reading.flops_per_s == pytest.approx(flops, rel=1e-6)
    assert reading.mfu == pytest.approx(flops / (8 * len(nodes) * 989e12), rel=1e-6)
    assert reading.steps_per_s == pytest.approx(10.0, rel=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 20.0), st.floats(0.0, 1e6), st.booleans(), st.booleans()),
                min_size=1, max_size=40))
def test_a_node_whose_ranks_restart_never_shows_negative_or_made_up_throughput(steps) -> None:
    """Each look: time passes, tokens are processed, and maybe the node's ranks restarted (a new epoch) or
    their counters began again from 0 without one: the rates stay between 0 and the fastest real rate."""
    meter, t, tokens, epoch, fastest = TrainingMeter(), 0.0, 0.0, 1, 0.0
    for seconds, processed, restarted, counters_reset in steps:
        t += seconds
        fastest = max(fastest, processed / seconds)
        if restarted:
            epoch += 1
            tokens = 0.0
        elif counters_reset:
            tokens = 0.0
        tokens += processed
        meter = meter.observe([("node1", metrics(T0 + t, tokens, epoch=epoch), T0 + t)])
        reading = meter.reading(T0 + t, 8, Peak(None))
        assert reading is not None
        if reading.tokens_per_s is not None:
            assert 0.0 <= reading.tokens_per_s <= fastest * (1 + 1e-6)  # epoch times: ~1e-7 s apart


def test_after_a_restart_a_node_counts_from_its_second_report_and_the_old_counts_are_gone() -> None:
    meter = TrainingMeter()
    meter = meter.observe([("n1", metrics(T0, 0.0), T0)]).observe([("n1", metrics(T0 + 10, 1000.0), T0 + 10)])
    assert meter.reading(T0 + 10, 8, Peak(None)).tokens_per_s == pytest.approx(100.0)
    meter = meter.observe([("n1", metrics(T0 + 20, 50.0, epoch=2), T0 + 20)])  # restarted: 50 tokens since
    reading = meter.reading(T0 + 20, 8, Peak(None))
    assert reading.nodes == 0 and reading.tokens_per_s is None  # one sample of the new processes: measuring
    meter = meter.observe([("n1", metrics(T0 + 30, 550.0, epoch=2), T0 + 30)])
    assert meter.reading(T0 + 30, 8, Peak(None)).tokens_per_s == pytest.approx(50.0)


def test_a_node_not_heard_for_a_window_leaves_the_sum_and_one_that_joins_adds_to_it_from_its_second_report():
    meter = TrainingMeter(window=30.0)
    for t in (0, 10, 20):
        meter = meter.observe([("n1", metrics(T0 + t, 100.0 * t), T0 + t), ("n2", metrics(T0 + t, 300.0 * t), T0 + t)])
    assert meter.reading(T0 + 20, 16, Peak(None)).tokens_per_s == pytest.approx(400.0)
    for t in (30, 40, 50, 60):  # n2 went silent after 20 s; a spare joins at 50 s
        told = [("n1", metrics(T0 + t, 100.0 * t), T0 + t)]
        if t >= 50:
            told.append(("spare", metrics(T0 + t, 200.0 * (t - 50)), T0 + t))
        meter = meter.observe(told)
    reading = meter.reading(T0 + 60, 16, Peak(None))
    assert reading.tokens_per_s == pytest.approx(100.0 + 200.0)
    assert (reading.nodes, reading.nodes_reporting) == (2, 2)  # n2 not heard for 40 s: out of the window


def test_a_node_whose_counters_stop_while_it_stays_alive_drives_its_rate_to_zero_over_the_window() -> None:
    meter = TrainingMeter(window=30.0)
    for t in range(0, 31, 10):
        meter = meter.observe([("n1", metrics(T0 + t, 100.0 * t), T0 + t)])
    for t in range(40, 80, 10):  # hung in a collective: the liveness thread keeps `at` moving, no tokens
        meter = meter.observe([("n1", metrics(T0 + t, 3000.0), T0 + t)])
    assert meter.reading(T0 + 70, 8, Peak(None)).tokens_per_s == pytest.approx(0.0)


def test_the_loss_shown_is_the_lowest_ranks_that_reported_one_and_a_nan_is_shown_as_nan() -> None:
    meter = TrainingMeter().observe([
        ("n2", metrics(T0, 0.0, loss=2.5, loss_rank=8), T0),
        ("n1", metrics(T0, 0.0, loss=math.nan, loss_rank=0), T0),
        ("n3", metrics(T0, 0.0), T0),
    ])
    reading = meter.reading(T0, 24, Peak(None))
    assert reading.loss_rank == 0 and math.isnan(reading.loss)
    assert reading.tokens_per_s is None and reading.flops_per_s is None and reading.mfu is None
    assert reading.mfu_missing == ""  # no FLOPs reported: nothing to explain


def test_flops_without_a_known_peak_give_flop_per_s_and_say_why_there_is_no_mfu() -> None:
    meter = TrainingMeter()
    for t in (0, 10):
        meter = meter.observe([("n1", metrics(T0 + t, 0.0, 1e15 * t, gpu="NVIDIA L40S"), T0 + t)])
    reading = meter.reading(T0 + 10, 8, job_peak(None, meter.gpu_names()))
    assert reading.flops_per_s == pytest.approx(1e15) and reading.mfu is None
    assert reading.mfu_missing == ("clusterctl does not know the peak of 'NVIDIA L40S': set [job] gpu_peak_tflops "
                                   "in the spec")
    with_spec = meter.reading(T0 + 10, 8, job_peak(362.0, meter.gpu_names()))
    assert with_spec.mfu == pytest.approx(1e15 / (8 * 362e12)) and with_spec.peak_from == "spec"


def test_a_program_that_reports_nothing_has_no_training_metrics() -> None:
    assert TrainingMeter().observe([]).reading(T0, 8, Peak(989.0, "nvml")) is None


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0), ("NVIDIA H200", 989.0),
    ("NVIDIA H200 NVL", 835.0), ("NVIDIA B200", 2250.0), ("NVIDIA GB200", 2500.0), ("NVIDIA L40S", None),
    ("Tesla V100-SXM2-32GB", None),
])
def test_the_peak_table_knows_nvmls_names_of_the_training_gpus(name: str, tflops: float | None) -> None:
    assert table_peak(name) == tflops


def test_the_spec_peak_wins_and_without_it_the_gpu_model_must_be_one_known_to_the_table() -> None:
    assert job_peak(100.0, [H100]) == Peak(100.0, "spec", H100)
    assert job_peak(None, [H100, H100]) == Peak(989.0, "nvml", H100)
    assert "did not name their GPU model" in job_peak(None, []).missing
    assert "the nodes' GPUs differ ('NVIDIA A100-SXM4-80GB', 'NVIDIA H100 80GB HBM3')" in \
        job_peak(None, [H100, "NVIDIA A100-SXM4-80GB"]).missing
    assert job_peak(None, ["NVIDIA L40S"]).tflops is None


@given(st.floats(0.0, 1e4))
def test_the_window_covers_three_heartbeats_and_at_least_thirty_seconds(heartbeat: float) -> None:
    assert window_seconds(heartbeat) == max(MIN_WINDOW_SECONDS, 3 * heartbeat) >= 3 * heartbeat
