"""The prolog and epilog on the real testbed: the last gate before a job, the first witness after."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from clusterctl.records.actions import Action
from clusterctl.records.healthd_node_record import read_node_record
from clusterctl.records.healthd_tier_reclaim import read_tier_reclaims
from clusterctl.records.job_health import JobHealthRecord, job_health_path, read_job_health
from clusterctl_testbed.gpu_faults import Fault, inject
from clusterctl_testbed.system import is_alive
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

def wait_job(cluster, job_id: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = cluster.run_on("ctl", ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"]).stdout.strip()
        if state and state.split()[0] not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING"):
            return state.split()[0]
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s")


def node_row(cluster, node):
    return next(n for n in cluster.nodes() if n.name == node)


def record(cluster, job: str, node: str) -> JobHealthRecord:
    path = job_health_path(cluster.layout.root / "job-health", job, node)
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"no epilog record {path}"
        time.sleep(0.2)
    return read_job_health(path)


@pytest.mark.slurm_versions
def test_prolog_refuses_a_node_with_a_failed_remap_and_the_job_runs_elsewhere(cluster, tmp_path):
    cluster.stop_daemon("healthd:node2")  # the prolog is the last gate: healthd has not acted yet
    inject(cluster.nvml_dir("node2"), Fault("remap-failure", gpu=2))
    out = tmp_path / "job.out"
    job = cluster.run_on("ctl", ["sbatch", "--parsable", "-N3", "--gpus-per-node=8", "-o", str(out),
                                 "--wrap", "srun hostname"]).stdout.strip()
    assert wait_job(cluster, job, timeout=120) == "COMPLETED"
    row = node_row(cluster, "node2")
    assert row.state.startswith("drain") and row.reason.startswith("healthd: remap-failure gpu2 ")
    assert sorted(out.read_text().split()) == ["node1", "node3", "node4"]
    refusals = read_node_record(cluster.layout.host_dir("node2") / "lib-healthd")
    assert any(r.job_id == job and "remap-failure" in r.outcome for r in refusals)


def test_xid_79_during_a_job_fails_it_and_the_epilog_names_node3_and_the_gpu(cluster, tmp_path):
    ckpt = tmp_path / "ckpt"
    job = cluster.run_on("ctl", [
        "sbatch", "--parsable", "--no-requeue", "-N2", "-w", "node3,node4", "--ntasks-per-node=8", "-o", str(tmp_path / "out"),
        str(REPO / "examples" / "toy_trainer.sbatch"), str(ckpt), "--steps", "600", "--step-time", "0.05",
        "--peer-timeout", "10"], cwd=str(REPO)).stdout.strip()
    deadline = time.monotonic() + 60
    while not (ckpt / "step-00000010").exists():
        assert time.monotonic() < deadline, (tmp_path / "out").read_text()
        time.sleep(0.1)
    inject(cluster.nvml_dir("node3"), Fault("xid", gpu=3, value=79))
    assert wait_job(cluster, job) == "FAILED"
    broke = record(cluster, job, "node3")
    assert broke.hardware_fault
    assert any(f.what == "xid 79" and f.gpu == 3 and f.action is Action.DRAIN_REBOOT for f in broke.findings)
    assert not record(cluster, job, "node4").hardware_fault
    assert node_row(cluster, "node3").state.startswith("drain")


def test_an_app_xid_during_a_job_is_recorded_and_the_node_stays_in_service(cluster):
    job = cluster.run_on("ctl", ["sbatch", "--parsable", "-N1", "-w", "node1", "--gpus-per-node=8",
                                 "--wrap", "sleep 4"]).stdout.strip()
    deadline = time.monotonic() + 30
    while cluster.run_on("ctl", ["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    inject(cluster.nvml_dir("node1"), Fault("xid", gpu=1, value=13))
    assert wait_job(cluster, job) == "COMPLETED"
    rec = record(cluster, job, "node1")
    assert rec.verdict is Action.APP_FAULT and not rec.hardware_fault
    assert any(f.what == "xid 13" and f.gpu == 1 for f in rec.findings)
    time.sleep(1)
    assert node_row(cluster, "node1").state == "idle"


def test_hooks_are_correct_with_an_empty_environment_and_healthd_stopped(cluster):
    cluster.stop_daemon("healthd:node4")

    def hook(name: str, *env: str):
        return cluster.run_on("node4", ["env", "-i", *env, f"{cluster.bindir}/{name}"], check=False, timeout=60)

    ok = hook("clusterctl-prolog", "SLURM_JOB_ID=900", "SLURM_JOB_GPUS=0,1")
    assert ok.returncode == 0, ok.stderr
    assert "healthd is not running or its state is stale" in ok.stderr
    assert "healthy (direct check)" in hook("clusterctl-healthcheck").stdout
    inject(cluster.nvml_dir("node4"), Fault("gpu-lost", gpu=1))
    other = hook("clusterctl-prolog", "SLURM_JOB_ID=901", "SLURM_JOB_GPUS=2,3")
    assert other.returncode == 0, "a lost GPU the job does not use does not refuse it"
    refused = hook("clusterctl-prolog", "SLURM_JOB_ID=902", "SLURM_JOB_GPUS=0,1")
    assert refused.returncode == 1
    assert "job 902 refused on node4: gpu1 gpu-lost" in refused.stderr
    assert node_row(cluster, "node4").reason.startswith("healthd: gpu-lost gpu1 ")
    assert hook("clusterctl-epilog", "SLURM_JOB_ID=902", "SLURM_JOB_GPUS=0,1").returncode == 0
    assert record(cluster, "902", "node4").hardware_fault


# ---- the hooks under a stopped controller ----------------------------------------------------------

def hook_pid(cluster, node: str, job: str, hook: str, timeout: float) -> int:
    """The pid of the `hook` (clusterctl-prolog, clusterctl-epilog) slurmd runs on `node` for `job`, as soon as
    it exists.  Every testbed on this machine shares its PID space, and their job ids all start at 1: the
    process is this node's when it is in the node's own UTS namespace."""
    here = os.readlink(f"/proc/{cluster.holder(node)}/ns/uts")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if hook.encode() in (entry / "cmdline").read_bytes() and os.readlink(entry / "ns" / "uts") == here \
                        and f"SLURM_JOB_ID={job}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    return int(entry.name)
            except OSError:
                continue
        time.sleep(0.005)
    raise AssertionError(f"slurmd on {node} ran no {hook} for job {job} within {timeout} s")


@contextmanager
def controller_stopped_under(cluster, node: str, job: str, hook: str) -> Iterator[int]:
    """slurmctld stopped (SIGSTOP: it takes connections and never answers) from the moment `hook` starts
    for `job` on `node` until the block ends; the hook's pid.  The hook is held (SIGSTOP) while the
    controller is stopped, so its Slurm calls meet the stopped controller however loaded the machine is."""
    hook_process = hook_pid(cluster, node, job, hook, timeout=60)
    controller = cluster._pids()["slurmctld"]
    os.kill(hook_process, signal.SIGSTOP)
    try:
        os.kill(controller, signal.SIGSTOP)
        try:
            os.kill(hook_process, signal.SIGCONT)
            yield hook_process
        finally:
            os.kill(controller, signal.SIGCONT)
    finally:
        if is_alive(hook_process):
            os.kill(hook_process, signal.SIGCONT)


def seconds_to_end(pid: int, timeout: float) -> float:
    started = time.monotonic()
    while is_alive(pid):
        assert time.monotonic() - started < timeout, f"the hook (pid {pid}) still runs after {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - started


def test_under_a_stopped_controller_the_hooks_let_the_job_in_record_it_and_slurm_drains_nothing(cluster, tmp_path):
    """A lost GPU on node3 that healthd (stopped) has not acted on, and slurmctld stopped whenever a hook of the
    job runs: the prolog cannot drain, so it lets the job in (exit 0) within hook_timeout; the epilog records
    the fault and ends within it.  Neither makes Slurm drain the node ("Prolog error") and nothing hangs.

    hook_timeout is 1 s here (its least): its Slurm share (0.75 s) is shorter than the testbed's MessageTimeout
    (2 s), so the budget, not Slurm's client, ends the call; and slurmctld stays stopped for as short a time as
    the hooks allow: stopped for more than about 3 s of the testbed's SlurmdTimeout (5 s) it declares the node
    DOWN on waking, and the job ends NODE_FAIL (seen once in CI with 2 s).  slurmd (22.05, SlurmdDebug=info) logs a hook's output only when
    it fails: the node's own record says what the prolog did."""
    hook_timeout = 1.0
    toml = cluster.layout.host_dir("node3") / "etc-clusterctl" / "healthd.toml"
    original = toml.read_text()
    toml.write_text(original.replace("resume_when_clean = true", f"resume_when_clean = true\nhook_timeout = {hook_timeout}"))
    try:
        cluster.stop_daemon("healthd:node3")  # the hooks are the only ones to act on the fault
        inject(cluster.nvml_dir("node3"), Fault("gpu-lost", gpu=1))
        job = cluster.run_on("ctl", ["sbatch", "--parsable", "-N1", "-w", "node3", "--gpus-per-node=8",
                                     "-o", str(tmp_path / "out"), "--wrap", "sleep 2"]).stdout.strip()
        with controller_stopped_under(cluster, "node3", job, "clusterctl-prolog") as prolog:
            prolog_took = seconds_to_end(prolog, timeout=hook_timeout + 10)
        with controller_stopped_under(cluster, "node3", job, "clusterctl-epilog") as epilog:
            epilog_took = seconds_to_end(epilog, timeout=hook_timeout + 10)
        assert wait_job(cluster, job, timeout=60) == "COMPLETED"
        refusals = read_node_record(cluster.layout.host_dir("node3") / "lib-healthd")
        print(f"under the stopped controller: prolog {prolog_took:.2f} s, epilog {epilog_took:.2f} s; {refusals}")
        ran_on = cluster.run_on("ctl", ["sacct", "-n", "-X", "-P", "-j", job, "-o", "NodeList"]).stdout.split()
        assert ran_on == ["node3"]  # let in: a prolog exiting non-zero would have sent the job elsewhere
        # Recorded after the drain path returned by itself: inside the budget, not ended at the deadline.
        [refusal] = [r for r in refusals if r.job_id == job]
        assert refusal.outcome.startswith("could not drain"), refusal.outcome
        assert record(cluster, job, "node3").hardware_fault
        assert not (cluster.layout.host_dir("node3") / "lib-healthd" / "jobs" / f"{job}.json").exists()
        row = node_row(cluster, "node3")
        assert not row.state.startswith("drain") and row.reason != "Prolog error", row
    finally:
        toml.write_text(original)


