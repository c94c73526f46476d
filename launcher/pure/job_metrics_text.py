"""The job's training metrics in Prometheus' text exposition format, for node_exporter's textfile collector.

The job's agent already writes its summary every interval; when a textfile directory is set (the
job's `CLUSTERCTL_METRICS_TEXTFILE_DIR`, else the admins' `job_metrics_dir`: clusterctl/job_metrics_file.py,
which also names the file and removes it) it also writes this text there, atomically, so node_exporter
(`--collector.textfile.directory`) exports it.  Labels are the job id and the run's name only: one
series per metric per job, never per node or rank (a 100,000-rank job is still one series each).
Format: https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format
"""

from __future__ import annotations

import math

from clusterctl.records.agent_summary import AgentSummary

METRICS: tuple[tuple[str, str], ...] = (
    ("clusterctl_job_summary_timestamp_seconds", "When the job's agent wrote the summary these come from"),
    ("clusterctl_job_step", "The furthest step a rank of the job reported"),
    ("clusterctl_job_nodes", "Nodes in the job's running step"),
    ("clusterctl_job_nodes_reporting", "Nodes whose reporter the agent heard within the silence limit"),
    ("clusterctl_job_steps_per_second", "Training steps per second (median over the nodes)"),
    ("clusterctl_job_tokens_per_second", "Tokens per second, summed over the job's nodes"),
    ("clusterctl_job_flops_per_second", "Model FLOP/s, summed over the job's nodes"),
    ("clusterctl_job_mfu_ratio", "Model FLOPs utilisation (0-1) against the GPUs' peak"),
    ("clusterctl_job_loss", "The loss the program last reported"),
    ("clusterctl_job_grad_norm", "The gradient norm the program last reported"),
)


def escape_label_value(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample_value(value: float) -> str:
    """A sample value: Go's float syntax, with NaN, +Inf and -Inf as the format spells them."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def job_metrics_text(summary: AgentSummary, run_name: str) -> str:
    """The exposition text of one job's summary; a metric the summary lacks (no training reported,
    no rate yet) is left out rather than written as 0."""
    t = summary.training
    values: dict[str, float | None] = {
        "clusterctl_job_summary_timestamp_seconds": summary.at,
        "clusterctl_job_step": summary.max_step,
        "clusterctl_job_nodes": summary.nodes,
        "clusterctl_job_nodes_reporting": summary.reporting,
        "clusterctl_job_steps_per_second": t.steps_per_s if t else None,
        "clusterctl_job_tokens_per_second": t.tokens_per_s if t else None,
        "clusterctl_job_flops_per_second": t.flops_per_s if t else None,
        "clusterctl_job_mfu_ratio": t.mfu if t else None,
        "clusterctl_job_loss": t.loss if t else None,
        "clusterctl_job_grad_norm": t.grad_norm if t else None,
    }
    labels = f'{{job_id="{escape_label_value(summary.job_id)}",run="{escape_label_value(run_name)}"}}'
    lines: list[str] = []
    for name, help_text in METRICS:
        value = values[name]
        if value is None:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{labels} {sample_value(value)}"]
    return "\n".join(lines) + "\n"
