"""One user cannot steer another user's supervisor through a runs directory they share.

The victim runs in a forked child as `nobody` (uid 65534); the attacker is the test process
(root), planting files in a sticky, world-writable runs directory as another user would.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterctl.errors import RunError
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.launcher.login.shared_reads import SharedReads, user_cache_dir
from clusterctl.slurm.commands import Completed, Slurm
from tests.as_user import as_user

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm" / "22.05"
VICTIM = 65534
REAL_SQUEUE = (DATA / "squeue-j-running.json").read_text()
RUNNING_JOB = next(str(job["job_id"]) for job in json.loads(REAL_SQUEUE)["jobs"] if job["job_state"] == "RUNNING")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays two users: needs root to become `nobody`")


def real_slurm() -> Slurm:
    def runner(argv: Any, timeout: float) -> Completed:
        if argv[0] == "sbatch":
            return Completed(0, "slurm-wlm 22.05.8\n", "")
        return Completed(0, REAL_SQUEUE, "")
    return Slurm(runner)


@pytest.fixture
def shared_runs() -> Iterator[Path]:
    """A runs directory every user may write, with the sticky bit (like /scratch/runs)."""
    path = Path(tempfile.mkdtemp(prefix="clusterctl-shared-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path)


def victims_view(runs: Path) -> tuple[str, Any]:
    def read() -> str:
        return SharedReads(real_slurm(), runs, 60.0, lambda: 1000.0).queue()[RUNNING_JOB].state
    return as_user(VICTIM, read)


def test_a_fake_answer_planted_by_another_user_is_not_believed(shared_runs: Path) -> None:
    fake = REAL_SQUEUE.replace('"RUNNING"', '"COMPLETED"')
    cache = {"kind": "slurm-cache", "version": 1, "command": "squeue", "at": 1000.0, "pid": 1, "text": fake}
    (shared_runs / ".slurm-squeue.json").write_text(json.dumps(cache))  # where every user's supervisor looked
    assert victims_view(shared_runs) == ("ok", "RUNNING")


def test_a_cache_directory_planted_in_the_victims_name_is_not_used(shared_runs: Path) -> None:
    planted = shared_runs / f".clusterctl-{VICTIM}"
    planted.mkdir()
    planted.chmod(0o777)
    fake = REAL_SQUEUE.replace('"RUNNING"', '"COMPLETED"')
    (planted / ".slurm-squeue.json").write_text(json.dumps(
        {"kind": "slurm-cache", "version": 1, "command": "squeue", "at": 1000.0, "pid": 1, "text": fake}))
    assert user_cache_dir(shared_runs, VICTIM) is None
    assert victims_view(shared_runs) == ("ok", "RUNNING")


def test_a_lock_file_another_user_holds_does_not_stop_the_victim(shared_runs: Path) -> None:
    lock = shared_runs / ".slurm-squeue.lock"
    lock.write_text("")
    lock.chmod(0o600)  # the victim cannot open it: before, its supervisor died with PermissionError
    assert victims_view(shared_runs) == ("ok", "RUNNING")


def test_a_symlinked_lock_is_a_clear_run_error_not_a_traceback(tmp_path: Path) -> None:
    reads = SharedReads(real_slurm(), tmp_path, 60.0, lambda: 1000.0)
    directory = user_cache_dir(tmp_path, os.getuid())
    assert directory is not None
    (directory / ".slurm-squeue.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunError, match="cannot open the Slurm-answer lock"):
        reads.queue()


def test_the_cache_file_of_another_owner_is_a_miss(tmp_path: Path) -> None:
    reads = SharedReads(real_slurm(), tmp_path, 60.0, lambda: 1000.0)
    assert reads.queue()[RUNNING_JOB].state == "RUNNING"  # written by this user: now cached
    directory = user_cache_dir(tmp_path, os.getuid())
    assert directory is not None
    cache = directory / ".slurm-squeue.json"
    cache.write_text(cache.read_text().replace('\\"RUNNING\\"', '\\"COMPLETED\\"'))
    assert reads.queue()[RUNNING_JOB].state == "COMPLETED"  # this user's own file is trusted
    os.chown(cache, 1000, 1000)
    assert reads.queue()[RUNNING_JOB].state == "RUNNING"  # another owner's is not


def test_only_the_owner_of_a_run_may_supervise_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.json").write_text("{}")
    (run / "journal.jsonl").write_text("")
    RunDir(run).check_owned()
    os.chown(run / "journal.jsonl", 1000, 1000)  # another user's journal would steer the supervisor
    with pytest.raises(RunError, match="only its owner"):
        RunDir(run).check_owned()
    os.chown(run / "journal.jsonl", 0, 0)
    (run / "spec.json").chmod(0o666)
    with pytest.raises(RunError, match="nobody else may write it"):
        RunDir(run).check_owned()


def test_a_run_lock_another_user_made_is_a_clear_run_error(shared_runs: Path) -> None:
    run = shared_runs / "run"
    run.mkdir()
    run.chmod(0o777)
    (run / ".lock").write_text("")
    (run / ".lock").chmod(0o600)
    outcome = as_user(VICTIM, lambda: RunDir(run).lock() and None)
    assert outcome[0] == "raised" and outcome[1][0] == "RunError" and "cannot open the run's lock" in outcome[1][1]


def test_a_held_job_of_another_user_with_the_runs_comment_is_not_its_live_copy(tmp_path: Path) -> None:
    from clusterctl.launcher.shared.runs import create_run
    from clusterctl.launcher.pure.spec import load_spec
    from clusterctl.launcher.login.supervisor import EXIT_DONE, Hooks, Supervisor
    from tests.conftest import REPO
    from tests.unit.test_supervisor_loop import Clock, ScriptedSlurm

    run = create_run(tmp_path / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    slurm.jobs["900"] = {"job_id": 900, "name": "toy", "job_state": "PENDING", "state_reason": "JobHeldUser",
                         "nodes": "", "exit_code": 0, "submit_time": clock.now, "start_time": 0, "end_time": 0,
                         "comment": "clusterctl:run:1:deadbeef", "user_id": 1000}  # another user's, held forever
    polls = []

    def script() -> None:
        polls.append(1)
        assert len(polls) < 50, "the supervisor keeps waiting for another user's job"
        if "1" in slurm.jobs:
            slurm.end("1", "COMPLETED")
    slurm.on_poll = script
    hooks = Hooks(clock=clock.time, sleep=clock.sleep, say=lambda message: None)
    supervisor = Supervisor(RunDir(run.path), Slurm(slurm), "/py", None, hooks, evidence_grace=0.0, uid=0)
    assert supervisor.supervise() == EXIT_DONE
    assert len(slurm.sbatch_calls) == 1


def test_an_epilog_record_another_user_planted_is_no_evidence(tmp_path: Path) -> None:
    from clusterctl.launcher.shared.runs import create_run
    from clusterctl.launcher.pure.spec import load_spec
    from clusterctl.launcher.login.supervisor import EXIT_DONE, Hooks, Supervisor
    from clusterctl.records.actions import Action
    from clusterctl.records.job_health import HealthFinding, JobHealthRecord, write_job_health
    from tests.conftest import REPO
    from tests.unit.test_supervisor_loop import Clock, ScriptedSlurm

    run = create_run(tmp_path / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    records = tmp_path / "records"
    forged = JobHealthRecord(job_id="1", node="node2", window_start="2026-11-22T15:00:00Z",
                             window_end="2026-11-22T15:05:00Z", written_at="2026-11-22T15:05:01Z",
                             findings=(HealthFinding(kind="xid", action=Action.DRAIN_RESET, reason="GPU fell off the bus",
                                                     source="healthd", xid=79, gpu=3),))

    def script() -> None:
        if list(slurm.jobs) == ["1"] and slurm.jobs["1"]["job_state"] == "RUNNING":
            # a user blames a healthy node by writing a record into the (user-writable) records directory
            os.chown(write_job_health(records, forged), 1000, 1000)
            slurm.end("1", "FAILED", 1 << 8)
        elif list(slurm.jobs) == ["1", "2"]:
            slurm.end("2", "COMPLETED")
    slurm.on_poll = script
    said: list[str] = []
    hooks = Hooks(clock=clock.time, sleep=clock.sleep, say=said.append)
    supervisor = Supervisor(RunDir(run.path), Slurm(slurm), "/py", records, hooks, evidence_grace=0.0, uid=0)
    assert supervisor.supervise() == EXIT_DONE
    assert [e for e in run.events() if e.event == "decided"][0].outcome == "program-failure"
    assert any("not written by the epilog" in line and "uid 1000" in line for line in said)


def test_no_job_id_that_is_not_one_reaches_a_slurm_argv() -> None:
    from clusterctl.errors import SlurmCommandError
    ran: list[list[str]] = []

    def runner(argv: Any, timeout: float) -> Completed:
        ran.append(list(argv))
        return Completed(0, "slurm-wlm 24.11.5\n" if argv[0] == "sbatch" else '{"jobs": []}', "")
    slurm = Slurm(runner)
    for bad in ("--help", "-1", "1,2", "\u0661\u0662", "12 13"):
        with pytest.raises(SlurmCommandError, match="is not a Slurm job id"):
            slurm.cancel([bad])
        with pytest.raises(SlurmCommandError, match="is not a Slurm job id"):
            slurm.accounting(["7", bad])
        with pytest.raises(SlurmCommandError, match="is not a Slurm job id"):
            slurm.queue([bad])
    assert not any(argv[0] in ("scancel", "sacct", "squeue") for argv in ran)


def test_a_node_name_that_could_be_an_option_is_never_blamed() -> None:
    from clusterctl.launcher.login.supervisor import job_nodes
    from clusterctl.slurm.jobs import JobReport
    report = JobReport("7", "toy", "FAILED", "", "node[1-2],-x,--exclude=all", 1, None, 0.0, 0.0, 0.0)
    assert job_nodes(report) == ["node1", "node2"]


def test_squeue_names_each_jobs_user_and_sacct_keeps_its_state_flags() -> None:
    from clusterctl.slurm.jobs import parse_sacct_json, parse_squeue_json
    jobs = parse_squeue_json(REAL_SQUEUE)
    assert {job.user_id for job in jobs.values()} == {0}
    for report in parse_sacct_json((DATA / "sacct.json").read_text()).values():
        assert report.user_id is None and isinstance(report.state_flags, tuple)


def _job(slurm: Any, job_id: str) -> None:
    slurm.jobs[job_id] = {"job_id": int(job_id), "name": "toy", "job_state": "RUNNING", "state_reason": "None",
                          "nodes": "node1", "exit_code": 0, "submit_time": 1, "start_time": 1, "end_time": 0,
                          "comment": "", "user_id": 0}


def _plant_run(runs: Path, name: str, job_ids: list[str], at: float, owner: int) -> Path:
    """A run directory as another user would make it (their own files, readable by all)."""
    from clusterctl.launcher.pure.spec import load_spec
    from clusterctl.launcher.shared.runs import create_run
    from clusterctl.records.run_journal import Submitted
    from tests.conftest import REPO

    run = create_run(runs / name, load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    for attempt, job_id in enumerate(job_ids, start=1):
        run.record(Submitted(at=at + attempt, attempt=attempt, job_id=job_id))
    for path in (run.path, run.path / "spec.json", run.journal_path):
        os.chown(path, owner, owner)
    run.path.chmod(0o755)
    return run.path


def test_cancel_by_job_id_never_acts_on_a_run_another_user_planted(shared_runs: Path) -> None:
    from clusterctl.launcher.login.use_cases import cancel_run, resolve_runs
    from tests.unit.test_supervisor_loop import Clock, ScriptedSlurm

    mine = _plant_run(shared_runs, "mine", ["100"], 1000.0, os.getuid())
    mine_too = _plant_run(shared_runs, "mine-too", ["101"], 1000.0, os.getuid())
    # Newer than mine, listing my job 100 and the job of my other run: before, `cancel 100` took it.
    planted = _plant_run(shared_runs, "planted", ["100", "101"], 5000.0, 1000)
    slurm = ScriptedSlurm(Clock())
    for job_id in ("100", "101"):
        _job(slurm, job_id)
    notes: list[str] = []
    runs = resolve_runs("100", shared_runs, notes.append)
    assert [run.path for run in runs] == [mine]
    assert any(str(planted) in note and "not this user's run" in note and "owned by uid 1000" in note
               for note in notes), notes
    assert cancel_run(runs[0], Slurm(slurm)) == ["100"]
    assert slurm.jobs["101"]["job_state"] == "RUNNING"  # the other run's job lives on
    assert [e.event for e in RunDir(mine_too).events()][-1] == "submitted"  # and its supervisor is not stopped
    assert [e.event for e in RunDir(planted).events()][-1] == "submitted"


def test_a_job_only_another_users_run_lists_is_not_found_and_that_run_is_named(shared_runs: Path) -> None:
    from clusterctl.launcher.login.use_cases import cancel_run, resolve_runs
    from tests.unit.test_supervisor_loop import Clock, ScriptedSlurm

    planted = _plant_run(shared_runs, "planted", ["102"], 5000.0, 1000)
    notes: list[str] = []
    with pytest.raises(RunError, match="no run of yours .* submitted job 102"):
        resolve_runs("102", shared_runs, notes.append)
    assert len(notes) == 1 and str(planted) in notes[0] and "skipped" in notes[0]
    notes.clear()
    assert resolve_runs(None, shared_runs, notes.append) == []  # `status` lists only this user's runs
    assert notes and "not shown" in notes[0]
    slurm = ScriptedSlurm(Clock())
    _job(slurm, "102")
    with pytest.raises(RunError, match="only its owner may supervise or cancel"):
        cancel_run(RunDir(planted), Slurm(slurm))  # named by its path: still not this user's to cancel through
    assert slurm.jobs["102"]["job_state"] == "RUNNING"


def test_a_run_symlinked_into_the_runs_directory_is_not_looked_up(shared_runs: Path, tmp_path: Path) -> None:
    from clusterctl.launcher.login.use_cases import resolve_runs

    elsewhere = _plant_run(tmp_path, "elsewhere", ["103"], 1000.0, os.getuid())
    (shared_runs / "link").symlink_to(elsewhere)  # another user's name for one of my runs
    notes: list[str] = []
    with pytest.raises(RunError, match="no run of yours"):
        resolve_runs("103", shared_runs, notes.append)
    assert any("a symlink" in note for note in notes), notes


def test_a_fifo_journal_in_another_users_run_does_not_hang_the_lookup(shared_runs: Path) -> None:
    from clusterctl.launcher.login.use_cases import resolve_runs

    planted = _plant_run(shared_runs, "planted", [], 5000.0, 1000)
    os.unlink(planted / "journal.jsonl")
    os.mkfifo(planted / "journal.jsonl")
    with pytest.raises(RunError, match="no run of yours"):
        resolve_runs("104", shared_runs)


def _supervise_with_records(tmp_path: Path, plant: Callable[[Path], None]) -> tuple[str, list[str]]:
    """Supervise a run whose job 1 fails after `plant(records)` ran; the first decision's outcome and the notes."""
    from clusterctl.launcher.login.supervisor import EXIT_DONE, Hooks, Supervisor
    from clusterctl.launcher.pure.spec import load_spec
    from clusterctl.launcher.shared.runs import create_run
    from tests.conftest import REPO
    from tests.unit.test_supervisor_loop import Clock, ScriptedSlurm

    run = create_run(tmp_path / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    records = Path(tempfile.mkdtemp(prefix="clusterctl-records-", dir="/tmp"))  # other users can reach it
    records.chmod(0o755)

    def script() -> None:
        if list(slurm.jobs) == ["1"] and slurm.jobs["1"]["job_state"] == "RUNNING":
            plant(records)
            slurm.end("1", "FAILED", 1 << 8)
        elif list(slurm.jobs) == ["1", "2"]:
            slurm.end("2", "COMPLETED")
    slurm.on_poll = script
    said: list[str] = []
    hooks = Hooks(clock=clock.time, sleep=clock.sleep, say=said.append)
    supervisor = Supervisor(RunDir(run.path), Slurm(slurm), "/py", records, hooks, evidence_grace=0.0, uid=0)
    try:
        assert supervisor.supervise() == EXIT_DONE
    finally:
        shutil.rmtree(records)
    return [e for e in run.events() if e.event == "decided"][0].outcome, said


def _drain_record(job_id: str) -> Any:
    from clusterctl.records.actions import Action
    from clusterctl.records.job_health import HealthFinding, JobHealthRecord

    return JobHealthRecord(job_id=job_id, node="node2", window_start="2026-11-22T15:00:00Z",
                           window_end="2026-11-22T15:05:00Z", written_at="2026-11-22T15:05:01Z",
                           findings=(HealthFinding(kind="xid", action=Action.DRAIN_RESET, reason="GPU fell off the bus",
                                                   source="healthd", xid=79, gpu=3),))


def test_an_epilog_record_of_another_job_under_this_jobs_id_is_no_evidence(tmp_path: Path) -> None:
    from clusterctl.records.job_health import write_job_health

    def plant(records: Path) -> None:
        # The epilog's own record, of job 7 (a real drain there), found under job 1's directory.
        path = write_job_health(records, _drain_record("7"))
        (records / "1").mkdir()
        os.rename(path, records / "1" / "node2.json")
    outcome, said = _supervise_with_records(tmp_path, plant)
    assert outcome == "program-failure"  # before: node2 blamed for job 7's fault
    assert any("record of another job" in line and "'7'" in line for line in said), said


def test_a_future_jobs_directory_a_user_made_in_a_sticky_records_directory_gets_no_record_and_gives_no_evidence(
        tmp_path: Path) -> None:
    from clusterctl.files import UnsafePathError
    from clusterctl.records.job_health import job_health_path, write_job_health

    def plant(records: Path) -> None:
        records.chmod(0o1777)  # every user may create entries: only the sticky bit protects root's
        assert as_user(VICTIM, lambda: (records / "1").mkdir(mode=0o755)) == ("ok", None)  # before job 1 ends
        with pytest.raises(UnsafePathError, match=f"owned by uid {VICTIM}"):
            write_job_health(records, _drain_record("1"))  # the epilog writes nothing into it
        assert list((records / "1").iterdir()) == []
        # A record file owned by the epilog's identity that gets in there anyway (a hard link where
        # fs.protected_hardlinks is off, an older epilog) is still no evidence: the directory is the user's.
        staging = tmp_path / "staging"
        staging.mkdir()
        os.rename(write_job_health(staging, _drain_record("1")), job_health_path(records, "1", "node2"))
    outcome, said = _supervise_with_records(tmp_path, plant)
    assert outcome == "program-failure"  # before: node2 blamed on a record in a user's directory
    assert any("directory the epilog did not make" in line and f"owned by uid {VICTIM}" in line for line in said), said