def test_a_job_start_reclaims_a_checkpoint_tier_nobody_resumed_from_and_keeps_a_fresh_one(cluster, tmp_path):
    """Issue 25, nodes stay healthy: a run's tier untouched for 30 h goes at the node's next job start (the
    testbed's jobs run as root, so it is the same user's: tier_keep_hours, 24 h by default); one saved a
    minute ago is a resubmission's fast resume and stays."""
    mine = Path("/dev/shm/clusterctl-0")  # the testbed's nodes share this machine's /dev/shm
    stale, fresh = mine / "ckpt-0e2e0e2e0e2e0e2e", mine / "ckpt-0e2e0e2e0e2e0e2f"
    mine.mkdir(mode=0o700, exist_ok=True)  # as a job makes it: private to its user
    try:
        for tree in (stale, fresh):
            (tree / "node1" / "local" / "step-000000000010").mkdir(parents=True, mode=0o700)
            (tree / "node1" / "local" / "step-000000000010" / "shard").write_bytes(b"x" * 4096)
        old = time.time() - 30 * 3600
        for folder in [stale, *(p for p in stale.rglob("*") if p.is_dir())]:
            os.utime(folder, (old, old))
        job = cluster.run_on("ctl", ["sbatch", "--parsable", "-N1", "-w", "node1", "-o", str(tmp_path / "out"),
                                     "--wrap", "true"]).stdout.strip()
        assert wait_job(cluster, job, timeout=60) == "COMPLETED"
        assert not stale.exists() and (fresh / "node1" / "local" / "step-000000000010" / "shard").exists()
        reclaims = [r for r in read_tier_reclaims(cluster.layout.host_dir("node1") / "lib-healthd") if r.job_id == job]
        assert [(t.path, t.uid, t.runs, t.error) for r in reclaims for t in r.trees if t.path == str(stale)] == [
            (str(stale), 0, 1, None)]
    finally:
        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(fresh, ignore_errors=True)
