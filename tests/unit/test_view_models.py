"""What `clusterctl status` and `report` show, pinned: the JSON of `--json` and the terminal text.

One run with every kind of event the views show (a node failure with blame and evidence, a
resubmission, what each attempt ran (its experiment record), restarts inside the allocation with and without a blamed node, a straggler, rank
maps with and without a plan summary, a step-time table, complete and skipped checkpoints) is
shown through the command line, and the output is compared with golden files
(tests/data/golden/views/; UPDATE_GOLDEN=1 rewrites them when a change is intended).

The run lives under a fresh directory of fixed length in /tmp (`/tmp/cg` and 8 characters), shown
in the golden files as `/tmp/cg________`, so the terminal tables wrap the same on every machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import clusterctl.launcher.login.cli as cli_module
from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.pure.spec import load_spec, parse_spec
from clusterctl.launcher.shared.checkpoint_inventory import FlushedCheckpoint, write_complete
from clusterctl.launcher.shared.runs import create_run, spec_document
from clusterctl.records.experiment_record import CodeVersion, ExperimentRecord, write_experiment_record
from clusterctl.records.node_step_times import NodeStepTime, NodeStepTimes, write_node_step_times
from clusterctl.records.rank_map import JobRankMap, PlanSummary, RankMap, write_rank_map
from clusterctl.records.run_journal import (
    BlamedNode, Decided, DecisionAction, EventKind, OutcomeKind, RecoveredInAllocation, Resumed, RunEnded, SlurmTimes,
    StragglerFound, Submitted,
)
from clusterctl.records.training_series import TrainingPoint, append_training_point
from clusterctl.slurm.commands import Completed, Slurm
from tests.conftest import REPO
from tests.golden import assert_golden

DATA = REPO / "tests" / "data" / "slurm"
SHOWN_ROOT = "/tmp/cg________"


def recorded_slurm(argv: list[str], timeout: float) -> Completed:
    """The testbed's recorded squeue/sacct answers (jobs 1-6: job 4 FAILED, 5 CANCELLED, 6 RUNNING)."""
    if argv[:2] == ["squeue", "--json"]:
        return Completed(0, (DATA / "squeue.json").read_text(), "")
    if argv[:2] == ["sacct", "--json"]:
        return Completed(0, (DATA / "sacct.json").read_text(), "")
    if argv[:2] == ["sbatch", "--version"]:
        return Completed(0, "slurm-wlm 22.05.8\n", "")
    return Completed(1, "", f"unexpected {argv}")


@pytest.fixture
def root(monkeypatch) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cg", dir="/tmp"))
    assert len(str(path)) == len(SHOWN_ROOT)
    monkeypatch.setattr(cli_module, "Slurm", lambda: Slurm(recorded_slurm))
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(path))
    monkeypatch.setenv("COLUMNS", "120")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _checkpoint(directory: Path, step: int, written_at: float, save_seconds: float) -> None:
    (directory / f"step-{step:08d}").mkdir(parents=True)
    payload = json.dumps({"step": step}).encode()
    (directory / f"step-{step:08d}" / "params.json").write_bytes(payload)
    (directory / f"step-{step:08d}" / "manifest.json").write_text(json.dumps({
        "step": step, "params_sha256": hashlib.sha256(payload).hexdigest(), "written_at": written_at,
        "save_seconds": save_seconds}))


