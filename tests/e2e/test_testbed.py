"""The testbed is a real multi-host Slurm cluster with emulated GPUs (issue: foundation)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from clusterctl_testbed.gpu_faults import Fault, inject
from clusterctl_testbed.versions import HOST
from tests.conftest import TEST_SLURM, run_python_on

pytestmark = pytest.mark.e2e


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_four_idle_nodes_with_eight_gpus_each(cluster):
    # A job of the previous test may still be completing on a node: give Slurm a moment.
    deadline = time.monotonic() + 30
    nodes = cluster.nodes()
    while any(n.state != "idle" for n in nodes) and time.monotonic() < deadline:
        time.sleep(0.5)
        nodes = cluster.nodes()
    assert [(n.name, n.state, n.gres) for n in nodes] == [
        (f"node{i}", "idle", "gpu:8") for i in range(1, 5)
    ]


@pytest.mark.slurm_versions
@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_topology_has_two_leaves_under_a_spine(cluster):
    out = cluster.run_on("ctl", ["scontrol", "show", "topology"]).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "Nodes=node[1-2]" in lines["SwitchName=leaf1"]
    assert "Nodes=node[3-4]" in lines["SwitchName=leaf2"]
    assert "Switches=leaf1,leaf2" in lines["SwitchName=spine"]


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_four_node_job_runs_32_ranks_on_distinct_hosts(cluster):
    out = cluster.run_on("ctl", [
        "srun", "-N4", "--ntasks-per-node=8", "--gpus-per-node=8", "bash", "-c",
        'echo "$SLURM_PROCID $(hostname) $(hostname -I) $SLURM_TOPOLOGY_ADDR $CUDA_VISIBLE_DEVICES"',
    ], timeout=60).stdout
    rows = [line.split() for line in out.splitlines()]
    assert sorted(int(r[0]) for r in rows) == list(range(32))
    hosts = {r[1]: r[2] for r in rows}
    assert sorted(hosts) == ["node1", "node2", "node3", "node4"]
    assert len(set(hosts.values())) == 4, f"hosts must have distinct addresses: {hosts}"
    assert {r[3] for r in rows if r[1] == "node3"} == {"spine.leaf2.node3"}
    assert {r[4] for r in rows} == {"0,1,2,3,4,5,6,7"}


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_hosts_reach_each_other_by_name_over_tcp(cluster):
    # A server on node4, a client on node1: what a MASTER_ADDR rendezvous needs.
    server = subprocess.Popen([*cluster.enter("node4"), str(cluster.python), "-c",
                               "import socket; s=socket.create_server(('',29400)); c,_=s.accept(); "
                               "c.sendall(socket.gethostname().encode())"],
                              stdout=subprocess.PIPE, text=True)
    try:
        client = run_python_on(cluster, "node1", "import socket,time\n"
                               "for _ in range(50):\n"
                               "    try: c=socket.create_connection(('node4',29400)); break\n"
                               "    except OSError: time.sleep(0.1)\n"
                               "print(c.recv(100).decode())")
        assert client.stdout.strip() == "node4"
    finally:
        server.wait(timeout=10)


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_pynvml_sees_eight_emulated_gpus_on_a_node_and_none_on_the_login_host(cluster):
    node = run_python_on(cluster, "node2", "import pynvml as n; n.nvmlInit(); c=n.nvmlDeviceGetCount(); "
                         "print(c, n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(0)))")
    assert node.stdout.strip() == "8 NVIDIA H100 80GB HBM3", node.stderr
    login = run_python_on(cluster, "ctl", "import pynvml as n\n"
                          "try: n.nvmlInit()\n"
                          "except n.NVMLError as e: print(type(e).__name__)")
    assert login.stdout.strip() == "NVMLError_LibraryNotFound"


WAIT_FOR_XID = """
import ctypes, json, sys, time, pynvml as n
address = lambda handle: ctypes.cast(handle, ctypes.c_void_p).value
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(3)
es = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(h, n.nvmlDeviceGetSupportedEventTypes(h), es)
print("ready", flush=True)
d = n.nvmlEventSetWait(es, 10000)
# Map the event's device by handle address: on a lost GPU even nvmlDeviceGetIndex fails.
print(json.dumps({"at": time.time(), "type": d.eventType, "xid": d.eventData,
                  "same_device": address(d.device) == address(h)}), flush=True)
# The event may arrive a moment before the GPU reads as lost (as on real drivers): allow 1 s.
for _ in range(100):
    try:
        n.nvmlDeviceGetUUID(h)
        time.sleep(0.01)
    except n.NVMLError_GpuIsLost:
        print("NVMLError_GpuIsLost")
        break
else:
    print("not lost")
