"""Slurm's JSON job reports from every release, as recorded on the testbed (tests/data/slurm/<release>/,
found by listing: tests/recordings.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import SlurmCommandError
from clusterctl.slurm.commands import Completed, Slurm
from clusterctl.slurm.jobs import (
    FAMILY_40, TERMINAL_STATES, JobReport, StepReport, parse_sacct_json, parse_sbatch_parsable, parse_squeue_json,
)
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
                            "restart_cnt", "name", "nodes", "comment", "state_reason", "state", "time", "steps",
                            "step", "id", "step_id", "set", "number", "return_code"])
META = st.sampled_from([{}, {"plugin": {"type": "openapi/v0.0.38"}}, {"plugins": {"data_parser": "data_parser/v0.0.39"}},
                        {"plugin": {"data_parser": "data_parser/v0.0.42"}}, {"plugin": {"data_parser": "v0.0.7"}}])


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


# ---- one job as each family spells it (the shapes of the recordings of 22.05.8, 23.02.8 and 23.11.11) ----
def boxed(number: int | None) -> dict:
    """{set, infinite, number}: 23.02's squeue exit code, 23.11+'s times and exit codes."""
    return {"set": number is not None, "infinite": False, "number": number or 0}


def wait_status(job: JobReport) -> int:
    return ((job.exit_code or 0) << 8) | (job.signal or 0)


def squeue_json(jobs: list[JobReport], family: str) -> str:
    """`squeue --json` of v0.0.38, v0.0.39 (`v0.0.39-int`: 23.02.0-23.02.3's plain exit code) or v0.0.40+."""
    meta = {"v0.0.38": {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}},
            "v0.0.39": {"plugins": {"data_parser": "data_parser/v0.0.39"}, "Slurm": {"release": "23.02.8"}},
            "v0.0.39-int": {"plugins": {"data_parser": "data_parser/v0.0.39"}, "Slurm": {"release": "23.02.3"}},
            "v0.0.40+": {"plugin": {"data_parser": "data_parser/v0.0.42"}, "slurm": {"release": "24.11.5"}}}[family]
    listed = family == "v0.0.40+"

    def spelt(job: JobReport) -> dict:
        exit_code: object = wait_status(job)
        if family == "v0.0.39":
            exit_code = boxed(wait_status(job))
        elif listed:
            exit_code = {"status": ["SIGNALED" if job.signal else "ERROR" if job.exit_code else "SUCCESS"],
                         "return_code": boxed(job.exit_code or 0), "signal": {"id": boxed(job.signal), "name": ""}}
        times = {key: boxed(int(value)) if listed else int(value) for key, value in (
            ("submit_time", job.submit_time), ("start_time", job.start_time), ("end_time", job.end_time))}
        return {"job_id": int(job.job_id), "name": job.name, "job_state": [job.state] if listed else job.state,
                "exit_code": exit_code, "state_reason": job.reason, "nodes": job.nodes, "comment": job.comment,
                "restart_cnt": job.restarts, "user_id": job.user_id, **times}
    return json.dumps({"meta": meta, "jobs": [spelt(job) for job in jobs]})


def job_ended(state: str) -> st.SearchStrategy[tuple[str, int | None, int | None]]:
    """(state, exit code, signal) as squeue reports them: no exit code before the job ended."""
    if state not in TERMINAL_STATES:
        return st.just((state, None, None))
    return st.tuples(st.just(state), st.integers(0, 255), st.integers(1, 127) | st.none())


epoch = st.integers(0, 2**32).map(float)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
squeue_jobs = st.builds(
    lambda ident, ended, name, reason, nodes, times, restarts, comment, uid: JobReport(
        str(ident), name, ended[0], reason, nodes, ended[1], ended[2], *times, restarts, comment=comment, user_id=uid),
    st.integers(1, 10**9), st.sampled_from(sorted(TERMINAL_STATES | {"PENDING", "RUNNING", "SUSPENDED"})).flatmap(
        job_ended), text, text, text, st.tuples(epoch, epoch, epoch), st.integers(0, 9), text, st.integers(0, 2**31))


@settings(max_examples=150, deadline=None)
@given(st.lists(squeue_jobs, max_size=4, unique_by=lambda job: job.job_id))
def test_each_familys_squeue_gives_back_exactly_the_jobs_slurm_described(jobs):
    for family in ("v0.0.38", "v0.0.39", "v0.0.39-int", "v0.0.40+"):
        assert parse_squeue_json(squeue_json(jobs, family)) == {job.job_id: job for job in jobs}, family


FAILED_JOB = JobReport("7", "toy", "FAILED", "NonZeroExitCode", "node1", 3, None, 1.0, 2.0, 3.0)


