"""A supervised run's poll costs the same at 4 nodes and 12,500, with 6 jobs queued or 50,000: it asks
Slurm about its own job (one line of text) and its own nodes, and waits longer while nothing changes."""

from __future__ import annotations

import json

import pytest

from clusterctl.launcher.login.supervisor import next_poll_interval
from clusterctl.slurm.commands import Completed, Slurm, parse_exit_code
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "slurm"
RELEASES = ("22.05", "26.05")
STATES = {"completed": "COMPLETED", "failed": "FAILED", "cancelled": "CANCELLED", "node_fail": "NODE_FAIL",
          "running": "RUNNING", "pending": "PENDING"}


def recorded(release: str):
    """A runner that answers with the release's recordings, keyed by argv."""
    index = json.loads((DATA / release / "index.json").read_text())
    answers = {tuple(e["argv"]): Completed(e["returncode"], (DATA / release / name).read_text(), e.get("stderr", ""))
               for name, e in index["files"].items()}

    def runner(argv, timeout) -> Completed:
        return answers[tuple(argv)]
    return index["jobs"], runner


@pytest.mark.parametrize("release", RELEASES)
def test_one_line_of_text_tells_each_recorded_jobs_state_nodes_and_owner(release):
    jobs, runner = recorded(release)
    slurm = Slurm(runner)
    for role, state in STATES.items():
        report = slurm.job(jobs[role])
        assert report is not None and report.job_id == jobs[role] and report.state == state
        assert report.user_id == 0 and report.comment == "" and report.submit_time > 0
        assert report.terminal == (role not in ("running", "pending"))
    assert slurm.job(jobs["running"]).nodes == "node1" and slurm.job(jobs["pending"]).nodes == ""
    assert slurm.job("999999") is None  # past MinJobAge: not held, not an error


@pytest.mark.parametrize("release", RELEASES)
def test_an_ended_jobs_exit_code_is_asked_once_for_that_job_alone(release):
    jobs, runner = recorded(release)
    asked: list[list[str]] = []

    def counting(argv, timeout):
        asked.append(list(argv))
        return runner(argv, timeout)
    slurm = Slurm(counting)
    failed = slurm.job_exit(slurm.job(jobs["failed"]))
    assert (failed.state, failed.exit_code, failed.signal) == ("FAILED", 3, None)
    whole_queue = [a for a in asked if a[0] == "squeue" and "-j" not in a]
    assert whole_queue == []


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
