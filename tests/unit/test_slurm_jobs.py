"""Slurm's JSON job reports from every release, as recorded on the testbed (tests/data/slurm/<release>/,
found by listing: tests/recordings.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import SlurmCommandError
from clusterctl.slurm.commands import Completed, Slurm
from clusterctl.slurm.jobs import FAMILY_40, parse_sacct_json, parse_sbatch_parsable, parse_squeue_json
from clusterctl.slurm.version import SlurmVersion, SlurmVersionError


def test_every_release_reads_into_the_same_reports(recording):
    jobs = parse_squeue_json(recording.text("squeue-t-all.json"))
    ids = recording.jobs
    completed, failed, cancelled = jobs[ids["completed"]], jobs[ids["failed"]], jobs[ids["cancelled"]]
    assert (completed.state, completed.exit_code, completed.terminal) == ("COMPLETED", 0, True)
    assert (failed.state, failed.exit_code, failed.reason, failed.nodes) == ("FAILED", 3, "NonZeroExitCode", "node1")
    assert cancelled.state == "CANCELLED" and jobs[ids["node_fail"]].state == "NODE_FAIL"
    running, pending = jobs[ids["running"]], jobs[ids["pending"]]
    assert (running.state, running.terminal, running.exit_code) == ("RUNNING", False, None)
    assert (pending.state, pending.reason) == ("PENDING", "Resources")
    assert failed.end_time >= failed.start_time >= failed.submit_time > 1.7e9
    assert failed.states == ("FAILED",) and running.name == "running"


def test_accounting_steps_and_exit_codes_per_release(recording):
    ids = recording.jobs
    jobs = parse_sacct_json(recording.text("sacct.json"))
    failed, running = jobs[ids["failed"]], jobs[ids["running"]]
    assert failed.state == "FAILED" and failed.source == "sacct"
    assert [s.step for s in running.steps] == ["batch", "0", "1"]
    assert running.steps[1].state == "COMPLETED" and running.steps[1].nodes == ("node1",)
    if not recording.version.sacct_exit_code_trustworthy:  # SUCCESS/0 for a job that exited 3: unknown, never 0
        assert failed.exit_code is None and failed.steps[0].exit_code is None
    else:
        assert failed.exit_code == 3 and failed.steps[0].exit_code == 3
    assert running.exit_code is None  # not ended yet


def test_list_states_keep_their_flags_after_the_base_state(recording):
    if recording.version.json_family != FAMILY_40:
        pytest.skip(f"{recording.where}: Slurm {recording.version} prints a job's state as one string, without flags")
    data = json.loads(recording.text("squeue-t-all.json"))
    data["jobs"][0]["job_state"] = ["PENDING", "REQUEUED"]
    job = parse_squeue_json(json.dumps(data))[str(data["jobs"][0]["job_id"])]
    assert (job.state, job.state_flags, job.states, job.terminal) == ("PENDING", ("REQUEUED",),
                                                                      ("PENDING", "REQUEUED"), False)


def test_a_job_whose_epilog_still_runs_is_not_finished_yet(recording):
    data = json.loads(recording.text("squeue-t-all.json"))
    # A cancelled job still COMPLETING, as each family prints it.
    listed = recording.version.json_family == FAMILY_40
    data["jobs"][0]["job_state"] = ["CANCELLED", "COMPLETING"] if listed else "COMPLETING"
    job = parse_squeue_json(json.dumps(data))[str(data["jobs"][0]["job_id"])]
    assert job.state == ("CANCELLED" if listed else "COMPLETING") and not job.terminal


def test_the_other_familys_shape_is_an_error_naming_release_command_and_field(recording):
    data = json.loads(recording.text("squeue-t-all.json"))
    failed = [str(job["job_id"]) for job in data["jobs"]].index(recording.jobs["failed"])
    if recording.version.json_family == FAMILY_40:
        data["jobs"][failed]["job_state"] = "FAILED"  # the shape 22.05 printed, in a newer output
        field, expected = rf"`jobs\[{failed}\]\.job_state`", "a list of states"
    else:
        data["jobs"][failed]["exit_code"] = {"return_code": 3}  # a newer release's shape, in a v0.0.38 output
        field, expected = rf"`jobs\[{failed}\]\.exit_code`", "a wait status"
    with pytest.raises(SlurmVersionError, match=field + ".*" + expected) as caught:
        parse_squeue_json(json.dumps(data), argv=["squeue", "--json", "-t", "all"])
    message = str(caught.value)
    assert f"Slurm {recording.version}:" in message and "squeue --json -t all" in message
    assert caught.value.exit_code == 8


def test_output_that_names_no_format_is_read_as_the_asked_release_or_refused():
    assert parse_squeue_json('{"jobs": []}', SlurmVersion(24, 11, 5)) == {}
    with pytest.raises(SlurmVersionError, match="release unknown"):
        parse_squeue_json('{"jobs": []}')


def test_the_door_asks_what_each_release_answers(recording):
    runner = recording.replay()
    ids = recording.jobs
    slurm = Slurm(runner)
    asked = [ids["completed"], ids["failed"], ids["running"]]
    jobs = slurm.queue(asked)  # without filters (22.05): one plain call; with: exactly these, finished included
    assert set(jobs) == set(asked) and jobs[ids["failed"]].exit_code == 3
    squeue_calls = [c for c in runner.calls if c[0] == "squeue"]
    assert squeue_calls == [["squeue", "--json", "-t", "all", "-j", ",".join(asked)]
                            if recording.version.squeue_json_filters else ["squeue", "--json"]]


def test_a_job_the_controller_no_longer_holds_is_absent_not_an_error(recording):
    if recording.version.squeue_json_filters:  # what Slurm really does when asked for one unknown id
        assert recording.require(["squeue", "--json", "-t", "all", "-j", "999999"]).returncode == 1
    assert Slurm(recording.replay()).queue(["999999"]) == {}


def test_accounting_disabled_is_unknown_not_an_error(recording):
    disabled = Completed(1, "", "sacct: error: Slurm accounting storage is disabled\n")
    assert Slurm(recording.replay({"sacct --json -j 2": disabled})).accounting(["2"]) == {}
    trouble = recording.replay({"sacct --json -j 2": Completed(1, "", "sacct: error: Problem talking to the db")})
    with pytest.raises(SlurmCommandError, match="Problem talking"):
        Slurm(trouble).accounting(["2"])


def test_sbatch_parsable_output_and_garbage():
    assert parse_sbatch_parsable("1234\n") == "1234"
    assert parse_sbatch_parsable("1234;cluster\n") == "1234"
    with pytest.raises(SlurmCommandError, match="unexpected output"):
        parse_sbatch_parsable("sbatch: error: Batch job submission failed")
    with pytest.raises(SlurmCommandError, match="not JSON"):
        parse_squeue_json("<html>")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                max_size=4), max_leaves=20)
JOB_KEYS = st.sampled_from(["job_id", "job_state", "exit_code", "submit_time", "start_time", "end_time",
                            "restart_cnt", "name", "nodes", "comment", "state_reason", "state", "time", "steps"])
META = st.sampled_from([{}, {"plugin": {"type": "openapi/v0.0.38"}}, {"plugin": {"data_parser": "data_parser/v0.0.42"}},
                        {"plugin": {"data_parser": "v0.0.7"}}])


@settings(max_examples=300, deadline=None)
@given(meta=META, jobs=st.lists(st.dictionaries(JOB_KEYS, JSON, max_size=8), max_size=3) | JSON)
def test_garbage_json_is_a_slurm_error_never_another_exception(meta, jobs):
    text = json.dumps({"meta": meta, "jobs": jobs})
    for parse in (parse_squeue_json, parse_sacct_json):
        try:
            parse(text)
        except SlurmCommandError:
            pass


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40) | JSON.map(json.dumps))
def test_any_text_is_a_slurm_error_never_another_exception(text):
    for parse in (parse_squeue_json, parse_sacct_json):
        try:
            parse(text)
        except SlurmCommandError:
            pass
