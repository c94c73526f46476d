"""The job's metrics as a node_exporter textfile: the exact text, its labels escaped, written by the agent."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from clusterctl.launcher.pure.job_metrics_text import (
    TEXTFILE_DIR_ENV, escape_label_value, job_metrics_text, textfile_name,
)
from clusterctl.records.agent_summary import AgentSummary, TrainingMetrics, read_agent_summary
from tests.unit.test_allocation_agent import training_agent

TRAINING = TrainingMetrics(30.0, 4, 4, 32, 1.9, 1_638_400.0, 4.0e15, 0.126, 989.0, "nvml", "NVIDIA H100 80GB HBM3",
                           "", 2.31, 1200, 0, 0.8, 1200, 0)
SUMMARY = AgentSummary("4242", "0", 1795305600.0, 2.0, "watching", 4, 4, min_step=1199, max_step=1200,
                       training=TRAINING)

GOLDEN = '''\
# HELP clusterctl_job_summary_timestamp_seconds When the job's agent wrote the summary these come from
# TYPE clusterctl_job_summary_timestamp_seconds gauge
clusterctl_job_summary_timestamp_seconds{job_id="4242",run="llama-8b"} 1795305600
# HELP clusterctl_job_step The furthest step a rank of the job reported
# TYPE clusterctl_job_step gauge
clusterctl_job_step{job_id="4242",run="llama-8b"} 1200
# HELP clusterctl_job_nodes Nodes in the job's running step
# TYPE clusterctl_job_nodes gauge
clusterctl_job_nodes{job_id="4242",run="llama-8b"} 4
# HELP clusterctl_job_nodes_reporting Nodes whose reporter the agent heard within the silence limit
# TYPE clusterctl_job_nodes_reporting gauge
clusterctl_job_nodes_reporting{job_id="4242",run="llama-8b"} 4
# HELP clusterctl_job_steps_per_second Training steps per second (median over the nodes)
# TYPE clusterctl_job_steps_per_second gauge
clusterctl_job_steps_per_second{job_id="4242",run="llama-8b"} 1.9
# HELP clusterctl_job_tokens_per_second Tokens per second, summed over the job's nodes
# TYPE clusterctl_job_tokens_per_second gauge
clusterctl_job_tokens_per_second{job_id="4242",run="llama-8b"} 1638400
# HELP clusterctl_job_flops_per_second Model FLOP/s, summed over the job's nodes
# TYPE clusterctl_job_flops_per_second gauge
clusterctl_job_flops_per_second{job_id="4242",run="llama-8b"} 4000000000000000
# HELP clusterctl_job_mfu_ratio Model FLOPs utilisation (0-1) against the GPUs' peak
# TYPE clusterctl_job_mfu_ratio gauge
clusterctl_job_mfu_ratio{job_id="4242",run="llama-8b"} 0.126
# HELP clusterctl_job_loss The loss the program last reported
# TYPE clusterctl_job_loss gauge
clusterctl_job_loss{job_id="4242",run="llama-8b"} 2.31
# HELP clusterctl_job_grad_norm The gradient norm the program last reported
# TYPE clusterctl_job_grad_norm gauge
clusterctl_job_grad_norm{job_id="4242",run="llama-8b"} 0.8
'''


def test_the_jobs_metrics_as_node_exporter_reads_them():
    assert job_metrics_text(SUMMARY, "llama-8b") == GOLDEN


def test_what_the_program_does_not_report_is_left_out_not_zero():
    text = job_metrics_text(AgentSummary("7", "0", 10.0, 2.0, "watching", 2, 1), "toy")
    names = [f.name for f in text_string_to_metric_families(text)]
    assert names == ["clusterctl_job_summary_timestamp_seconds", "clusterctl_job_nodes", "clusterctl_job_nodes_reporting"]


def test_a_nan_loss_is_exported_as_nan():
    text = job_metrics_text(replace(SUMMARY, training=replace(TRAINING, loss=float("nan"))), "toy")
    assert 'clusterctl_job_loss{job_id="4242",run="toy"} NaN\n' in text


def test_a_run_name_with_quotes_backslashes_and_newlines_is_escaped():
    assert escape_label_value('a "b" \\c\nd') == 'a \\"b\\" \\\\c\\nd'
    text = job_metrics_text(SUMMARY, 'evil"} 1\nfake_metric 2')
    assert 'run="evil\\"} 1\\nfake_metric 2"' in text
    assert "fake_metric" not in [f.name for f in text_string_to_metric_families(text)]


@given(st.text(max_size=40))
def test_any_run_name_reads_back_as_written_on_every_series(name):
    families = list(text_string_to_metric_families(job_metrics_text(SUMMARY, name)))
    assert len(families) == 10
    assert {s.labels["run"] for f in families for s in f.samples} == {name}
    assert all(set(s.labels) == {"job_id", "run"} for f in families for s in f.samples)


def test_the_agent_writes_the_textfile_when_the_jobs_environment_names_a_directory(tmp_path):
    shell = training_agent(tmp_path / "job")
    shell.environ = {**shell.environ, TEXTFILE_DIR_ENV: str(tmp_path / "textfiles")}
    assert shell.run(None) == 0
    summary = read_agent_summary(shell.job_dir)
    assert summary is not None
    assert [p.name for p in (tmp_path / "textfiles").iterdir()] == [textfile_name("42")] == ["clusterctl_job_42.prom"]
    assert (tmp_path / "textfiles" / "clusterctl_job_42.prom").read_text() == job_metrics_text(summary, "toy")
