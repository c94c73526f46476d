"""How far a run got, as `clusterctl status` says it: the ETA, the newest checkpoint (with multi-level
checkpoints, where its parts are held) and the goodput so far; in the text and in `--json`."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import clusterctl.launcher.login.cli as cli_module
from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.pure.spec import parse_spec
from clusterctl.launcher.shared.checkpoint_inventory import (
    FlushedCheckpoint, inventory_text, write_complete, write_inventory,
)
from clusterctl.launcher.shared.runs import RunDir, create_run
from clusterctl.records.agent_summary import AgentSummary, TrainingMetrics, write_agent_summary
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy
from clusterctl.records.run_journal import BlamedNode, RecoveredInAllocation, Submitted
from clusterctl.slurm.jobs import JobReport
from tests.conftest import REPO

class RunningSlurm:
    """Slurm's answer: job 7, submitted 130 s before the test began, RUNNING on `nodes` since 30 s after: 100 s
    of its 130 trained."""

    def __init__(self) -> None:
        self.now = time.time()
        self.submitted = self.now - 130.0
        self.nodes = "node[1-2]"

    def queue(self, job_ids=()):
        return {j: JobReport(j, "toy", "RUNNING", "None", self.nodes, None, None, self.submitted,
                             self.submitted + 30.0, 0.0) for j in job_ids}

    def accounting(self, job_ids):
        return {}


@pytest.fixture
def slurm(monkeypatch) -> RunningSlurm:
    answer = RunningSlurm()
    monkeypatch.setattr(cli_module, "Slurm", lambda: answer)
    monkeypatch.setenv("COLUMNS", "200")
    return answer


def example_without_total_steps() -> str:
    """The example trainer's spec without its total step count (each story sets its own, or none)."""
    text = (REPO / "examples" / "toy_trainer.toml").read_text()
    return re.sub(r"^total_steps = .*\n", "", text, flags=re.M).replace('"{total_steps}"', '"60"')

def a_run(tmp_path: Path, slurm: RunningSlurm, *, tiers: bool) -> RunDir:
    text = example_without_total_steps().replace('time = "10:00"\n',
                                                                       'time = "10:00"\ntotal_steps = 5000\n')
    if tiers:
        text = text.replace('validator = "manifest"\n', "tiers = true\nflush_every_steps = 100\n")
    run = create_run(tmp_path / "llm", parse_spec(text, "toy.toml", base_dir=REPO / "examples"), text)
    run.record(Submitted(at=slurm.submitted, attempt=1, job_id="7"))
    run.job_dir("7").mkdir(parents=True)
    metrics = TrainingMetrics(window_s=30.0, nodes=2, nodes_reporting=2, gpus=16, steps_per_s=0.5)
    write_agent_summary(run.job_dir("7"), AgentSummary("7", "0", slurm.now, 2.0, "watching", 2, 2, min_step=1200,
                                                       max_step=1200, training=metrics))
    return run


def status(run: RunDir, *options: str) -> str:
    result = CliRunner().invoke(cli, ["status", str(run.path), *options])
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split())


def test_a_running_job_says_when_it_ends_and_how_much_of_its_time_trained(tmp_path, slurm):
    run = a_run(tmp_path, slurm, tiers=False)

    shown = status(run)
    assert "ETA 2.1 h: 3,800 steps left at 0.5 steps/s (2.7 h at the run's goodput so far, 77%)" in shown
    assert "no complete checkpoint yet in " in shown
    assert re.search(r"goodput so far 77% \(10\d\.\d s training of 2\.2 min since the first submission; lost: "
                     r"queue 30\.0 s\)", shown)
    data = json.loads(status(run, "--json"))
    assert (data["eta"]["state"], data["eta"]["steps_left"], data["eta"]["seconds"]) == ("estimate", 3800, 7600.0)
    assert data["goodput"]["goodput"] == pytest.approx(100 / 130, abs=0.01)
    assert data["checkpoint"]["step"] is None


def multi_level_holdings(saved_at: float) -> dict[str, CheckpointHoldings]:
    """Checkpoint 1200 saved by node1 (slot 0) and node2 (slot 1), each part kept on its node and on the other."""
    return {node: CheckpointHoldings(node, (HeldCopy(1200, node, "local", slot, 2, saved_at, 2.0),
                                            HeldCopy(1200, other, "buddy", 1 - slot, 2, saved_at + 1.0, 2.0)), saved_at + 1.0)
            for slot, (node, other) in enumerate((("node1", "node2"), ("node2", "node1")))}


def test_with_multi_level_checkpoints_it_says_where_the_newest_ones_parts_are_and_what_reached_shared_storage(
        tmp_path, slurm):
    run = a_run(tmp_path, slurm, tiers=True)
    write_inventory(run.job_dir("7"), inventory_text(multi_level_holdings(slurm.now - 45.0)))
    write_complete(run.path / "checkpoints", FlushedCheckpoint(1100, ("node1", "node2"), 2.0))

    shown = status(run)
    assert re.search(r"newest complete checkpoint: step 1200 \(saved [0-9T:Z-]+, 4\d\.\d s ago\); parts of 2 nodes: "
                     r"2 on their node, 2 on a buddy, 0 on shared storage; newest flushed whole to shared storage: step 1100",
                     shown)
    tiers = json.loads(status(run, "--json"))["checkpoint"]["tiers"]
    assert tiers == {"step": 1200, "parts": 2, "local": 2, "buddy": 2, "shared": 0, "saved_at": slurm.now - 45.0}


def test_a_node_given_back_takes_its_copies_with_it_and_the_buddy_copy_keeps_the_checkpoint_complete(
        tmp_path, slurm):
    run = a_run(tmp_path, slurm, tiers=True)
    write_inventory(run.job_dir("7"), inventory_text(multi_level_holdings(slurm.now - 45.0)))
    run.record(RecoveredInAllocation(at=slurm.now - 10.0, job_id="7", restart=1, blame=(BlamedNode("node2", "xid 79"),),
                                     nodes=("node1", "node3"), given_back=("node2",), checkpoint_step=1200))
    slurm.nodes = "node[1,3]"

    shown = status(run)
    assert "step 1200 (saved " in shown and "parts of 2 nodes: 1 on their node, 1 on a buddy, 0 on shared storage" in shown
