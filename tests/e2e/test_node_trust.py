"""Ordinary users cannot get a testbed node drained, nor crash its epilog, by feeding it data (issue 18)."""

from __future__ import annotations

import json
import os
import time

import pytest

from clusterctl.records.actions import Action
from clusterctl.records.gpu_evidence import GpuEvidence
from clusterctl.records.healthd_state import read_healthd_state
from clusterctl.records.healthd_xid_history import read_xid_history
from clusterctl.records.job_health import job_health_path, read_job_health
from clusterctl_testbed.gpu_faults import Fault, inject, pci_bus_id
from tests.conftest import wait_job

# CI time: trust of the node's inputs: their Slurm side is the drain door's, which runs everywhere.
pytestmark = [pytest.mark.e2e, pytest.mark.one_release]


def node_row(cluster, node):
    return next(n for n in cluster.nodes() if n.name == node)


def append_kernel_lines(cluster, node: str, lines: list[tuple[int, str]]) -> None:
    """Append (priority, message) records to the node's kernel-log stand-in, as the kernel numbers them."""
    path = cluster.nvml_dir(node) / "kmsg"
    sequence = sum(1 for _ in path.open()) if path.exists() else 0
    usec = int(time.monotonic() * 1e6)
    with path.open("a") as out:
        for offset, (priority, message) in enumerate(lines):
            out.write(f"{priority},{sequence + offset},{usec},-;{message}\n")


def settled_state(cluster, node: str, timeout: float = 20) -> str:
    """The node's state once Slurm has finished its last job's epilog (`completing` passes)."""
    deadline = time.monotonic() + timeout
    state = node_row(cluster, node).state
    while state.startswith("completing") and time.monotonic() < deadline:
        time.sleep(0.2)
        state = node_row(cluster, node).state
    return state


def submit(cluster, *args: str) -> str:
    return cluster.run_on("ctl", ["sbatch", "--parsable", *args]).stdout.strip()


