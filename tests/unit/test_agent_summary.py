"""The agent's summary file: what the supervisor and `status` read instead of node tables and rank files."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from clusterctl.records.agent_summary import (
    MAX_NAMES, PEAK_SOURCES, STATES, AgentSummary, TrainingMetrics, read_agent_summary, summary_path,
    write_agent_summary,
)
from clusterctl.records.versioned import RecordError

names = st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True), max_size=MAX_NAMES).map(tuple)
seconds = st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=0, max_value=200_000)
rates = st.none() | st.floats(min_value=0, max_value=1e30)
measured = st.none() | st.floats(allow_nan=False) | st.just(math.nan)
trainings = st.builds(
    TrainingMetrics, window_s=st.floats(min_value=1, max_value=600), nodes=counts, nodes_reporting=counts,
    gpus=counts, steps_per_s=rates, tokens_per_s=rates, flops_per_s=rates, mfu=rates, peak_tflops=rates,
    peak_from=st.sampled_from(PEAK_SOURCES), gpu=st.text(max_size=96), mfu_missing=st.text(max_size=200),
    loss=measured, loss_step=st.none() | counts, loss_rank=st.none() | counts, grad_norm=measured,
    grad_norm_step=st.none() | counts, grad_norm_rank=st.none() | counts)
summaries = st.builds(
    AgentSummary, job_id=st.from_regex(r"[0-9]{1,8}", fullmatch=True), launch=st.sampled_from(["0", "restart-3"]),
    at=seconds, interval=st.floats(min_value=0.5, max_value=60), state=st.sampled_from(STATES), nodes=counts,
    reporting=counts, silent=names, stopped=names, drained=names, min_step=st.none() | counts,
    max_step=st.none() | counts, refused=st.dictionaries(st.sampled_from(["unsigned", "too large"]), counts),
    message=st.text(max_size=80), training=st.none() | trainings)


@given(summaries)
def test_a_summary_reads_back_as_written(tmp_path_factory: pytest.TempPathFactory, summary: AgentSummary) -> None:
    job_dir = tmp_path_factory.mktemp("job")
    write_agent_summary(job_dir, summary)
    assert read_agent_summary(job_dir) == summary


def test_no_summary_yet_is_none_and_an_old_one_is_stale(tmp_path: Path) -> None:
    assert read_agent_summary(tmp_path) is None
    summary = AgentSummary("7", "0", at=1000.0, interval=2.0, state="watching", nodes=4, reporting=4)
    assert not summary.stale(1000.0 + 36)
    assert summary.stale(1000.0 + 37)


def test_a_summary_of_an_older_agent_reads_without_training_metrics(tmp_path: Path) -> None:
    summary = AgentSummary("7", "0", 1.0, 2.0, "watching", 4, 4, min_step=10, max_step=12)
    body = summary.to_json()
    del body["training"]
    summary_path(tmp_path).write_text(json.dumps({**body, "version": 1}))
    assert read_agent_summary(tmp_path) == summary


TRAINING = TrainingMetrics(30.0, 4, 4, 32, 1.9, 1_638_400.0, 4.0e15, 0.126, 989.0, "nvml", "NVIDIA H100 80GB HBM3",
                           "", 2.31, 1200, 0, 0.8, 1200, 0)


@pytest.mark.parametrize("change, said", [
    ({"mfu": -0.1}, "`mfu`"), ({"tokens_per_s": float("inf")}, "`tokens_per_s`"), ({"peak_from": "guess"}, "peak_from"),
    ({"loss": "NaN!"}, "`loss`"), ({"gpus": -1}, "`gpus`"), ({"gpu": "x" * 600}, "`gpu` is longer"),
])
def test_damaged_training_metrics_refuse_the_summary_saying_what_is_wrong(tmp_path: Path, change: dict[str, object],
                                                                         said: str) -> None:
    write_agent_summary(tmp_path, AgentSummary("7", "0", 1.0, 2.0, "watching", 4, 4, training=TRAINING))
    assert read_agent_summary(tmp_path) == AgentSummary("7", "0", 1.0, 2.0, "watching", 4, 4, training=TRAINING)
    path = summary_path(tmp_path)
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, "training": {**body["training"], **change}}))
    with pytest.raises(RecordError) as caught:
        read_agent_summary(tmp_path)
    assert f"{path}: training" in str(caught.value) and said in str(caught.value)


@pytest.mark.parametrize("change, said", [
    ({"version": 3}, "version"), ({"state": "dancing"}, "state 'dancing'"), ({"at": -1}, "`at`"),
    ({"silent": ["bad name!"]}, "silent"), ({"refused": {"unsigned": -3}}, "refused"),
    ({"silent": [f"n{i}" for i in range(MAX_NAMES + 1)]}, "at most"),
])
def test_a_damaged_or_foreign_summary_is_refused_saying_what_is_wrong(tmp_path: Path, change: dict[str, object],
                                                                      said: str) -> None:
    write_agent_summary(tmp_path, AgentSummary("7", "0", 1.0, 2.0, "watching", 4, 4))
    path = summary_path(tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(RecordError) as caught:
        read_agent_summary(tmp_path)
    assert str(path) in str(caught.value) and said in str(caught.value)


def test_a_fifo_planted_as_the_summary_is_refused_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(summary_path(tmp_path))
    with pytest.raises(RecordError, match="not a regular file|FIFO"):
        read_agent_summary(tmp_path)
