"""A Lightning user's and a Hugging Face Trainer user's training on the real testbed (issue #44):
examples/lightning_trainer.py and examples/hf_trainer.py, whose only clusterctl line is `ClusterctlCallback()`
in the Trainer's callbacks, each run by `clusterctl submit --supervise`;
`clusterctl status` read while it trains shows the loss and tokens/s the callback beat, carried by the node's
reporter to the job's agent, and they agree with what the trainer itself says it did."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, clusterctl_on
from tests.e2e.supervised_runs import finished, supervised, wait_for_agent_status

# Nothing here differs between Slurm releases (the path is the job's own: files, UDP, the agent's summary).
pytestmark = [pytest.mark.e2e, pytest.mark.one_release]

# (example, its framework, steps, seconds a step at least, tokens a step: the example's BATCH × SEQUENCE)
EXAMPLES = {"lightning": ("lightning_trainer.py", "lightning", 400, 0.1, 8 * 32),
            "hf-trainer": ("hf_trainer.py", "transformers", 250, 0.05, 8 * 16)}


def _spec(cluster, tmp_path: Path, script: str, steps: int, step_time: float) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f"""\
[job]
name = "callbacks"
nodes = 1
gpus_per_node = 1

[launch]
command = ["{cluster.python}", "{script}", "--steps", "{steps}", "--step-time", "{step_time}"]
workdir = "{REPO / 'examples'}"

[checkpoint]
dir = "{{run_dir}}/checkpoints"

[restart]
poll_seconds = 0.5
""")
    return path


@pytest.mark.parametrize("example", [
    "lightning",
    # The same path (a callback's beats through the reporter to the agent) with another framework's loop: kept
    # out of every submission's CI for its 45 minutes (about 1.5 min); scripts/test-matrix.sh runs it.
    pytest.param("hf-trainer", marks=pytest.mark.matrix_only)])
def test_a_framework_run_shows_the_loss_and_tokens_per_second_its_callback_beat(cluster, tmp_path, example):
    script, framework, steps, step_time, tokens_a_step = EXAMPLES[example]
    pytest.importorskip(framework, reason=f"{framework} is not installed (scripts/setup.sh with CLUSTERCTL_TORCH=1)")
    proc, run_dir = supervised(cluster, tmp_path, _spec(cluster, tmp_path, script, steps, step_time))

    def trained(agent: dict) -> bool:
        training = agent.get("training") or {}
        return bool(training.get("tokens_per_s")) and training.get("loss") is not None and \
            (agent.get("max_step") or 0) > steps // 4

    training = wait_for_agent_status(cluster, run_dir, proc, trained, "the loss and tokens/s in status --json")[
        "training"]
    text = clusterctl_on(cluster, "status", str(run_dir)).stdout
    out = finished(cluster, proc, timeout=240)
    logs = "\n".join(path.read_text() for path in (run_dir / "logs").glob("*.out"))
    done = re.search(rf"{example}: (\d+) steps in ([0-9.]+) s", logs)
    assert done and int(done[1]) == steps, out + logs[-3000:]
    # The trainer's own rate over its whole run (the agent's window is a later stretch of it).
    said = steps * tokens_a_step / float(done[2])
    assert said * 0.6 <= training["tokens_per_s"] <= said * 2.0, (training, said)
    assert math.isfinite(training["loss"]) and training["loss"] > 0, training
    assert "tokens/s" in text and "loss" in text, text