def a_run_with_every_kind_of_event(root: Path) -> Path:
    """Attempt 1 (job 4) lost node3 to an Xid; attempt 2 (job 5) restarted twice inside its
    allocation (the first resumed node4 from node2's copy on node1), found a straggler, and completed."""
    run = create_run(root / "llm", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    checkpoints = run.path / "checkpoints"
    for step, written_at in ((10, 140.0), (20, 170.0), (30, 420.0)):
        _checkpoint(checkpoints, step, written_at, 2.5)
    (checkpoints / "step-00000040").mkdir()  # cut off before its manifest
    blame = BlamedNode("node3", "healthd: xid 79 gpu3", ("epilog record: xid 79 on gpu3", "drain reason: healthd"), 9e12)
    run.record(Submitted(at=100.0, attempt=1, job_id="4"))
    run.record(Decided(at=201.0, attempt=1, job_id="4", state="FAILED", exit_code=3, outcome=OutcomeKind.NODE_FAILURE,
                       message="FAILED (exit 3); blamed node3", checkpoint_step=20,
                       checkpoint=str(checkpoints / "step-00000020"), action=DecisionAction.RESUBMIT,
                       times=SlurmTimes(100.0, 110.0, 200.0), blame=(blame,)))
    run.record(Submitted(at=210.0, attempt=2, job_id="5", resume_from=str(checkpoints / "step-00000020"),
                         exclude="node3"))
    run.record(RecoveredInAllocation(at=300.0, job_id="5", restart=1,
                                     blame=(BlamedNode("node2", "not responding for 60 s", ("sinfo: node2 DOWN*",)),),
                                     nodes=("node1", "node4"), given_back=("node2",), checkpoint_step=20,
                                     phases=(("stop", 3.0), ("plan", 0.5), ("start", 4.25))))
    run.record(Resumed(at=303.0, job_id="5", restart=1, step=20, nodes=2, tiers=(("local", 1), ("buddy", 1)),
                       buddy_copies=("node2's on node1",), reported=2, read_seconds=4.25, slowest_node="node4"))
    run.record(RecoveredInAllocation(at=350.0, job_id="5", restart=2, blame=(), nodes=("node1", "node4"),
                                     checkpoint_step=None, phases=(("stop", 1.0),),
                                     reason="every rank hung at once; started again on the same nodes"))
    run.record(StragglerFound(at=380.0, job_id="5", node="node4", ranks=(8, 9, 10, 11), ratio=1.43, seconds=0.0715,
                              reference=0.05, steps=40, since_step=25, lost_s=12.5,
                              evidence=("rank 9: 0.0715 s/step over 40 steps",),
                              hardware=("gpu1: clocks throttled (thermal)",), action="excluded",
                              blame=(BlamedNode("node4", "straggler"),), drain="drained: healthd: straggler"))
    run.record(Decided(at=500.0, attempt=2, job_id="5", state="COMPLETED", exit_code=0, outcome=OutcomeKind.COMPLETED,
                       message="completed", checkpoint_step=30, checkpoint=str(checkpoints / "step-00000030"),
                       action=DecisionAction.DONE, times=SlurmTimes(210.0, 230.0, 490.0), blame=()))
    run.record(RunEnded(kind=EventKind.DONE, at=500.0, message="completed"))
    for job, launch, at, step, loss in (("4", "0", 150.0, 12, 6.25), ("4", "0", 190.0, 21, 5.5),
                                         ("5", "0", 290.0, 24, 5.25), ("5", "restart-2", 480.0, 31, math.nan)):
        run.job_dir(job).mkdir(parents=True, exist_ok=True)
        append_training_point(run.job_dir(job), TrainingPoint(at, job, launch, step, steps_per_s=0.5,
                                                              tokens_per_s=4096.0, mfu=0.41, loss=loss))
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    command = ("python3", "toy_trainer.py", "--checkpoint-dir", str(checkpoints))
    workdir = "/home/alice/llm"
    write_experiment_record(run.attempt_dir(1), ExperimentRecord(
        1, 99.5, "0.2.0", command, "fineweb-edu [v3]", CodeVersion(workdir, "1a2b3c4d5e6f" * 3 + "7a8b", False),
        spec_document(spec)))
    fewer_spares = spec_document(spec)
    fewer_spares["job"] = {**fewer_spares["job"], "spare_nodes": 1}
    write_experiment_record(run.attempt_dir(2), ExperimentRecord(
        2, 209.5, "0.2.0", (*command, "--resume", str(checkpoints / "step-00000020")), "fineweb-edu [v3]",
        CodeVersion(workdir, "1a2b3c4d5e6f" * 3 + "7a8b", True), fewer_spares))
    write_rank_map(run.job_dir("4"), JobRankMap("4", "node[1-3]", RankMap(("node1", "node2", "node3"), 4), 20004))
    write_rank_map(run.job_dir("5"), JobRankMap("5", "node[1-2,4-5]", RankMap(("node2", "node1", "node4"), 4), 20005,
                                                ("node5",), PlanSummary("depth-first order", 0, 2, 1)))
    nodes = tuple(NodeStepTime(f"node{i}", (4 * i - 4, 4 * i - 3, 4 * i - 2, 4 * i - 1), 0.05 + 0.001 * i,
                               (0.05 + 0.001 * i) / 0.051, "ok", 0.0) for i in range(1, 11))
    nodes += (NodeStepTime("node11", (), None, None, "ok"),
              NodeStepTime("node12", (44,), 0.0715, 1.43, "straggler", 12.5))
    write_node_step_times(run.job_dir("5"), NodeStepTimes("5", 480.0, 60, 0.051, 12.5, nodes))
    return run.path


def _shown(root: Path, text: str) -> str:
    return text.replace(str(root), SHOWN_ROOT)


def _invoke(root: Path, *argv: str) -> str:
    result = CliRunner().invoke(cli, list(argv))
    assert result.exit_code == 0, result.output
    return _shown(root, result.stdout)


def test_status_json_and_text_are_pinned(root):
    run = a_run_with_every_kind_of_event(root)

    assert_golden("views/status.json", _invoke(root, "status", str(run), "--json"))
    assert_golden("views/status-list.json", _invoke(root, "status", "--json"))
    assert_golden("views/status.txt", _invoke(root, "status", str(run)))


def test_status_accounts_an_ended_runs_goodput_as_report_does_and_names_the_checkpoint_a_resume_would_take(root):
    run = a_run_with_every_kind_of_event(root)

    status = json.loads(_invoke(root, "status", str(run), "--json"))
    report = json.loads(_invoke(root, "report", str(run), "--json"))
    assert status["goodput"] == report["goodput"]
    assert (status["checkpoint"]["step"], status["checkpoint"]["complete"]) == (
        report["checkpoints"]["latest_step"], report["checkpoints"]["complete"])


def test_report_json_and_text_are_pinned(root):
    run = a_run_with_every_kind_of_event(root)

    assert_golden("views/report.json", _invoke(root, "report", str(run), "--json"))
    assert_golden("views/report.txt", _invoke(root, "report", str(run)))


def test_with_multi_level_checkpoints_the_advice_takes_the_local_save_as_the_cost_and_says_so(root):
    """A run with tiers on: checkpoints flushed whole every 100 s, each complete.json naming its slowest
    slot's local save (1.5 s); one node failure recovered inside the allocation, its resume journaled."""
    text = (REPO / "examples" / "toy_trainer.toml").read_text().replace('validator = "manifest"\n', "tiers = true\n")
    run = create_run(root / "tiered", parse_spec(text, "toy.toml", base_dir=REPO / "examples"), text)
    shared = run.path / "checkpoints"
    for step, at in ((100, 150.0), (200, 250.0), (300, 350.0)):
        marker = write_complete(shared, FlushedCheckpoint(step, ("node1", "node2"), 1.5))
        os.utime(marker, (at, at))
    run.record(Submitted(at=100.0, attempt=1, job_id="4"))
    run.record(RecoveredInAllocation(at=300.0, job_id="4", restart=1, blame=(BlamedNode("node2", "xid 79"),),
                                     nodes=("node1", "node3"), checkpoint_step=200, phases=(("stop", 5.0),)))
    run.record(Resumed(at=306.0, job_id="4", restart=1, step=200, nodes=2, tiers=(("local", 1), ("buddy", 1)),
                       buddy_copies=("node2's on node1",), reported=1, read_seconds=2.75, slowest_node="node3"))
    run.record(Decided(at=401.0, attempt=1, job_id="4", state="COMPLETED", exit_code=0, outcome=OutcomeKind.COMPLETED,
                       message="completed", checkpoint_step=300, checkpoint=None, action=DecisionAction.DONE,
                       times=SlurmTimes(100.0, 110.0, 400.0), blame=()))

    shown = " ".join(_invoke(root, "report", str(run.path)).split())
    assert "flushed to shared storage every 100.0 s now; Young/Daly advises saving every 29.2 s " in shown
    assert "(cost 1.5 s: the local save, the slowest node's; the copy to the buddy and the flush run behind " \
           "training; MTBF 4.8 min)" in shown
    assert "job 4, restart 1: resumed step 200: 1 node(s) from their own copies, 1 node(s) from a buddy's copy " \
           "(node2's on node1); read in 2.75 s (slowest: node3, 1 of 2 nodes said)" in shown
    goodput = json.loads(_invoke(root, "report", str(run.path), "--json"))["goodput"]
    assert (goodput["checkpoint_cost_seconds"], goodput["checkpoint_cost_source"]) == (1.5, "local-save")
    assert goodput["advised_interval_seconds"] == pytest.approx(math.sqrt(2 * 1.5 * 285.0), abs=1e-3)
    last = json.loads(_invoke(root, "status", str(run.path), "--json"))["last_resume"]
    assert (last["tiers"], last["read_seconds"], last["reported"]) == ({"local": 1, "buddy": 1, "shared": 0}, 2.75, 1)
