"""The breaker's shared ledger: however many nodes see a fault at once, at most the cap drain,
and none of them reads the node table; a slot comes back when its node is back in service."""

from __future__ import annotations

import json
import os
import threading

import pytest

from clusterctl.clock import Clock
from clusterctl.files import UnsafePathError
from clusterctl.healthd.breaker_ledger import BreakerLedger, breaker_cap
from clusterctl.healthd.config import ConfigError, HealthdConfig, config_from_mapping
from clusterctl.healthd.daemon import Applied, Daemon, Observed
from clusterctl.healthd.findings import Finding
from clusterctl.records.healthd_breaker_slot import BreakerSlot
from clusterctl.records.drain_reason import HEALTHD
from tests.fakes import FakeNodeSlurm, FakePartition

T0 = 1795305600.0
PARTITION_NODES = 20  # breaker_max_share 0.1 → 2 slots


class NoTableReads(FakeNodeSlurm):
    """One node's Slurm whose table read fails the test: with a breaker_dir, no node reads the node table."""

    def partition_share(self, partition, owner=HEALTHD):
        raise AssertionError("with a breaker_dir, no node reads the node table")


def partition(drained: dict[str, str] | None = None) -> FakePartition:
    """node0 .. node19, in partition gpu."""
    return FakePartition([f"node{i}" for i in range(PARTITION_NODES)], drained=drained)


@pytest.fixture()
def ledger_dir(tmp_path):
    path = tmp_path / "breaker"
    path.mkdir(mode=0o755)
    return path


def node_daemon(tmp_path, ledger_dir, name, slurm: FakePartition, now=lambda: T0) -> Daemon:
    config = HealthdConfig(node=name, state_dir=tmp_path / name / "run", journal_dir=tmp_path / name / "lib",
                           metrics="", breaker_dir=ledger_dir, disk_paths=())
    return Daemon(config, slurm=NoTableReads(slurm, name), clock=Clock(now=now),
                  boot_time=lambda: T0 - 3600)


def lost(name_index: int, at: float = T0) -> Observed:
    return Observed("nvml-event", (Finding("gpu-lost", "nvml-event", at, gpu=3, uuid=f"GPU-{name_index}"),))


def a_gpu_falls_off(shell: Daemon, index: int, at: float = T0):
    """The daemon sees a GPU lost, its applier applies the drain it plans, the outcome goes back in."""
    shell.handle(lost(index, at))
    action = shell.actions.get_nowait()
    decision = shell.apply(action)
    shell.handle(Applied(action, decision, shell.applied_node))
    return decision