def test_23_02s_unset_exit_code_is_unknown_in_either_spelling_never_0():
    for family, unset in (("v0.0.39", boxed(None)), ("v0.0.39-int", 0xFFFFFFFE)):  # NO_VAL, as each prints it
        data = json.loads(squeue_json([FAILED_JOB], family))
        data["jobs"][0]["exit_code"] = unset
        assert parse_squeue_json(json.dumps(data))["7"].exit_code is None, family


@pytest.mark.parametrize("exit_code", [{"set": True, "infinite": False, "number": -1}, {"return_code": 3}, "768",
                                       1 << 16])
def test_a_23_02_exit_code_that_is_no_wait_status_is_an_error_naming_the_field(exit_code):
    data = json.loads(squeue_json([FAILED_JOB], "v0.0.39"))
    data["jobs"][0]["exit_code"] = exit_code
    with pytest.raises(SlurmVersionError, match=r"Slurm 23\.02\.8: `jobs\[0\]\.exit_code` is .*a wait status"):
        parse_squeue_json(json.dumps(data))


STEP_IDS = ["batch", "extern", "interactive", "0", "1", "12"]


def sacct_json(job_id: str, exited: int, steps: list[StepReport], family: str) -> str:
    """`sacct --json` of one job that failed with `exited`, and its steps; 22.05's and 23.02's exit codes
    read SUCCESS/0 whatever the job's or step's was (their dumper bug)."""
    listed = family == "v0.0.40+"
    meta = {"v0.0.38": {"plugin": {"type": "openapi/dbv0.0.38"}},
            "v0.0.39": {"plugins": {"data_parser": "data_parser/v0.0.39"}},
            "v0.0.40+": {"plugin": {"data_parser": "data_parser/v0.0.40"}}}[family]

    def exit_code(code: int | None) -> dict:
        if not listed:
            return {"status": "SUCCESS", "return_code": 0}
        return {"status": ["ERROR" if code else "SUCCESS"], "return_code": boxed(code or 0),
                "signal": {"id": boxed(None), "name": ""}}

    def step_id(step: str) -> object:
        return {"v0.0.38": int(step) if step.isdigit() else step, "v0.0.39": {"job_id": int(job_id), "step_id": step},
                "v0.0.40+": f"{job_id}.{step}"}[family]
    return json.dumps({"meta": meta, "jobs": [{
        "job_id": int(job_id), "name": "toy", "nodes": "node1", "state": {"current": ["FAILED"] if listed else "FAILED"},
        "exit_code": exit_code(exited), "time": {"submission": 1, "start": 2, "end": 3},
        "steps": [{"step": {"id": step_id(s.step), "name": s.name}, "state": [s.state] if listed else s.state,
                   "exit_code": exit_code(s.exit_code), "nodes": {"list": list(s.nodes)}} for s in steps]}]})


sacct_steps = st.builds(
    lambda step, state, name, nodes: StepReport(step, name, state, 0 if state == "COMPLETED" else None, None, nodes),
    st.sampled_from(STEP_IDS), st.sampled_from(sorted(TERMINAL_STATES | {"PENDING", "RUNNING"})), text,
    st.lists(st.from_regex(r"node[0-9]{1,3}", fullmatch=True), max_size=3).map(tuple))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 10**9).map(str), st.lists(sacct_steps, max_size=4, unique_by=lambda step: step.step),
       st.integers(1, 255))
def test_each_familys_accounting_reads_the_same_steps_and_never_its_untrusted_exit_code(job_id, steps, failed_with):
    for family in ("v0.0.38", "v0.0.39", "v0.0.40+"):
        trusted = family == "v0.0.40+"
        # The job and each ended step that did not complete exited `failed_with`: v0.0.40+ says so; 22.05's
        # and 23.02's SUCCESS/0 reads as unknown, never 0.
        said = [StepReport(s.step, s.name, s.state, failed_with if trusted and s.state in TERMINAL_STATES
                           and s.state != "COMPLETED" else s.exit_code, None, s.nodes) for s in steps]
        job = parse_sacct_json(sacct_json(job_id, failed_with, said, family))[job_id]
        assert job.steps == tuple(said), family
        assert (job.state, job.exit_code) == ("FAILED", failed_with if trusted else None), family


def test_a_heterogeneous_step_reads_as_slurm_names_it_on_23_02_and_later():
    step = StepReport("0+1", "", "COMPLETED", 0, None, ())
    v39 = json.loads(sacct_json("12", 3, [step], "v0.0.39"))
    v39["jobs"][0]["steps"][0]["step"]["id"] = {"job_id": 12, "step_id": "0", "step_het_component": 1}
    for text in (json.dumps(v39), sacct_json("12", 3, [step], "v0.0.40+")):  # 23.11+: "12.0+1"
        assert [s.step for s in parse_sacct_json(text)["12"].steps] == ["0+1"]