def wait_running(cluster, job: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while cluster.run_on("ctl", ["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} not running"
        time.sleep(0.2)


def records_dir(cluster):
    return cluster.layout.root / "job-health"


def test_forged_kernel_lines_drain_nothing_via_healthd_or_the_epilog(cluster):
    job = submit(cluster, "-N1", "-w", "node2", "--gpus-per-node=8", "--wrap", "sleep 4")
    wait_running(cluster, job)
    gpu3 = pci_bus_id(3)
    append_kernel_lines(cluster, "node2", [
        (14, f"NVRM: Xid (PCI:{gpu3}): 79, pid=1, GPU has fallen off the bus."),  # user facility: /dev/kmsg write
        (3, f'overlayfs: unrecognized mount option "NVRM: Xid (PCI:{gpu3}): 79, pid=1" or missing value'),
        (3, "NVRM: Xid (PCI:0000:77:00): 48, pid=1, not a GPU of this node"),
        (4, "NVRM: GPU at PCI:0000:77:00: GPU has fallen off the bus."),
    ])
    assert wait_job(cluster, job) == "COMPLETED"
    time.sleep(2 * cluster.layout.healthd_interval)
    assert node_row(cluster, "node2").state == "idle"
    record = read_job_health(job_health_path(records_dir(cluster), job, "node2"))
    assert record.findings == ()
    state = read_healthd_state(cluster.layout.host_dir("node2") / "run-healthd")
    assert state is not None and not [f for f in state.findings() if f.kind == "xid"]


def test_a_full_tmp_warns_and_never_drains(cluster):
    toml = cluster.layout.host_dir("node3") / "etc-clusterctl" / "healthd.toml"
    original = toml.read_text()
    # Every path counts as full (free < 100%): /tmp, watched by default, is one users fill.
    toml.write_text(original.replace('disk_paths = ["/"]', 'disk_paths = ["/", "/tmp"]')
                    .replace("disk_min_free = 0.0", "disk_min_free = 1.0"))
    try:
        cluster.stop_daemon("healthd:node3")
        cluster.start_healthd("node3")
        time.sleep(2 * cluster.layout.healthd_interval + 1)
        job = submit(cluster, "-N1", "-w", "node3", "--wrap", "true")  # the prolog and epilog judge it too
        assert wait_job(cluster, job) == "COMPLETED"
        state = read_healthd_state(cluster.layout.host_dir("node3") / "run-healthd")
        assert state is not None
        disk = [f for f in state.node_findings if f.kind == "host-disk"]
        assert disk and all(f.action is Action.WARN for f in disk)
        assert settled_state(cluster, "node3") == "idle"
    finally:
        toml.write_text(original)
        cluster.stop_daemon("healthd:node3")
        cluster.start_healthd("node3")


def test_one_app_xid_on_a_shared_node_drains_nothing_and_names_only_its_job(cluster):
    first = submit(cluster, "-N1", "-w", "node1", "--gpus-per-node=1", "--wrap", "sleep 20")
    second = submit(cluster, "-N1", "-w", "node1", "--gpus-per-node=1", "--wrap", "sleep 20")
    wait_running(cluster, first)
    wait_running(cluster, second)
    # RUNNING is set at allocation; the prolog (PrologFlags=Alloc) may still be running then.
    note = cluster.layout.host_dir("node1") / "lib-healthd" / "jobs" / f"{first}.json"
    deadline = time.monotonic() + 30
    while not note.exists():
        assert time.monotonic() < deadline, f"the prolog of job {first} left no job-start note"
        time.sleep(0.2)
    start = json.loads(note.read_text())
    [gpu] = start["gpus"]
    injected_at = time.time()  # earlier tests may have left Xid 13 sightings of their own jobs
    inject(cluster.nvml_dir("node1"), Fault("xid", gpu=gpu, value=13))
    time.sleep(2 * cluster.layout.healthd_interval)
    assert node_row(cluster, "node1").state in ("mixed", "allocated")
    sightings = [s for s in read_xid_history(cluster.layout.host_dir("node1") / "lib-healthd") if s.xid == 13 and s.at >= injected_at - 1]
    assert sightings and {s.job_ids for s in sightings} == {(first,)}
    cluster.run_on("ctl", ["scancel", first, second])


def test_a_planted_record_path_neither_redirects_roots_write_nor_fails_the_epilog(cluster, tmp_path):
    job = submit(cluster, "-N1", "-w", "node4", "--hold", "--wrap", "true")
    victim = tmp_path / "root-only"
    victim.mkdir()
    records_dir(cluster).mkdir(exist_ok=True)
    (records_dir(cluster) / job).symlink_to(victim)  # what a user of a world-writable records dir could do
    try:
        cluster.run_on("ctl", ["scontrol", "release", job])
        assert wait_job(cluster, job) == "COMPLETED"
        time.sleep(1)
        assert list(victim.iterdir()) == []
        assert node_row(cluster, "node4").state == "idle", "a failing epilog would have drained the node"
    finally:
        os.unlink(records_dir(cluster) / job)


ASK_GPUS = """\
import json, os, sys
from clusterctl.launcher.shared.straggler_actions import srun_gpu_evidence
record = srun_gpu_evidence(sys.executable)(sys.argv[1], os.environ)
print(record if isinstance(record, str) else json.dumps(record.to_json()))
"""


def asked_evidence(output: str) -> GpuEvidence:
    """The gpu-evidence record a straggler action read, from ASK_GPUS's output."""
    try:
        return GpuEvidence.from_json(json.loads(output.strip().splitlines()[-1]), "asked")
    except ValueError:
        raise AssertionError(f"not a gpu-evidence record: {output!r}") from None


@pytest.mark.slurm_versions
def test_on_a_shared_node_a_jobs_gpu_evidence_reads_only_its_own_gpus(cluster, tmp_path):
    """Another job holds 4 of node4's GPUs and one of them is thermally throttled.  A job with 4 GPUs
    on node3 and 4 on node4 asks node4's GPUs why it is slow, as its straggler action does from the
    batch script on node3 (whose SLURM_JOB_GPUS names node3's GPUs, not node4's): it reads only its
    own 4 GPUs there, says so, and nothing explains a slowdown.  The other job's evidence names the
    throttled GPU; a job without GPUs reads none and says why."""
    ask = tmp_path / "ask.py"
    ask.write_text(ASK_GPUS)
    other = submit(cluster, "-N1", "-w", "node4", "--gres=gpu:4", "--wrap", "sleep 60")
    wait_running(cluster, other)
    inject(cluster.nvml_dir("node4"), Fault("throttle", gpu=1, value=40))
    job = submit(cluster, "-N2", "-w", "node3,node4", "--gres=gpu:4", "--ntasks-per-node=1",
                 "-o", str(tmp_path / "job.out"), "--wrap", f"{cluster.python} {ask} node4")
    assert wait_job(cluster, job, timeout=60) == "COMPLETED", (tmp_path / "job.out").read_text()
    mine = asked_evidence((tmp_path / "job.out").read_text())
    assert mine.node == "node4" and [g.index for g in mine.gpus] == [4, 5, 6, 7], mine
    assert mine.scope == "GPU 4,5,6,7: this job's on this node (SLURM_STEP_GPUS)", mine
    assert mine.slowdown_reasons() == () and "GPU 1" not in " ".join(mine.to_text()), mine

    def asked_on_login(job_id: str) -> GpuEvidence:
        out = cluster.run_on("ctl", [str(cluster.python), str(ask), "node4"],
                             env={**os.environ, "SLURM_JOB_ID": job_id}).stdout
        return asked_evidence(out)

    theirs = asked_on_login(other)
    assert [g.index for g in theirs.gpus] == [0, 1, 2, 3], theirs
    assert [line.split(":")[0] for line in theirs.slowdown_reasons()] == ["GPU 1"], theirs
    no_gpus = submit(cluster, "-N1", "-w", "node4", "--wrap", "sleep 60")
    wait_running(cluster, no_gpus)
    none = asked_on_login(no_gpus)
    assert none.gpus == () and none.scope.startswith("no GPU: SLURM_STEP_GPUS is not set"), none
    assert none.problems[0].startswith("SLURM_STEP_GPUS is not set: Slurm names no GPU of this job"), none
    cluster.run_on("ctl", ["scancel", other, no_gpus])