def test_a_fault_on_every_node_at_once_drains_at_most_the_cap_without_a_table_read(tmp_path, ledger_dir):
    slurm = partition()
    daemons = [node_daemon(tmp_path, ledger_dir, f"node{i}", slurm) for i in range(PARTITION_NODES)]
    results: list[str] = []

    def fault(shell: Daemon, index: int) -> None:
        results.append(a_gpu_falls_off(shell, index).result)

    threads = [threading.Thread(target=fault, args=(d, i)) for i, d in enumerate(daemons)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count("drained") == 2 == len(slurm.reasons)
    assert sorted(results).count("breaker-open") == PARTITION_NODES - 2
    slots, problems = BreakerLedger(ledger_dir, "node0", now=lambda: T0).slots("gpu")
    assert sorted(s.node for s in slots) == sorted(slurm.reasons) and problems == []


def test_a_resumed_node_gives_its_slot_back_and_another_node_may_drain(tmp_path, ledger_dir, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")  # no NVML: the periodic check still reads the node
    now = [T0]
    slurm = partition()
    first, second, third = (node_daemon(tmp_path, ledger_dir, f"node{i}", slurm, lambda: now[0]) for i in range(3))
    for index, shell in enumerate((first, second)):
        assert a_gpu_falls_off(shell, index).result == "drained"
    refused = a_gpu_falls_off(third, 2)
    assert refused.result == "breaker-open" and "2 of 20 nodes in gpu" in refused.alert.detail
    slurm.reasons.pop("node0")  # an admin repaired node0 and resumed it
    first.periodic.node_due = 0.0  # its next periodic check reads the node
    first.periodic.check()
    assert not BreakerLedger(ledger_dir, "node0", now=lambda: T0).holds("gpu")
    now[0] = T0 + 8 * 600  # past breaker_retry: node2's GPU, lost again, is drained now
    assert a_gpu_falls_off(third, 2, now[0]).result == "drained"


def test_the_node_holding_a_slot_claims_it_again_without_taking_a_second(ledger_dir):
    ledger = BreakerLedger(ledger_dir, "node7", now=lambda: T0)
    first = ledger.claim("gpu", 2, "healthd: xid 79")
    again = ledger.claim("gpu", 2, "healthd: xid 79")
    assert first.granted and first.new and again.granted and not again.new and again.slot == first.slot
    assert len(ledger.slots("gpu")[0]) == 1
    assert ledger.release("gpu") == first.slot and not ledger.holds("gpu") and ledger.slots("gpu")[0] == []


@pytest.mark.parametrize("mode", [0o775, 0o1777])
def test_a_breaker_directory_others_can_write_is_refused_and_slurm_counts_instead(tmp_path, ledger_dir, mode):
    os.chmod(ledger_dir, mode)
    with pytest.raises(UnsafePathError, match="no write for group or others"):
        BreakerLedger(ledger_dir, "node1", now=lambda: T0).claim("gpu", 2, "x")

    config = HealthdConfig(node="node1", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib", metrics="",
                           breaker_dir=ledger_dir)
    shell = Daemon(config, slurm=partition()("node1"), clock=Clock(now=lambda: T0),  # Slurm counts: 0 of 20 drained
                   boot_time=lambda: T0 - 3600)
    assert a_gpu_falls_off(shell, 1).result == "drained"


def test_a_planted_symlink_for_the_partition_is_refused(tmp_path, ledger_dir):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ledger_dir / "gpu").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="not a real directory"):
        BreakerLedger(ledger_dir, "node1", now=lambda: T0).claim("gpu", 2, "x")
    assert list(elsewhere.iterdir()) == []


def test_a_slot_record_round_trips_and_a_damaged_one_is_named():
    slot = BreakerSlot("node3", "gpu", 4, "healthd: xid 79 gpu3", T0)
    assert BreakerSlot.from_json(json.loads(json.dumps(slot.to_json())), "x") == slot


def test_a_damaged_slot_is_reported_not_a_traceback(ledger_dir):
    ledger = BreakerLedger(ledger_dir, "node1", now=lambda: T0)
    ledger.claim("gpu", 3, "x")
    (ledger_dir / "gpu" / "slot-9").write_text("{not json")
    slots, problems = ledger.slots("gpu")
    assert [s.node for s in slots] == ["node1"] and len(problems) == 1 and "slot-9" in problems[0]


def test_the_cap_is_the_most_nodes_within_the_share():
    assert [breaker_cap(n, 0.1) for n in (9, 10, 20, 12_500)] == [0, 1, 2, 1250]
    assert breaker_cap(3, 1 / 3) == 1


def test_breaker_dir_must_be_an_absolute_path():
    assert config_from_mapping({"breaker_dir": "/shared/breaker"}).breaker_dir is not None
    with pytest.raises(ConfigError, match="breaker_dir"):
        config_from_mapping({"breaker_dir": "relative/dir"})


def test_a_node_healthd_drained_before_the_ledger_existed_takes_a_slot_at_its_next_read(tmp_path, ledger_dir,
                                                                                       monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")
    drained = {"node5": "healthd: xid 79 gpu3 (GPU-5) drain-reboot 2026-11-22T03:00:00Z"}
    shell = node_daemon(tmp_path, ledger_dir, "node5", partition(drained))
    shell.periodic.check()  # the first check reads the node
    slots, _ = BreakerLedger(ledger_dir, "node0", now=lambda: T0).slots("gpu")
    assert [(s.node, s.reason) for s in slots] == [("node5", drained["node5"])]
