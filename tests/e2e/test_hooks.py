"""The prolog and epilog on the real testbed: the last gate before a job, the first witness after."""

from __future__ import annotations

import time

import pytest

from clusterctl.records.actions import Action
from clusterctl.records.healthd_node_record import read_node_record
from clusterctl.records.job_health import JobHealthRecord, job_health_path, read_job_health
from clusterctl_testbed.gpu_faults import Fault, inject
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
