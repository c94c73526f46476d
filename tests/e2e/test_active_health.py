"""healthd's network checks and active diagnostics on the real testbed: each node's emulated InfiniBand sysfs
tree (ib_faults.py) and `dcgmi diag` (dcgmi_emu.py), real healthd, real Slurm drains and resumes."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from clusterctl_testbed.dcgmi_emu import DiagFault, inject_diag
from clusterctl_testbed.gpu_faults import Fault, inject
from clusterctl_testbed.ib_faults import ETHERNET, SYSFS_IB, SYSFS_NET, IbFault, build_tree, inject_ib
from tests.e2e.test_healthd import drained, healthd_state, journal_results, node_row, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.one_release]  # healthd's own side; the drain door is release-tested


def sysroot(cluster, node):
    return cluster.nvml_dir(node) / "sysroot"


def test_a_flapping_nic_drains_its_node_naming_the_port(cluster):
    inject_ib(sysroot(cluster, "node2"), IbFault("ib-link-flap", nic=3, value=6))
    row = wait_until(lambda: drained(cluster, "node2"), 4 * cluster.layout.healthd_interval, "node2 drained")
    assert row.reason.startswith("healthd: ib-link-flap ") and "mlx5_3/1" in row.reason, row.reason
    assert all(node_row(cluster, n).state == "idle" for n in ("node1", "node3", "node4"))


def test_a_roce_node_drains_on_frame_check_errors_and_only_warns_on_retransmissions_and_congestion(cluster):
    """node1's NICs as RoCE ports (what `clusterctl-testbed up --nics roce` gives every node): retransmissions
    (the path loses packets) and congestion notifications (DCQCN at work on a busy fabric) leave it in service,
    the first said as a warning; frames failing their checksum on the wire drain it, naming the netdev."""
    root, interval = sysroot(cluster, "node1"), cluster.layout.healthd_interval
    for tree in (SYSFS_IB, SYSFS_NET):
        shutil.rmtree(root / tree, ignore_errors=True)
    build_tree(root, cluster.layout.gpus_per_node, ETHERNET)
    cluster.stop_daemon("healthd:node1")
    cluster.start_healthd("node1")  # it finds the node's NICs as it starts
    try:
        inject_ib(root, IbFault("roce-retransmits", nic=2))
        inject_ib(root, IbFault("roce-congestion", nic=2))

        def warned():
            return [f for f in healthd_state(cluster, "node1").findings() if f.kind == "roce-retransmits"]
        warnings = wait_until(warned, 4 * interval, "the retransmissions said as a warning")
        # One per counter over its limit (ACK timeouts, sequence errors), each naming the port and the counter.
        assert all(w.action.name == "WARN" and w.detail.startswith("mlx5_2/1 ") for w in warnings), warnings
        assert not [f for f in healthd_state(cluster, "node1").findings() if f.action.name != "WARN"]
        assert node_row(cluster, "node1").state == "idle"
        inject_ib(root, IbFault("roce-fcs-errors", nic=5))
        row = wait_until(lambda: drained(cluster, "node1"), 4 * interval, "node1 drained")
        assert row.reason.startswith("healthd: ib-errors ") and "rx_crc_errors" in row.reason, row.reason
        assert all(node_row(cluster, n).state == "idle" for n in ("node2", "node3", "node4"))
    finally:
        for tree in (SYSFS_IB, SYSFS_NET):
            shutil.rmtree(root / tree, ignore_errors=True)
        build_tree(root, cluster.layout.gpus_per_node)
        cluster.stop_daemon("healthd:node1")
        cluster.start_healthd("node1")


def test_a_port_down_drains_and_the_node_returns_once_the_link_is_up_and_the_diagnostic_passes(cluster):
    inject_ib(sysroot(cluster, "node4"), IbFault("ib-port-down", nic=0))
    row = wait_until(lambda: drained(cluster, "node4"), 4 * cluster.layout.healthd_interval, "node4 drained")
    assert row.reason.startswith("healthd: ib-port-down ") and "mlx5_0/1" in row.reason, row.reason
    inject_ib(sysroot(cluster, "node4"), IbFault("ib-clear", nic=0))  # the cable reseated
    wait_until(lambda: node_row(cluster, "node4").state == "idle", 10 * cluster.layout.healthd_interval,
               "node4 back in service")
    assert healthd_state(cluster, "node4").return_note.startswith("diagnostic ")
    assert "passed at" in healthd_state(cluster, "node4").return_note
    out = cluster.run_on("ctl", ["srun", "-w", "node4", "hostname"], timeout=30).stdout
    assert out.strip() == "node4"  # and it takes a job


def test_a_repaired_node_whose_diagnostic_fails_stays_drained_and_says_why(cluster):
    d = cluster.nvml_dir("node3")
    inject(d, Fault("ecc-dbe", gpu=2))
    wait_until(lambda: drained(cluster, "node3"), 5, "node3 drained")
    inject_diag(d, DiagFault("fail", level=3, test="Memory Bandwidth", gpu=2, message="bandwidth 61% of peak"))
    inject(d, Fault("clear"))  # the GPU was reset: the counters look clean, the stress test still fails
    note = wait_until(lambda: "failed" in healthd_state(cluster, "node3").return_note
                      and healthd_state(cluster, "node3").return_note, 10 * cluster.layout.healthd_interval,
                      "the diagnostic's failure in healthd's state")
    assert "Memory Bandwidth" in note and "gpu2" in note and "next try after" in note, note
    assert node_row(cluster, "node3").state.startswith("drain")
    assert journal_results(cluster, "node3")[-1] != "resumed"


def test_a_repaired_node_proven_with_a_neighbour_passes_and_the_proof_is_journaled(cluster, tmp_path):
    """`healthd prove`: one real Slurm job on the node and its neighbour running the built-in TCP link test."""
    history = tmp_path / "proofs.jsonl"
    argv = [f"{cluster.bindir}/healthd", "prove", "node2", "--with", "node1", "--partition", "gpu",
            "--history", str(history)]
    done = cluster.run_on("ctl", [*argv, "--json"], timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert (record["node"], record["neighbour"], record["outcome"]) == ("node2", "node1", "pass"), record
    assert record["bandwidth_gbs"] > 0 and record["latency_us"] > 0, record
    assert "absolute floors" in record["basis"], record  # no history yet: the floors judge
    assert len(history.read_text().splitlines()) == 1
    words = cluster.run_on("ctl", [*argv, "--no-record"], timeout=240, check=False)
    assert words.returncode == 0 and "node2" in words.stdout and "Traceback" not in words.stderr, words


def test_a_hung_shared_mount_drains_its_node_naming_the_path(cluster, tmp_path):
    """node3's checkpoint mount stops answering (a FUSE mount in node3's own mount namespace whose every
    operation blocks, as a Lustre or NFS client blocks when its server is gone: testbed/hung_mount.py).
    healthd's storage probe blocks in the kernel on it, healthd does not (the probe's thread is left stuck),
    and node3 is drained naming the path before a job's next checkpoint would hang there; the others run on."""
    backing, mount, switch = tmp_path / "backing", tmp_path / "ckpt", tmp_path / "hang"
    backing.mkdir()
    mount.mkdir()
    server = subprocess.Popen([*cluster.enter("node3"), str(cluster.python), "-m", "clusterctl_testbed.hung_mount",
                               str(backing), str(mount), str(switch)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    toml = cluster.layout.host_dir("node3") / "etc-clusterctl" / "healthd.toml"
    original = toml.read_text()
    try:
        wait_until(lambda: server.poll() is not None or cluster.run_on(
            "node3", ["findmnt", "-n", str(mount)], check=False).returncode == 0, 20, "the mount in node3")
        assert server.poll() is None, server.communicate()[0]
        # The least interval healthd takes (15 s), a 1 s deadline: node3's probe slot comes within 15 s.
        toml.write_text(original.replace('disk_paths = ["/"]', f'disk_paths = ["/"]\nstorage_paths = ["{mount}"]')
                        .replace("[checks]\n", "[checks]\nstorage_interval_s = 15\nstorage_timeout_s = 1\n"))
        cluster.stop_daemon("healthd:node3")
        cluster.start_healthd("node3")
        switch.touch()
        hung_at = time.monotonic()
        row = wait_until(lambda: drained(cluster, "node3"), 15 + 1 + 4 * cluster.layout.healthd_interval,
                         "node3 drained")
        print(f"hung mount: node3 drained {time.monotonic() - hung_at:.1f} s after the mount hung "
              "(its probe slot comes once in 15 s)")
        assert row.reason.startswith("healthd: storage-hung ") and str(mount) in row.reason, row.reason
        assert healthd_state(cluster, "node3").updated_at > time.time() - 3 * cluster.layout.healthd_interval
        assert all(node_row(cluster, n).state == "idle" for n in ("node1", "node2", "node4"))
    finally:
        switch.unlink(missing_ok=True)  # the server answers again: the stuck probe returns
        cluster.run_on("node3", ["umount", "-l", str(mount)], check=False)
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
        toml.write_text(original)
        cluster.stop_daemon("healthd:node3")
        cluster.start_healthd("node3")
