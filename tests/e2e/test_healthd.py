"""healthd on every testbed node, real pynvml on the emulated driver, real Slurm drains."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from clusterctl.records.actions import Action
from clusterctl.records.healthd_actions import read_action_journal
from clusterctl.records.healthd_state import GpuState, HealthdState, read_healthd_state
from clusterctl_testbed.gpu_faults import Fault, inject

pytestmark = pytest.mark.e2e


def node_row(cluster, node):
    return next(n for n in cluster.nodes() if n.name == node)


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def drained(cluster, node):
    row = node_row(cluster, node)
    return row if row.state.startswith("drain") else None


def healthd_state(cluster, node) -> HealthdState:
    state = read_healthd_state(cluster.layout.host_dir(node) / "run-healthd")
    assert state is not None, f"healthd on {node} wrote no state"
    return state


def gpu(cluster, node, index: int) -> GpuState:
    return next(g for g in healthd_state(cluster, node).gpus if g.index == index)


def journal_results(cluster, node) -> list[str]:
    journal = read_action_journal(cluster.layout.host_dir(node) / "lib-healthd" / "actions.jsonl")
    return list(journal.results.values())  # in the order the outcomes were journaled


def quiet_cycles(cluster, n=2):
    """Let healthd run `n` periodic checks."""
    time.sleep(n * cluster.layout.healthd_interval + 1)


@pytest.mark.slurm_versions
def test_xid_79_drains_only_that_node_naming_the_gpu(cluster):
    inject(cluster.nvml_dir("node3"), Fault("xid", gpu=3, value=79))
    row = wait_until(lambda: drained(cluster, "node3"), 5, "node3 drained")
    uuid = gpu(cluster, "node3", 3).uuid
    # Via the Xid event or the lost GPU, whichever healthd sees first: the reason names GPU 3.
    assert row.reason.startswith("healthd: ") and f" gpu3 ({uuid}) drain-reboot " in row.reason
    assert [n.state for n in cluster.nodes() if n.name != "node3"] == ["idle", "idle", "idle"]


def test_gpu_lost_without_an_xid_event_still_drains(cluster):
    inject(cluster.nvml_dir("node1"), Fault("gpu-lost", gpu=6))
    row = wait_until(lambda: drained(cluster, "node1"), 5, "node1 drained")
    assert row.reason.startswith("healthd: gpu-lost gpu6 ")


def test_volatile_double_bit_ecc_drains_for_reset(cluster):
    inject(cluster.nvml_dir("node2"), Fault("ecc-dbe", gpu=5))
    row = wait_until(lambda: drained(cluster, "node2"), 5, "node2 drained")
    assert "gpu5" in row.reason and "drain-reset" in row.reason


def test_remap_failure_drains_for_rma_and_is_never_resumed(cluster):
    # The driver logs Xid 64 and NVML reports the failure: whichever healthd sees first, it is RMA.
    inject(cluster.nvml_dir("node4"), Fault("remap-failure", gpu=2))
    row = wait_until(lambda: drained(cluster, "node4"), 3 * cluster.layout.healthd_interval, "node4 drained")
    assert " gpu2 " in row.reason and " drain-rma " in row.reason
    inject(cluster.nvml_dir("node4"), Fault("clear"))
    quiet_cycles(cluster, 3)  # resume_when_clean is on in the testbed: still never for RMA
    assert node_row(cluster, "node4").reason == row.reason


def test_a_periodic_check_alone_finds_retired_pages_at_the_limit(cluster):
    inject(cluster.nvml_dir("node3"), Fault("retired-pages", gpu=4, value=63))  # no event, no kernel line
    row = wait_until(lambda: drained(cluster, "node3"), 3 * cluster.layout.healthd_interval, "node3 drained")
    assert row.reason.startswith("healthd: retired-pages gpu4 ") and " drain-rma " in row.reason


@pytest.mark.slurm_versions
def test_a_reset_class_drain_resumes_once_checks_are_clean(cluster):
    inject(cluster.nvml_dir("node1"), Fault("ecc-dbe", gpu=0))
    wait_until(lambda: drained(cluster, "node1"), 5, "node1 drained")
    inject(cluster.nvml_dir("node1"), Fault("clear"))  # the GPU was reset
    wait_until(lambda: node_row(cluster, "node1").state == "idle", 6 * cluster.layout.healthd_interval,
               "node1 resumed by healthd")
    assert journal_results(cluster, "node1")[-1] == "resumed"


def test_remap_pending_is_a_reset_at_idle_verdict_not_a_drain(cluster):
    inject(cluster.nvml_dir("node2"), Fault("remap-pending", gpu=1))
    wait_until(lambda: gpu(cluster, "node2", 1).verdict is Action.RESET_AT_IDLE,
               3 * cluster.layout.healthd_interval, "reset-at-idle verdict")
    assert node_row(cluster, "node2").state == "idle"


@pytest.mark.one_release  # CI time: nothing reaches Slurm (nothing drains)
def test_no_false_positives(cluster):
    d = cluster.nvml_dir("node1")
    for index, xid in ((0, 13), (1, 31), (2, 43)):
        inject(d, Fault("xid", gpu=index, value=xid))
    for _ in range(100):
        inject(d, Fault("xid", gpu=4, value=45))  # a sympathetic storm
    inject(d, Fault("ecc-sbe", gpu=5, value=5000))
    inject(d, Fault("temp", gpu=6, value=95))  # a brief spike
    quiet_cycles(cluster, 1)
    inject(d, Fault("temp", gpu=6, value=50))
    quiet_cycles(cluster, 2)
    assert node_row(cluster, "node1").state == "idle"
    assert gpu(cluster, "node1", 0).verdict is Action.APP_FAULT
    assert gpu(cluster, "node1", 4).verdict is Action.IGNORE


def test_slurmctld_away_then_back_drains_exactly_once(cluster):
    before = len(journal_results(cluster, "node4"))
    cluster.stop_daemon("slurmctld")
    inject(cluster.nvml_dir("node4"), Fault("ecc-dbe", gpu=7))
    time.sleep(3)  # healthd keeps the decision in its journal and retries
    assert healthd_state(cluster, "node4").pending_actions >= 1
    cluster.start_controller()
    wait_until(lambda: drained(cluster, "node4"), 20, "node4 drained after slurmctld came back")
    quiet_cycles(cluster, 2)
    assert journal_results(cluster, "node4")[before:].count("drained") == 1


@pytest.mark.one_release  # CI time: healthd's journal and kernel log; its drain is the Xid 79 story's
def test_restart_neither_forgets_a_pending_drain_nor_replays_old_kernel_xids(cluster):
    # Old Xid: drained, acknowledged by an admin; a restarted healthd must not act on it again.
    inject(cluster.nvml_dir("node1"), Fault("xid", gpu=2, value=48))
    wait_until(lambda: drained(cluster, "node1"), 5, "node1 drained")
    inject(cluster.nvml_dir("node1"), Fault("clear"))
    cluster.run_on("ctl", ["scontrol", "update", "NodeName=node1", "State=RESUME"])
    cluster.stop_daemon("healthd:node1")
    cluster.start_healthd("node1")
    quiet_cycles(cluster, 2)
    assert node_row(cluster, "node1").state == "idle"
    # A decision still pending when healthd dies is applied by the next one, once.
    before = len(journal_results(cluster, "node2"))
    cluster.stop_daemon("slurmctld")
    inject(cluster.nvml_dir("node2"), Fault("ecc-dbe", gpu=3))
    wait_until(lambda: healthd_state(cluster, "node2").pending_actions >= 1, 10, "pending drain")
    cluster.stop_daemon("healthd:node2")
    cluster.start_healthd("node2")
    cluster.start_controller()
    wait_until(lambda: drained(cluster, "node2"), 20, "node2 drained by the restarted healthd")
    quiet_cycles(cluster, 1)
    assert journal_results(cluster, "node2")[before:].count("drained") == 1


@pytest.mark.slurm_versions
def test_an_admin_drain_is_never_relabelled_or_resumed(cluster):
    before = len(journal_results(cluster, "node2"))
    cluster.run_on("ctl", ["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=admin: bad fan"])
    inject(cluster.nvml_dir("node2"), Fault("xid", gpu=1, value=79))
    wait_until(lambda: "kept-other-drain" in journal_results(cluster, "node2")[before:], 10, "healthd's decision")
    inject(cluster.nvml_dir("node2"), Fault("clear"))
    quiet_cycles(cluster, 3)
    assert node_row(cluster, "node2").reason == "admin: bad fan"


def test_breaker_alerts_instead_of_draining_past_its_share(cluster):
    for node in ("node1", "node2"):  # half the partition already drained by healthd
        cluster.run_on("ctl", ["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                               "Reason=healthd: ecc-dbe gpu0 drain-reset 2026-11-22T00:00:00Z"])
    inject(cluster.nvml_dir("node3"), Fault("ecc-dbe", gpu=4))
    alerts = wait_until(lambda: healthd_state(cluster, "node3").alerts, 10, "breaker alert")
    assert alerts[0].alert == "breaker-open" and "2 of 4 nodes in gpu" in alerts[0].detail
    assert node_row(cluster, "node3").state == "idle"


@pytest.mark.one_release  # CI time: NVML and healthd alone; no Slurm side
def test_a_hung_nvml_call_is_reported_while_the_daemon_stays_responsive(cluster, tmp_path):
    # Run node4's healthd under a NOTIFY_SOCKET of ours to see the watchdog being fed.
    cluster.stop_daemon("healthd:node4")
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.5)
    healthd = subprocess.Popen([*cluster.enter("node4"), "env", f"NOTIFY_SOCKET={sock_path}",
                                f"{cluster.bindir}/healthd", "run", "--config", "/etc/clusterctl/healthd.toml"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        messages: list[str] = []

        def receive(seconds):
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    messages.append(sock.recv(100).decode())
                except TimeoutError:
                    pass

        receive(2)
        assert "READY=1" in messages
        inject(cluster.nvml_dir("node4"), Fault("nvml-hang", function="nvmlDeviceGetTemperature", seconds=20))
        inject(cluster.nvml_dir("node4"), Fault("nvml-hang", function="nvmlEventSetWait", seconds=20))
        messages.clear()
        receive(8)
        assert messages.count("WATCHDOG=1") > 10, "the watchdog must stay fed during an NVML hang"
        state = healthd_state(cluster, "node4")
        assert time.time() - state.updated_at < 6.5, "the state file keeps being written (every 5 s when idle)"
        assert "nvml-hang" in {f.kind for f in state.findings()}
        assert node_row(cluster, "node4").state == "idle"  # a hang warns; it does not drain
    finally:
        inject(cluster.nvml_dir("node4"), Fault("clear"))
        healthd.terminate()
        healthd.wait(timeout=10)
        sock.close()
        cluster.start_healthd("node4")


def test_status_command_reads_the_state_instantly(cluster):
    out = cluster.run_on("node3", [f"{cluster.bindir}/healthd", "status", "--config", "/etc/clusterctl/healthd.toml"])
    assert "node3: verdict healthy, NVML ok" in out.stdout
    data = json.loads(cluster.run_on("node3", [f"{cluster.bindir}/healthd", "status", "--json"]).stdout)
    assert data["node"] == "node3" and len(data["gpus"]) == 8


def test_metrics_are_served_on_the_nodes_loopback(cluster):
    inject(cluster.nvml_dir("node2"), Fault("xid", gpu=1, value=31))
    time.sleep(1)
    out = cluster.run_on("node2", [str(cluster.python), "-c", "import urllib.request; print(urllib.request.urlopen("
                                   "'http://127.0.0.1:9489/metrics', timeout=5).read().decode())"]).stdout
    assert 'healthd_findings_total{action="app-fault",kind="xid"}' in out
    assert "healthd_nvml_call_seconds_bucket" in out and "healthd_last_event_timestamp_seconds" in out
