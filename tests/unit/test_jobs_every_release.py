"""`clusterctl submit --wait`, `status` and `cancel` on each Slurm release, without accounting,
as a user sees them (Slurm replayed from each release's recordings, tests/data/slurm/<release>/, found by
listing: tests/recordings.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import clusterctl.launcher.login.cli as cli_module
from clusterctl.errors import RunError
from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.login.use_cases import WAIT_MISSING_POLLS, wait_for_job
from clusterctl.slurm.commands import Completed, Slurm
from tests.conftest import REPO
from tests.recordings import Recording

EXAMPLE = str(REPO / "examples" / "toy_trainer.toml")
NO_ACCOUNTING = Completed(1, "", "sacct: error: Slurm accounting storage is disabled\n")


class ReleaseSlurm:
    """One release's recorded answers, keyed by argv; sbatch "submits" the recorded job of a role;
    sacct answers as a cluster without slurmdbd does."""

    def __init__(self, recording: Recording, role: str) -> None:
        self.job_id = recording.jobs[role]
        self.answers = {file.argv: file.completed for file in recording.files.values()}
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout) -> Completed:
        self.calls.append(list(argv))
        if argv[:2] == ["sbatch", "--version"]:
            return self.answers[("sbatch", "--version")]
        if argv[:3] == ["scontrol", "show", "topology"]:
            return self.answers[("scontrol", "show", "topology")]
        if argv[0] == "sbatch":
            return Completed(0, f"{self.job_id}\n", "")
        if argv[0] == "sacct":
            return NO_ACCOUNTING
        if argv[0] == "scancel":
            return Completed(0, "", "")
        if argv[:2] == ["squeue", "--json"]:
            # Without filters (22.05): the one plain call; with: -t all -j <id>, answered from the full recording.
            every = self.answers[("squeue", "--json")] if argv == ["squeue", "--json"] else \
                self.answers[("squeue", "--json", "-t", "all")]
            if "-j" not in argv:
                return every
            wanted = argv[argv.index("-j") + 1].split(",")
            data = json.loads(every.stdout)
            data["jobs"] = [j for j in data["jobs"] if str(j["job_id"]) in wanted]
            if not data["jobs"] and len(wanted) == 1:
                return Completed(1, "", "slurm_load_jobs error: Invalid job id specified")
            return Completed(0, json.dumps(data), "")
        return Completed(1, "", f"not recorded: {argv}")


def _use(monkeypatch, tmp_path, fake: ReleaseSlurm) -> None:
    monkeypatch.setattr(cli_module, "Slurm", lambda: Slurm(fake))
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))


def test_submit_wait_on_a_job_that_exits_3_says_failed_with_exit_3_without_accounting(monkeypatch, tmp_path,
                                                                                       recording):
    fake = ReleaseSlurm(recording, "failed")
    _use(monkeypatch, tmp_path, fake)
    result = CliRunner().invoke(cli, ["submit", EXAMPLE, "--wait"])
    assert result.exit_code == 1, result.output
    assert f"job {fake.job_id} ended FAILED (exit 3)" in result.stderr
    assert not any(c[0] == "sacct" for c in fake.calls)  # the controller answered


def test_submit_wait_on_a_completed_job_exits_0(monkeypatch, tmp_path, recording):
    fake = ReleaseSlurm(recording, "completed")
    _use(monkeypatch, tmp_path, fake)
    result = CliRunner().invoke(cli, ["submit", EXAMPLE, "--wait"])
    assert result.exit_code == 0, result.output
    assert f"job {fake.job_id} ended COMPLETED" in result.stderr


@pytest.mark.parametrize(("role", "state", "exit_code"), [("running", "RUNNING", None), ("failed", "FAILED", 3),
                                                           ("completed", "COMPLETED", 0)])
def test_status_of_running_failed_and_completed_runs(monkeypatch, tmp_path, recording, role, state, exit_code):
    fake = ReleaseSlurm(recording, role)
    _use(monkeypatch, tmp_path, fake)
    assert CliRunner().invoke(cli, ["submit", EXAMPLE]).exit_code == 0
    result = CliRunner().invoke(cli, ["status", fake.job_id, "--json"])
    assert result.exit_code == 0, result.output
    attempt = json.loads(result.stdout)["attempts"][0]
    assert (attempt["state"], attempt["exit_code"]) == (state, exit_code)
    shown = CliRunner().invoke(cli, ["status", fake.job_id]).output
    assert state in shown and (exit_code is None or f"exit {exit_code}" in shown), shown


def test_cancel_cancels_the_live_job_asking_only_for_the_runs_jobs_where_squeue_filters(monkeypatch, tmp_path,
                                                                                        recording):
    fake = ReleaseSlurm(recording, "running")
    _use(monkeypatch, tmp_path, fake)
    assert CliRunner().invoke(cli, ["submit", EXAMPLE]).exit_code == 0
    result = CliRunner().invoke(cli, ["cancel", fake.job_id])
    assert result.exit_code == 0 and ["scancel", fake.job_id] in fake.calls
    asked = [call for call in fake.calls if call[0] == "squeue"]
    assert asked and all(call == (["squeue", "--json", "-t", "all", "-j", fake.job_id]
                                  if recording.version.squeue_json_filters else ["squeue", "--json"]) for call in asked)


def test_a_job_neither_the_controller_nor_accounting_knows_ends_the_wait_with_a_clear_error(recording):
    fake = ReleaseSlurm(recording, "failed")
    polls: list[float] = []
    with pytest.raises(RunError, match="job 999999 is known neither to slurmctld nor to accounting"):
        wait_for_job(Slurm(fake), "999999", sleep=polls.append, poll=0.1)
    assert len(polls) == WAIT_MISSING_POLLS - 1
