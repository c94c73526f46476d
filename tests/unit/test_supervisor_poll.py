"""A supervised run's poll costs the same at 4 nodes and 12,500, with 6 jobs queued or 50,000: it asks
Slurm about its own job (one line of text) and its own nodes, and waits longer while nothing changes."""

from __future__ import annotations

from clusterctl.launcher.login.supervisor import next_poll_interval
from clusterctl.slurm.commands import Slurm, parse_exit_code
from clusterctl.slurm.jobs import job_line_argv
from tests.conftest import REPO
from tests.recordings import check_job

DATA = REPO / "tests" / "data" / "slurm"


def test_one_line_of_text_tells_each_recorded_jobs_state_nodes_and_owner(recording):
    slurm = Slurm(recording.replay())
    for role, job_id in recording.jobs.items():
        recording.require(job_line_argv(job_id))
        report = slurm.job(job_id)
        check_job(recording, role, report)
        assert report is not None and report.job_id == job_id
        assert report.user_id == 0 and report.comment == "" and report.submit_time > 0
    assert slurm.job(recording.jobs["running"]).nodes == "node1" and slurm.job(recording.jobs["pending"]).nodes == ""
    assert slurm.job("999999") is None  # past MinJobAge: not held, not an error


def test_an_ended_jobs_exit_code_is_asked_once_for_that_job_alone(recording):
    failed_id = recording.jobs["failed"]
    recording.require(job_line_argv(failed_id))
    runner = recording.replay()
    slurm = Slurm(runner)
    failed = slurm.job_exit(slurm.job(failed_id))
    assert (failed.state, failed.exit_code, failed.signal) == ("FAILED", 3, None)
    asked_for_exit = [call for call in runner.calls if call[0] != "sbatch" and call != job_line_argv(failed_id)]
    assert asked_for_exit == [["squeue", "--json", "-t", "all", "-j", failed_id]
                              if recording.version.squeue_json_filters else ["scontrol", "show", "job", failed_id]]


def test_scontrol_says_the_jobs_exit_code_not_its_steps_highest():
    text = (DATA / "22.05" / "scontrol-show-job-running.txt").read_text()
    assert parse_exit_code(text) == (0, None)
    assert parse_exit_code("JobId=9 DerivedExitCode=7:0 ExitCode=0:9\n") == (0, 9)
    assert parse_exit_code("JobId=9 JobState=PENDING\n") == (None, None)


def test_the_interval_doubles_while_nothing_changes_and_drops_when_something_does():
    waits, wait = [], 2.0
    for changed in (True, False, False, False, False, False, True):
        wait = next_poll_interval(wait, changed, 2.0, 30.0)
        waits.append(wait)
    assert waits == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 2.0]
    assert next_poll_interval(2.0, False, 5.0, 1.0) == 5.0  # a slow bound below the fast one is the fast one
