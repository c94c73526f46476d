"""The fleet benchmark's controller: its configuration and how it reads slurmctld's counters."""

from pathlib import Path

import pytest

pytest.importorskip("clusterctl_testbed", reason="tests the testbed package: pip install -e ./testbed")

from clusterctl_testbed.fleet import FleetShape, RpcStat, hosts_file, parse_sdiag, slurm_conf  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"


def test_sdiag_of_a_fleet_controller_gives_count_and_controller_time_per_rpc_type() -> None:
    # Recorded from the 22.05 fleet controller while a supervisor submitted and polled once.
    stats = parse_sdiag((DATA / "22.05" / "sdiag-fleet.txt").read_text())
    assert stats == {
        "REQUEST_STATS_INFO": RpcStat(1, 112),
        "REQUEST_TOPO_INFO": RpcStat(1, 116),
        "REQUEST_SUBMIT_BATCH_JOB": RpcStat(1, 171154),
        "REQUEST_JOB_INFO": RpcStat(1, 614636),
    }


def test_sdiag_without_rpcs_is_an_empty_table() -> None:
    assert parse_sdiag("Remote Procedure Call statistics by message type\n\nPending RPC statistics\n") == {}


def test_every_fleet_node_resolves_and_the_controller_declares_them_all() -> None:
    shape = FleetShape(nodes=12_500, jobs=50_000)
    hosts = hosts_file(shape).splitlines()
    names = [line.split()[1] for line in hosts[2:]]
    assert names[0] == "gpu00001" and names[-1] == "gpu12500" and len(set(names)) == 12_500
    assert len({line.split()[0] for line in hosts[2:]}) == 12_500  # one address each
    conf = slurm_conf(shape, Path("/tmp/fleet"))
    assert "NodeName=gpu[00001-12500] CPUs=96 Gres=gpu:8" in conf
    assert "MaxJobCount=100000" in conf


def test_healthds_pretend_to_be_nodes_spread_over_the_fleet() -> None:
    assert FleetShape(nodes=12_500).spread(4) == ["gpu00001", "gpu03126", "gpu06251", "gpu09376"]
