"""The supervisor on the real testbed: a node breaks mid-run, the run comes back on healthy
nodes from the last complete checkpoint and ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterctl.records.rank_map import read_rank_map
from clusterctl.records.run_journal import read_run_journal
from clusterctl_testbed.gpu_faults import Fault, inject
from tests.conftest import REPO, TEST_LAYOUT, clusterctl_on

pytestmark = pytest.mark.e2e

RECORDS = str(TEST_LAYOUT.root / "job-health")
STEPS = 60


def _spec(tmp_path: Path, command: list[str] | None = None, restart: str = "") -> Path:
    command = command or ["python3", "toy_trainer.py", "--checkpoint-dir", "{checkpoint_dir}", "--steps", str(STEPS),
                          "--checkpoint-every", "10", "--step-time", "0.15", "--log-every", "10",
                          "--peer-timeout", "15"]
    path = tmp_path / "job.toml"
    path.write_text(f"""\
[job]
name = "supervised"
nodes = 3
gpus_per_node = 8
[launch]
command = {json.dumps(command)}
workdir = "{REPO / 'examples'}"
[parallel]
tp = 8
pp = 3
[checkpoint]
dir = "{{run_dir}}/checkpoints"
validator = "manifest"
resume_args = ["--resume", "{{path}}"]
[restart]
poll_seconds = 0.5
backoff_seconds = 0.5
{restart}
""")
    return path


def _clusterctl(cluster, *args: str) -> subprocess.Popen:
    """clusterctl on the login node, in the background (the supervisor is long-lived)."""
    argv = [*cluster.enter("ctl", cwd=str(REPO)), str(cluster.python), "-c", "from clusterctl.launcher.login.cli import main; main()", *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _supervised(cluster, tmp_path: Path, **kwargs) -> tuple[subprocess.Popen, Path]:
    run_dir = tmp_path / "run"
    proc = _clusterctl(cluster, "submit", str(_spec(tmp_path, **kwargs)), "--run-dir", str(run_dir), "--supervise",
                       "--job-records", RECORDS)
    return proc, run_dir


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


def _finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the supervisor did not finish:\n{out}") from None
    return proc.returncode, out


def _events(run_dir: Path, kind: str) -> list:
    return [e for e in read_run_journal(run_dir / "journal.jsonl").events if e.event == kind]


def _slots(run_dir: Path, job_id: str) -> tuple[str, ...]:
    return read_rank_map(run_dir / "jobs" / job_id).slots


@pytest.fixture(scope="module")
def reference(testbed_session, tmp_path_factory) -> dict:
    """The final state of the same training, uninterrupted."""
    tmp = tmp_path_factory.mktemp("reference")
    spec = _spec(tmp)
    clusterctl_on(testbed_session, "submit", str(spec), "--run-dir", str(tmp / "run"), "--wait", timeout=180)
    final = json.loads((tmp / "run" / "checkpoints" / "final.json").read_text())
    assert final["step"] == STEPS
    return final


def _assert_recovered(run_dir: Path, reference: dict, broken: str, out: str) -> dict:
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text()) == reference, out
    submitted, decided = _events(run_dir, "submitted"), _events(run_dir, "decided")
    assert len(submitted) == 2 and [d.attempt for d in decided] == [1, 2], out
    first = decided[0]
    assert first.outcome == "node-failure" and first.action == "resubmit", out
    assert [b.node for b in first.blame] == [broken] and first.blame[0].evidence, out
    assert submitted[1].exclude == broken and broken not in _slots(run_dir, submitted[1].job_id)
    assert submitted[1].resume_from.endswith(f"step-{first.checkpoint_step:08d}")
    assert decided[1].outcome == "completed" and _events(run_dir, "done")
    return first


@pytest.mark.slurm_versions
def test_an_xid_79_mid_run_is_blamed_excluded_and_the_run_ends_bit_identical(cluster, tmp_path, reference):
    proc, run_dir = _supervised(cluster, tmp_path)
    _wait_for(run_dir / "checkpoints" / "step-00000020", proc)
    job = _events(run_dir, "submitted")[0].job_id
    broken = _slots(run_dir, job)[1]
    # A checkpoint half-written at the moment of failure: payload there, manifest (written last) not.
    torn = run_dir / "checkpoints" / "step-00000090"
    torn.mkdir()
    (torn / "params.json").write_text('{"params": [1, 2')
    inject(cluster.nvml_dir(broken), Fault("xid", gpu=3, value=79))
    code, out = _finish(proc)
    assert code == 0, out
    first = _assert_recovered(run_dir, reference, broken, out)
    evidence = " ".join(first.blame[0].evidence)
    assert "drained by healthd: healthd: xid 79 gpu3" in evidence and "epilog record: drain-reboot" in evidence
    assert f"skipping checkpoint {torn}: no manifest.json (written last): incomplete" in out
    assert 20 <= first.checkpoint_step < STEPS


def test_a_killed_node_is_blamed_and_the_run_completes_elsewhere(cluster, tmp_path, reference):
    proc, run_dir = _supervised(cluster, tmp_path)
    _wait_for(run_dir / "checkpoints" / "step-00000020", proc)
    broken = _slots(run_dir, _events(run_dir, "submitted")[0].job_id)[2]
    cluster.kill_node(broken)
    code, out = _finish(proc)
    assert code == 0, out
    first = _assert_recovered(run_dir, reference, broken, out)
    # Slurm's word on the node: DOWN, or (when it failed the job before marking the node) not responding.
    evidence = " ".join(first.blame[0].evidence)
    assert f"Slurm: {broken} is" in evidence or f"Slurm: job NODE_FAIL and {broken} is not responding" in evidence


@pytest.mark.matrix_only  # CI time: its Slurm side is the killed node's; in the allocation, the cut-link story
def test_a_cut_network_link_is_blamed_without_waiting_for_hung_ranks(cluster, tmp_path, reference):
    proc, run_dir = _supervised(cluster, tmp_path)
    _wait_for(run_dir / "checkpoints" / "step-00000020", proc)
    broken = _slots(run_dir, _events(run_dir, "submitted")[0].job_id)[2]
    cluster.cut_link(broken)
    code, out = _finish(proc)
    assert code == 0, out
    _assert_recovered(run_dir, reference, broken, out)


@pytest.mark.matrix_only  # CI time: clusterctl's own text handling (unit-tested); Slurm's side as the killed node's
def test_a_node_an_admin_drained_with_a_bracketed_reason_then_dies_is_blamed_and_its_reason_shown_as_written(
        cluster, tmp_path, reference):
    # `[/dev/nvidia3]` is what killed a running supervisor when it read reasons as rich markup, between
    # journaling "ending" and cancelling the job; `[maint]` lost its brackets and `:smile:` became an emoji.
    reason = "GPU gone [/dev/nvidia3] [maint] :smile:"
    proc, run_dir = _supervised(cluster, tmp_path)
    _wait_for(run_dir / "checkpoints" / "step-00000020", proc)
    broken = _slots(run_dir, _events(run_dir, "submitted")[0].job_id)[1]
    # An admin drains a flaky node under the running job (Slurm lets the job run on), then it dies:
    # Slurm keeps the admin's reason on the DOWN node.
    cluster.run_on("ctl", ["scontrol", "update", f"NodeName={broken}", "State=DRAIN", f"Reason={reason}"])
    cluster.kill_node(broken)
    code, out = _finish(proc)
    assert code == 0, out
    first = _assert_recovered(run_dir, reference, broken, out)
    assert reason in " ".join(first.blame[0].evidence), first.blame
    assert reason in out  # the supervisor's own lines say it as the admin wrote it
    shown = clusterctl_on(cluster, "report", str(run_dir)).stdout
    assert reason in " ".join(shown.split()), shown  # as written, wherever the 80 columns of a pipe wrap it


@pytest.mark.slurm_versions
def test_a_program_that_fails_by_itself_stops_after_its_retries_with_no_node_blamed(cluster, tmp_path):
    command = ["python3", "-c", "import os, sys; print('boom on rank', os.environ['RANK']); sys.exit(5)"]
    proc, run_dir = _supervised(cluster, tmp_path, command=command, restart="max_program_failures = 1")
    code, out = _finish(proc)
    assert code == 1, out
    decided = _events(run_dir, "decided")
    assert [d.outcome for d in decided] == ["program-failure", "program-failure"]
    assert [d.action for d in decided] == ["resubmit", "stop"] and all(not d.blame for d in decided)
    stopped = _events(run_dir, "stopped")[0].message
    assert "the program's own failure" in stopped and "max_program_failures = 1" in stopped
    assert "run stopped:" in out


@pytest.mark.one_release  # clusterctl's journal; Slurm's side (squeue, sacct of its jobs) as in the Xid story
def test_a_supervisor_killed_mid_run_is_reattached_with_no_duplicate_job_or_decision(cluster, tmp_path, reference):
    proc, run_dir = _supervised(cluster, tmp_path)
    _wait_for(run_dir / "checkpoints" / "step-00000020", proc)
    proc.send_signal(signal.SIGKILL)  # the login session dies with the supervisor in it
    proc.wait()
    job = _events(run_dir, "submitted")[0].job_id
    broken = _slots(run_dir, job)[0]
    inject(cluster.nvml_dir(broken), Fault("xid", gpu=0, value=79))  # fails while nobody watches
    deadline = time.monotonic() + 60
    while cluster.run_on("ctl", ["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip() in (
            "RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    again = _clusterctl(cluster, "supervise", str(run_dir), "--job-records", RECORDS)
    code, out = _finish(again)
    assert code == 0, out
    _assert_recovered(run_dir, reference, broken, out)
    # A third attach finds the run finished and does nothing.
    last = _clusterctl(cluster, "supervise", str(run_dir), "--job-records", RECORDS)
    code, out = _finish(last, timeout=60)
    assert code == 0 and "run done" in out and len(_events(run_dir, "submitted")) == 2


def test_a_detached_supervisor_rides_out_a_controller_restart(cluster, tmp_path, reference):
    run_dir = tmp_path / "run"
    done = clusterctl_on(cluster, "submit", str(_spec(tmp_path)), "--run-dir", str(run_dir), "--supervise",
                         "--detach", "--job-records", RECORDS)
    assert "supervising in the background" in done.stdout
    deadline = time.monotonic() + 60
    while not (run_dir / "checkpoints" / "step-00000010").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cluster.stop_daemon("slurmctld")  # the jobs keep running on their nodes
    time.sleep(4)
    cluster.start_controller()
    deadline = time.monotonic() + 120
    while not _events(run_dir, "done"):
        assert time.monotonic() < deadline, (run_dir / "supervisor.log").read_text()
        time.sleep(0.5)
    # Slurm's clients retry a missing controller themselves, so the supervisor may only see slow
    # answers (or, for longer outages, errors it backs off from); either way: one attempt, done.
    assert "run done" in (run_dir / "supervisor.log").read_text()
    assert len(_events(run_dir, "submitted")) == 1 and not _events(run_dir, "decided")[0].blame
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text()) == reference


@pytest.mark.one_release
def test_a_supervisor_kept_by_slurm_outlives_its_killed_process_and_resubmits_with_nobody_typing(
        cluster, tmp_path, reference):
    """`--in-slurm`: the supervisor runs as a small requeueable job.  Its process is killed and nobody
    re-attaches; then a GPU fails under the training job (no spare): the supervisor the job started
    again resubmits without the node, and the run completes bit-identical.  The job then ends."""
    run_dir = tmp_path / "run"
    started = clusterctl_on(cluster, "submit", str(_spec(tmp_path)), "--run-dir", str(run_dir), "--supervise",
                            "--in-slurm", "--job-records", RECORDS)
    assert "supervising in Slurm job" in started.stdout, started.stdout
    supervisor_job = started.stdout.split("supervising in Slurm job ", 1)[1].split()[0]
    log = run_dir / "supervisor-slurm.log"
    deadline = time.monotonic() + 90
    while not (run_dir / "checkpoints" / "step-00000020").exists():
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no supervisor log"
        time.sleep(0.2)
    where = cluster.run_on("ctl", ["squeue", "-h", "-j", supervisor_job, "-o", "%N"]).stdout.strip()
    cluster.run_on(where, ["pkill", "-KILL", "-f", f"supervise {run_dir}"])  # the process, not the job
    job = _events(run_dir, "submitted")[0].job_id
    broken = next(n for n in _slots(run_dir, job) if n != where)
    inject(cluster.nvml_dir(broken), Fault("xid", gpu=2, value=79))
    deadline = time.monotonic() + 240
    while not _events(run_dir, "done"):
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.5)
    out = log.read_text()
    assert "the supervisor exited 137; starting it again" in out, out
    _assert_recovered(run_dir, reference, broken, out)
    deadline = time.monotonic() + 30
    while cluster.run_on("ctl", ["squeue", "-h", "-j", supervisor_job, "-o", "%T"], check=False).stdout.strip():
        assert time.monotonic() < deadline, "the supervisor job did not end with the run"
        time.sleep(0.5)
