"""`clusterctl submit/status/cancel/spec` as a user sees them (Slurm replayed from recordings)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

import clusterctl.launcher.login.cli as cli_module
from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.shared.runs import create_run
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.login.use_cases import wait_for_job
from clusterctl.records.rank_map import JobRankMap, PlanSummary, RankMap, write_rank_map
from clusterctl.records.run_journal import (
    BlamedNode, Decided, DecisionAction, OutcomeKind, SlurmTimes, Submitted, read_run_journal,
)
from clusterctl.slurm.commands import Completed, Slurm
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "slurm"
EXAMPLE = str(REPO / "examples" / "toy_trainer.toml")


class RecordedSlurm:
    """Replays recorded outputs of the testbed's Slurm and remembers what was run."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.next_job = 7

    def __call__(self, argv, timeout) -> Completed:
        self.calls.append(list(argv))
        if argv[:2] == ["sbatch", "--version"]:
            return Completed(0, "slurm-wlm 22.05.8\n", "")
        if argv[:3] == ["scontrol", "show", "topology"]:
            return Completed(0, (DATA / "scontrol-show-topology.txt").read_text(), "")
        if argv[0] == "sbatch":
            return Completed(0, f"{self.next_job}\n", "")
        if argv[:2] == ["squeue", "--json"]:
            return Completed(0, (DATA / "squeue.json").read_text(), "")
        if argv[:2] == ["sacct", "--json"]:
            return Completed(0, (DATA / "sacct.json").read_text(), "")
        if argv[0] == "scancel":
            return Completed(0, "", "")
        return Completed(1, "", f"unexpected {argv}")


