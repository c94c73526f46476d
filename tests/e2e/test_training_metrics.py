"""The training, as `clusterctl status` shows it on the real testbed (issue #26): the toy trainer reports its
tokens, FLOPs and loss through `clusterctl.progress.beat`, its nodes' reporters carry them to the job's
agent, and `status --json`, read while the job runs, shows tokens/s and an MFU that agree with what the
trainer itself logged, the MFU against the spec's peak (the testbed's emulated NVML names an H100, which
the spec's peak overrides: the testbed's "GPUs" compute nothing like one); the job's training series keeps
those figures over time and `report --html` draws the loss from it."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest

from clusterctl_testbed.slurm_config import job_metrics_dir

from tests.conftest import REPO, clusterctl_on
from tests.e2e.supervised_runs import finished, supervised, wait_for_agent_status

# Nothing here differs between Slurm releases (the path is the job's own: files, UDP, the agent's summary).
pytestmark = [pytest.mark.e2e, pytest.mark.one_release]

STEPS, STEP_TIME, TOKENS, PARAMS, PEAK = 700, 0.1, 2048, 1e9, 989.0
GPUS = 16


def _spec(cluster, tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f"""\
[job]
name = "metrics"
nodes = 2
gpus_per_node = 8
gpu_peak_tflops = {PEAK}
sbatch_options = ["--exclusive"]
[launch]
command = ["{cluster.python}", "toy_trainer.py", "--checkpoint-dir", "{{checkpoint_dir}}", "--steps", "{STEPS}",
           "--checkpoint-every", "100", "--step-time", "{STEP_TIME}", "--log-every", "25",
           "--tokens-per-step", "{TOKENS}", "--model-params", "{PARAMS:g}"]
workdir = "{REPO / 'examples'}"
[parallel]
tp = 8
pp = 2
[checkpoint]
dir = "{{run_dir}}/checkpoints"
validator = "manifest"
resume_args = ["--resume", "{{path}}"]
[restart]
poll_seconds = 0.5
""")
    return path


LOGGED = re.compile(r"step (\d+) took [0-9.]+ s; loss ([0-9.]+); (\d+) tokens/s \(the job's, since step (\d+)\)")


def test_status_json_shows_the_tokens_per_second_and_mfu_the_trainer_logged(cluster, tmp_path):
    proc, run_dir = supervised(cluster, tmp_path, _spec(cluster, tmp_path))

    def measured(agent: dict) -> bool:
        training = agent.get("training") or {}
        # Every node heard twice within the window, well into the run (past start-up and the first checkpoint).
        return training.get("nodes") == 2 and training.get("mfu") is not None and (agent.get("max_step") or 0) > 300

    agent = wait_for_agent_status(cluster, run_dir, proc, measured, "tokens/s and MFU in status --json")
    # The admins' node_exporter sees the job too (the testbed's healthd.toml names job_metrics_dir).
    exported = job_metrics_dir(cluster.layout) / f"clusterctl_job_{agent['job_id']}.prom"
    shown = {**agent["training"], "max_step": agent["max_step"], "job_id": agent["job_id"], "at": agent["at"],
             "prom": exported.read_text() if exported.exists() else ""}
    text = clusterctl_on(cluster, "status", str(run_dir)).stdout
    out = finished(cluster, proc, timeout=240)
    # What the trainer's rank 0 logged (the job's log): the job's tokens/s over each 25-step interval.
    logs = "\n".join(path.read_text() for path in (run_dir / "logs").glob("*.out"))
    logged = [(int(m[1]), float(m[2]), int(m[3])) for m in LOGGED.finditer(logs)]
    assert logged, out + logs[-3000:]
    around = [rate for step, _, rate in logged if shown["max_step"] - 300 <= step <= shown["max_step"] + 25]
    assert around, (shown, logged)
    expected = statistics.median(around)
    assert shown["tokens_per_s"] == pytest.approx(expected, rel=0.25), (shown, around)
    assert shown["flops_per_s"] == pytest.approx(6 * PARAMS * shown["tokens_per_s"], rel=1e-6)
    assert (shown["peak_tflops"], shown["peak_from"], shown["gpus"]) == (PEAK, "spec", GPUS)
    assert shown["mfu"] == pytest.approx(6 * PARAMS * expected / (GPUS * PEAK * 1e12), rel=0.25)
    assert shown["gpu"] == "NVIDIA H100 80GB HBM3"  # what the nodes' (emulated) NVML named
    assert shown["steps_per_s"] == pytest.approx(expected / (GPUS * TOKENS), rel=0.25)
    # The loss shown is rank 0's at the step beside it: the toy's pretend curve.
    assert shown["loss_rank"] == 0 and shown["loss"] == pytest.approx(2.0 + 8.0 / math.sqrt(1 + shown["loss_step"] / 10))
    assert "MFU" in text and "(peak 989 TFLOP/s per GPU from the spec)" in text and "tokens/s" in text, text
    # The agent kept the training over time: the summary status showed is a point of the job's series, and
    # `report --html` draws the loss from it.
    lines = (run_dir / "jobs" / shown["job_id"] / "training-series.jsonl").read_text().splitlines()
    series = [json.loads(line) for line in lines]
    assert len(series) >= 2, lines
    # A point at most every 10 s while the step runs: the one nearest what status showed is of the same rate.
    point = min(series, key=lambda p: abs(p["at"] - shown["at"]))
    assert abs(point["at"] - shown["at"]) <= 12, (point, shown)
    assert point["tokens_per_s"] == pytest.approx(shown["tokens_per_s"], rel=0.1)
    assert f'clusterctl_job_mfu_ratio{{job_id="{shown["job_id"]}",run="metrics"}}' in shown["prom"], shown["prom"]
    # The job ended: its agent took its file away (node_exporter would export its last figures for ever).
    assert not list(job_metrics_dir(cluster.layout).glob("clusterctl_job_*")), out
    drawn = tmp_path / "report.html"
    clusterctl_on(cluster, "report", str(run_dir), "--html", str(drawn))
    assert 'aria-label="loss over time"' in drawn.read_text()
