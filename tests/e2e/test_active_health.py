"""healthd's network checks and active diagnostics on the real testbed: each node's emulated InfiniBand sysfs
tree (ib_faults.py) and `dcgmi diag` (dcgmi_emu.py), real healthd, real Slurm drains and resumes."""

from __future__ import annotations

import json

import pytest

from clusterctl_testbed.dcgmi_emu import DiagFault, inject_diag
from clusterctl_testbed.gpu_faults import Fault, inject
from clusterctl_testbed.ib_faults import IbFault, inject_ib
from tests.e2e.test_healthd import drained, healthd_state, journal_results, node_row, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.one_release]  # healthd's own side; the drain door is release-tested


def sysroot(cluster, node):
    return cluster.nvml_dir(node) / "sysroot"


def test_a_flapping_nic_drains_its_node_naming_the_port(cluster):
    inject_ib(sysroot(cluster, "node2"), IbFault("ib-link-flap", nic=3, value=6))
    row = wait_until(lambda: drained(cluster, "node2"), 4 * cluster.layout.healthd_interval, "node2 drained")
    assert row.reason.startswith("healthd: ib-link-flap ") and "mlx5_3/1" in row.reason, row.reason
    assert all(node_row(cluster, n).state == "idle" for n in ("node1", "node3", "node4"))


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