@pytest.fixture
def slurm(monkeypatch, tmp_path):
    fake = RecordedSlurm()
    monkeypatch.setattr(cli_module, "Slurm", lambda: Slurm(fake))
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    # The machine's and the tester's own submit defaults (docs/install.md#site-and-user-defaults) stay out.
    monkeypatch.setenv("CLUSTERCTL_SITE_CONFIG", str(tmp_path / "no-site.toml"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-xdg"))
    return fake


def test_dry_run_json_is_the_exact_request_and_submits_nothing(slurm, tmp_path):
    result = CliRunner().invoke(cli, ["submit", EXAMPLE, "--dry-run", "--json", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["sbatch_argv"][0] == "sbatch" and "--switches=2@5:00" in summary["sbatch_argv"]
    assert summary["script"].startswith("#!/bin/bash\n") and summary["warnings"] == []
    assert not (tmp_path / "r").exists() and not any(c[0] == "sbatch" and "--parsable" in c for c in slurm.calls)


def test_dry_run_shows_what_every_rank_runs_on_one_line_though_the_agent_starts_it(slurm, tmp_path):
    spec = tmp_path / "job.toml"
    spec.write_text((REPO / "examples" / "toy_trainer.toml").read_text().replace(
        'command = ["python3", "toy_trainer.py"', 'command = ["python3", "toy_trainer.py", "--note", "two\\nlines"'))
    result = CliRunner().invoke(cli, ["submit", str(spec), "--dry-run", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    shown = [line for line in result.output.splitlines() if line.startswith("# every rank runs: ")]
    assert len(shown) == 1 and shown[0].startswith("# every rank runs: python3 toy_trainer.py --note 'two\\nlines' ")
    as_json = json.loads(CliRunner().invoke(cli, ["submit", str(spec), "--dry-run", "--json", "--run-dir",
                                                  str(tmp_path / "r")]).output)
    assert as_json["command"][:4] == ["python3", "toy_trainer.py", "--note", "two\nlines"]


def test_submit_writes_the_run_and_prints_job_and_where_to_look(slurm, tmp_path):
    result = CliRunner().invoke(cli, ["submit", EXAMPLE, "--time", "20:00", "-e", "NCCL_DEBUG=INFO"])
    assert result.exit_code == 0, result.output
    run_dir = next((tmp_path / "runs").iterdir())
    assert result.output.splitlines()[0] == f"Submitted job 7; run directory {run_dir}"
    script = (run_dir / "attempts" / "1" / "job.sbatch").read_text()
    assert "export NCCL_DEBUG=INFO" in script
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["job"]["time"] == "20:00" and spec["parallel"]["tp"] == 8
    events = read_run_journal(run_dir / "journal.jsonl").events
    assert [e.event for e in events] == ["created", "submitted"] and events[1].job_id == "7"


def _submitted_run(slurm: RecordedSlurm, tmp_path, job_id: int):
    slurm.next_job = job_id
    assert CliRunner().invoke(cli, ["submit", EXAMPLE]).exit_code == 0
    return next((tmp_path / "runs").iterdir())


def test_status_of_a_job_slurm_does_not_know_says_unknown(slurm, tmp_path):
    run_dir = _submitted_run(slurm, tmp_path, 7)
    status = CliRunner().invoke(cli, ["status", "7", "--json"])
    assert status.exit_code == 0, status.output
    document = json.loads(status.output)
    # The recording holds jobs 1-6: job 7 is unknown to this Slurm, and status says so.
    assert document["run"] == str(run_dir) and document["attempts"][0]["state"] == "UNKNOWN"
    assert document["attempts"][0]["log"] == str(run_dir / "logs" / "7.out")


def test_status_of_a_recorded_job_shows_slurms_state_and_nodes(slurm, tmp_path):
    run_dir = _submitted_run(slurm, tmp_path, 6)  # recorded RUNNING
    status = json.loads(CliRunner().invoke(cli, ["status", str(run_dir), "--json"]).output)
    assert status["state"] == "RUNNING" and status["attempts"][0]["nodes"] == "node[1-4]"


def test_status_shows_the_rank_map_the_job_wrote(slurm, tmp_path):
    run_dir = _submitted_run(slurm, tmp_path, 6)
    summary = PlanSummary("depth-first order", 0, 2, 1)
    write_rank_map(run_dir / "jobs" / "6", JobRankMap("6", "node[1-4]", RankMap(("node2", "node1"), 8), 20006,
                                                      ("node3", "node4"), summary))
    status = json.loads(CliRunner().invoke(cli, ["status", str(run_dir), "--json"]).output)
    assert status["attempts"][0]["rank_map"] == {"slots": ["node2", "node1"], **summary.to_json()}


def test_status_shows_a_rank_map_it_cannot_read_as_missing_with_a_note(slurm, tmp_path):
    run_dir = _submitted_run(slurm, tmp_path, 6)
    (run_dir / "jobs" / "6").mkdir(parents=True)
    (run_dir / "jobs" / "6" / "rankmap.json").write_text('{"kind": "rank-map", "version": 5}')
    result = CliRunner().invoke(cli, ["status", str(run_dir), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["attempts"][0]["rank_map"] is None
    assert "rank-map record version 5 is newer than this clusterctl understands" in result.stderr


def test_cancel_ends_the_live_job_and_the_run(slurm, tmp_path):
    run_dir = _submitted_run(slurm, tmp_path, 6)  # recorded RUNNING
    result = CliRunner().invoke(cli, ["cancel", str(run_dir)])
    assert result.exit_code == 0 and result.output.startswith("cancelled 6;")
    assert ["scancel", "6"] in slurm.calls
    assert json.loads(CliRunner().invoke(cli, ["status", str(run_dir), "--json"]).output)["state"] == "cancelled"
    ended = read_run_journal(run_dir / "journal.jsonl").events[-1]
    assert ended.event == "cancelled" and ended.jobs == ("6",)


def _clusterctl(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from clusterctl.launcher.login.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd)


def test_a_bad_spec_is_one_clear_line_and_nothing_is_submitted(tmp_path):
    bad = tmp_path / "job.toml"
    bad.write_text('[job]\nname = "x"\nnodes = 2\n[launch]\ncommand = ["a"]\nstyle = "mpirun"\n')
    done = _clusterctl("submit", str(bad))
    assert done.returncode == 7 and "Traceback" not in done.stderr
    assert done.stderr == (f"clusterctl: error: {bad}:6, key `launch.style`: expected one of srun, torchrun, "
                           "found 'mpirun'; did you mean `srun`?\n")
    missing = _clusterctl("submit", str(tmp_path / "nope.toml"))
    assert missing.returncode == 7 and "cannot read: No such file or directory" in missing.stderr
    assert not (tmp_path / "runs").exists()


def test_the_spec_reference_lists_every_key():
    result = CliRunner().invoke(cli, ["spec", "--markdown"])
    assert result.exit_code == 0
    assert "| `launch.command` | argv | required |" in result.output
    assert "| `restart.max_restarts` | int | 10 |" in result.output


def test_the_spec_reference_page_is_current():
    result = CliRunner().invoke(cli, ["spec", "--markdown"])
    page = (REPO / "docs" / "spec.md").read_text()
    assert page.split("\n\n", 2)[2] == result.output, "regenerate docs/spec.md (see its first lines)"


def test_supervise_and_report_refuse_what_is_not_a_run(tmp_path):
    for command in ("supervise", "report"):
        done = _clusterctl(command, str(tmp_path))
        assert done.returncode == 9 and "is not a clusterctl run directory (no spec.json)" in done.stderr
        assert "Traceback" not in done.stderr


def test_report_of_a_supervised_run_from_its_journal(slurm, tmp_path):
    run = create_run(tmp_path / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    run.record(Submitted(at=100.0, attempt=1, job_id="4"))
    run.record(Decided(at=201.0, attempt=1, job_id="4", state="FAILED", exit_code=3, outcome=OutcomeKind.NODE_FAILURE,
                       message="FAILED (exit 3); blamed node3", checkpoint_step=20, checkpoint=None,
                       action=DecisionAction.RESUBMIT, times=SlurmTimes(100.0, 110.0, 200.0),
                       blame=(BlamedNode("node3", "healthd: xid 79 gpu3", ("epilog record: x",), 9e12),)))
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["state"] == "running" and document["excluded_now"] == ["node3"]
    assert document["attempts"][0]["blame"][0]["reason"] == "healthd: xid 79 gpu3"
    assert document["goodput"]["node_failures"] == 1
    text = CliRunner().invoke(cli, ["report", str(tmp_path / "run")]).output
    assert "attempt 1: blamed node3: healthd: xid 79 gpu3" in text and "goodput" in text


def test_options_that_contradict_supervise_are_refused_before_anything_is_written(slurm, tmp_path):
    for extra in (["--supervise", "--resume", "/ck/step-9"], ["--supervise", "--json"], ["--detach"]):
        result = CliRunner().invoke(cli, ["submit", EXAMPLE, "--run-dir", str(tmp_path / "r"), *extra])
        assert result.exit_code == 2, result.output
        assert "does not go with --supervise" in result.output or "--detach only goes with --supervise" in result.output
    assert not (tmp_path / "r").exists() and not any(c[0] == "sbatch" and "--parsable" in c for c in slurm.calls)


def test_submit_wait_exits_1_when_the_job_did_not_complete(slurm, tmp_path):
    slurm.next_job = 4  # recorded FAILED
    result = CliRunner().invoke(cli, ["submit", EXAMPLE, "--wait"])
    assert result.exit_code == 1 and "Submitted job 4" in result.stdout
    assert "FAILED" in result.stderr  # the run's status, shown when the job ended


def test_submit_wait_exits_0_when_the_job_completed(slurm, tmp_path):
    slurm.next_job = 3  # recorded COMPLETED
    assert CliRunner().invoke(cli, ["submit", EXAMPLE, "--wait"]).exit_code == 0


def test_waiting_for_a_job_polls_until_slurm_says_it_ended():
    states = iter(["PENDING", "RUNNING", "COMPLETED"])
    polls: list[float] = []

    class Changing(RecordedSlurm):
        def __call__(self, argv, timeout) -> Completed:
            if argv[:2] == ["squeue", "--json"]:
                job = json.loads((DATA / "squeue.json").read_text())["jobs"][0]
                return Completed(0, json.dumps({"jobs": [{**job, "job_id": 9, "job_state": next(states)}]}), "")
            return super().__call__(argv, timeout)
    assert wait_for_job(Slurm(Changing()), "9", sleep=polls.append, poll=0.5).state == "COMPLETED"
    assert polls == [0.5, 0.5]


@pytest.mark.parametrize("case", ["no-config", "controller-down"])
def test_dry_run_with_slurm_unreachable_says_so_in_one_line_not_that_there_is_no_tree(case, monkeypatch, tmp_path):
    from tests.recordings import unreachable_runner

    monkeypatch.setattr(cli_module, "Slurm", lambda: Slurm(unreachable_runner(case)))
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    result = CliRunner().invoke(cli, ["submit", "--dry-run", EXAMPLE])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, result.stderr
    assert "the topology could not be read: Slurm could not be reached" in warnings[0]
    assert ("Could not establish a configuration source" if case == "no-config"
            else "Unable to contact slurm controller") in warnings[0]
    assert "no tree topology" not in result.stderr


@pytest.mark.parametrize("case", ["no-config", "controller-down"])
def test_status_of_an_ended_run_with_slurm_unreachable_is_read_from_its_journal(case, monkeypatch, tmp_path):
    import shutil

    from tests.recordings import unreachable_runner

    run_dir = tmp_path / "xid79-resubmit"
    shutil.copytree(REPO / "tests" / "data" / "runs" / "xid79-resubmit", run_dir)
    monkeypatch.setattr(cli_module, "Slurm", lambda: Slurm(unreachable_runner(case)))
    result = CliRunner().invoke(cli, ["status", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "the run completed" in result.stdout
    assert [line.split()[:4] for line in result.stdout.splitlines() if line.startswith(("1 ", "2 "))] == [
        ["1", "2", "FAILED", "exit"], ["2", "3", "COMPLETED", "exit"]]
    assert result.stderr.count("\n") == 1 and "Slurm could not be reached" in result.stderr
    assert "shown from the journal of the ended run" in result.stderr