"""


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_injected_xid_reaches_a_blocking_wait_and_the_gpu_is_lost(cluster):
    waiter = subprocess.Popen([*cluster.enter("node3"), str(cluster.python), "-c", WAIT_FOR_XID],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waiter.stdout.readline().strip() == "ready"
    injected_at = time.time()
    inject(cluster.nvml_dir("node3"), Fault("xid", gpu=3, value=79))
    line = waiter.stdout.readline()
    assert line, waiter.stderr.read()
    event = json.loads(line)
    assert (event["type"], event["xid"], event["same_device"]) == (8, 79, True)  # nvmlEventTypeXidCriticalError
    # Delivered by the blocking wait itself (its median is measured in bench/), not by a later poll.
    assert event["at"] - injected_at < 1.0
    assert waiter.stdout.readline().strip() == "NVMLError_GpuIsLost"
    waiter.wait(timeout=10)


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_a_fault_on_one_node_is_not_seen_on_another(cluster):
    inject(cluster.nvml_dir("node3"), Fault("gpu-lost", gpu=5))
    probe = ("import pynvml as n; n.nvmlInit()\n"
             "try: n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(5)); print('healthy')\n"
             "except n.NVMLError_GpuIsLost: print('lost')")
    assert run_python_on(cluster, "node3", probe).stdout.strip() == "lost"
    assert run_python_on(cluster, "node1", probe).stdout.strip() == "healthy"


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_kernel_log_stand_in_gets_the_xid_line(cluster):
    inject(cluster.nvml_dir("node2"), Fault("xid", gpu=3, value=13))
    last = (cluster.nvml_dir("node2") / "kmsg").read_text().splitlines()[-1]
    assert last.endswith("NVRM: Xid (PCI:0000:5d:00): 13, pid=1, injected by clusterctl-testbed")


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_killed_node_fails_its_job_and_boots_back(cluster):
    # --no-requeue: with Slurm's default JobRequeue=1 the job would come back PENDING after NODE_FAIL.
    # node3, not node2: test_hooks leaves an Xid 64 (RMA) in node2's history, and the health check
    # slurmd runs as it boots may answer before the new healthd is up and drain for it (seen once in CI).
    job = cluster.run_on("ctl", ["sbatch", "--parsable", "--no-requeue", "-N2", "-w", "node1,node3",
                                 "--wrap", "sleep 120"]).stdout
    job_id = job.strip()
    deadline = time.monotonic() + 30
    while cluster.run_on("ctl", ["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    cluster.kill_node("node3")
    deadline = time.monotonic() + 40
    state = ""
    while time.monotonic() < deadline and state != "NODE_FAIL":
        state = cluster.run_on("ctl", ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"]).stdout.strip()
        time.sleep(0.5)
    assert state == "NODE_FAIL"
    cluster.boot_node("node3")
    cluster.wait_nodes_idle(nodes=["node3"], timeout=30)


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_cut_link_makes_the_node_unreachable_until_healed(cluster):
    cluster.cut_link("node4")
    probe = run_python_on(cluster, "node1", "import socket\n"
                          "try: socket.create_connection(('node4', 6818), timeout=1); print('reached')\n"
                          "except OSError: print('unreachable')")
    assert probe.stdout.strip() == "unreachable"
    cluster.heal_link("node4")
    probe = run_python_on(cluster, "node1", "import socket; socket.create_connection(('node4', 6818), timeout=2); "
                          "print('reached')")
    assert probe.stdout.strip() == "reached"


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_restarted_slurmd_comes_back_idle(cluster):
    cluster.restart_slurmd("node1")
    cluster.wait_nodes_idle(nodes=["node1"], timeout=30)
    out = cluster.run_on("ctl", ["srun", "-w", "node1", "hostname"], timeout=30).stdout
    assert out.strip() == "node1"


@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_job_steps_and_requeue_history_are_in_accounting(cluster):
    job_id = cluster.run_on("ctl", ["sbatch", "--parsable", "-N1", "--wrap", "srun true; srun true"]).stdout.strip()
    deadline = time.monotonic() + 30
    steps: list[str] = []
    while time.monotonic() < deadline:
        out = cluster.run_on("ctl", ["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State"]).stdout
        steps = sorted(line.split("|")[0] for line in out.splitlines())
        if {f"{job_id}.0", f"{job_id}.1"} <= set(steps) and f"{job_id}|COMPLETED" in out:
            break
        time.sleep(0.5)
    assert {job_id, f"{job_id}.batch", f"{job_id}.0", f"{job_id}.1"} <= set(steps)


@pytest.mark.slurm_versions
@pytest.mark.one_release  # the testbed's mechanics; the release check below runs everywhere
def test_plan_on_the_live_cluster_uses_idle_nodes_and_the_real_topology(cluster):
    out = cluster.run_on("ctl", [f"{cluster.bindir}/clusterctl", "plan", "--tp", "8", "--pp", "2", "--nodes", "4",
                                 "--json"]).stdout
    plan = json.loads(out)
    assert sorted(n["node"] for n in plan["nodes"]) == ["node1", "node2", "node3", "node4"]
    assert {n["leaf"] for n in plan["nodes"]} == {"leaf1", "leaf2"}
    assert plan["cost"]["objective"] <= plan["baselines"]["dfs"]["objective"]


# ---- every supported Slurm (issue 12) ------------------------------------------------------------
# The session runs one release (CLUSTERCTL_TEST_SLURM, see tests/conftest.py); these check it is that
# release, with hooks and healthd run by the project's install on that root filesystem's own Python.
PYTHONS = {"22.05": "3.11", "24.11": "3.13"}


@pytest.mark.slurm_versions
def test_the_session_runs_the_asked_slurm_with_the_projects_hooks_on_its_own_python(cluster):
    release = cluster.running().release
    asked = TEST_SLURM if TEST_SLURM != HOST else "22.05"
    assert cluster.running().version.split()[-1].startswith(f"{asked}."), cluster.running()
    config = dict(line.split("=", 1) for line in cluster.run_on("ctl", ["scontrol", "show", "config"]).stdout
                  .splitlines() if "=" in line)
    config = {k.strip(): v.strip() for k, v in config.items()}
    # 25.05 and newer list Prolog as `Prolog[0]` (it may name several programs).
    assert config.get("Prolog", config.get("Prolog[0]")) == f"{cluster.bindir}/clusterctl-prolog", config
    python = cluster.run_on("node1", [str(cluster.python), "-c", "import sys, clusterctl.healthd.cli; "
                                      "print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
    if release in PYTHONS:
        assert python == PYTHONS[release]
    assert cluster.run_on("node2", [str(cluster.bindir / "healthd"), "--help"]).returncode == 0
