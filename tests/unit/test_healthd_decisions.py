"""The daemon's decisions with a fake Slurm: drain once, keep other reasons, breaker, replay."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.daemon import Daemon
from clusterctl.healthd.findings import Finding
from clusterctl.slurm.nodes import NodeState
from clusterctl.errors import SlurmCommandError


class FakeSlurm:
    """This node and its partition, as Slurm would report them; counts drains."""

    def __init__(self, others: int = 9, others_drained_by_us: int = 0, reason: str = "", up: bool = True) -> None:
        self.reason, self.up, self.drains = reason, up, []
        self.others = [NodeState(f"n{i}", "idle", ("DRAIN",) if i < others_drained_by_us else (),
                                 "healthd: earlier" if i < others_drained_by_us else "", ("gpu",))
                       for i in range(others)]

    def _check(self):
        if not self.up:
            raise SlurmCommandError(["sinfo"], 1, "Unable to contact slurm controller")

    def state(self) -> NodeState:
        self._check()
        return NodeState("node3", "idle", ("DRAIN",) if self.reason else (), self.reason, ("gpu",))

    def partition_nodes(self, partition):
        self._check()
        return [*self.others, self.state()]

    def drain(self, reason):
        self._check()
        self.drains.append(reason)
        self.reason = reason

    def resume(self):
        self.reason = ""

    def jobs_here(self):
        return ("4242",)


@pytest.fixture()
def make(tmp_path):
    def build(slurm: FakeSlurm, **overrides) -> Daemon:
        config = replace(HealthdConfig(node="node3", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib",
                                       metrics=""), **overrides)
        return Daemon(config, slurm=slurm)  # type: ignore[arg-type]
    return build


def lost(at=1.0):
    return Finding("gpu-lost", "nvml-event", at, gpu=3, uuid="GPU-3")


def apply_all(daemon: Daemon) -> list[str]:
    results = []
    while not daemon.actions.empty():
        action = daemon.actions.get()
        result = daemon._apply(action)
        daemon.journal.done(action.id, result)
        results.append(result)
    return results


def test_fault_drains_once_with_an_owned_reason(make):
    slurm = FakeSlurm()
    daemon = make(slurm)
    daemon._judge("nvml-event", [lost()])
    daemon._judge("nvml-event", [Finding("xid", "kmsg", 1.1, gpu=3, xid=79)])  # same fault, second source
    assert apply_all(daemon) == ["drained"]
    assert len(slurm.drains) == 1 and slurm.drains[0].startswith("healthd: gpu-lost gpu3 (GPU-3) drain-reboot")


def test_warnings_and_app_faults_never_drain(make):
    slurm = FakeSlurm()
    daemon = make(slurm)
    daemon._judge("nvml-event", [Finding("xid", "nvml-event", 1, gpu=1, xid=13)])
    daemon._judge("kmsg", [Finding("xid", "kmsg", 1, gpu=1, xid=45)])
    daemon._judge("periodic", [Finding("remap-pending", "periodic", 1, gpu=2)])
    assert apply_all(daemon) == [] and slurm.drains == []
    assert daemon.history[-2].job_ids == ("4242",)  # the app fault is attributed to the running job


def test_another_reason_is_never_overwritten(make):
    slurm = FakeSlurm(reason="admin: bad fan")
    daemon = make(slurm)
    daemon._judge("nvml-event", [lost()])
    assert apply_all(daemon) == ["kept-other-drain"]
    assert slurm.reason == "admin: bad fan"


def test_breaker_alerts_instead_of_draining(make):
    slurm = FakeSlurm(others=3, others_drained_by_us=1)  # 1 of 4 drained; a second would be 50% > 10%
    daemon = make(slurm)
    daemon._judge("nvml-event", [lost()])
    assert apply_all(daemon) == ["breaker-open"]
    assert slurm.drains == [] and daemon.alerts[0]["alert"] == "breaker-open"


def test_dry_run_changes_nothing(make):
    slurm = FakeSlurm()
    daemon = make(slurm, dry_run=True)
    daemon._judge("nvml-event", [lost()])
    assert apply_all(daemon) == ["dry-run"] and slurm.drains == []


def test_pending_action_survives_a_restart_and_applies_once(make):
    slurm = FakeSlurm(up=False)
    first = make(slurm)
    first._judge("nvml-event", [lost()])
    with pytest.raises(SlurmCommandError):
        first._apply(first.actions.get())  # slurmctld away: the action stays pending in the journal
    second = make(slurm)  # healthd restarted
    pending = second.journal.pending()
    assert len(pending) == 1
    slurm.up = True
    for action in pending:
        second.journal.done(action.id, second._apply(action))
    assert slurm.drains == [pending[0].reason]
    assert make(slurm).journal.pending() == []  # a third start has nothing left to do


def test_resume_only_our_non_rma_drains_after_clean_checks(make):
    slurm = FakeSlurm(reason="healthd: ecc-dbe gpu1 drain-reset 2026-11-22T00:00:00Z")
    daemon = make(slurm, resume_when_clean=True, clean_checks=2)
    daemon.node_state = slurm.state()
    daemon._judge("periodic", [])
    assert daemon.actions.empty()
    daemon._judge("periodic", [])
    assert apply_all(daemon) == ["resumed"] and slurm.reason == ""
    slurm.reason = "healthd: remap-failure gpu2 drain-rma 2026-11-22T00:00:00Z"
    daemon.node_state = slurm.state()
    for _ in range(5):
        daemon._judge("periodic", [])
    assert daemon.actions.empty()  # RMA: never resumed automatically


def test_resume_evidence_rules():
    from clusterctl.healthd.daemon import resume_allowed

    assert resume_allowed("healthd: ecc-dbe gpu1 drain-reset 2026-11-22T00:00:00Z", boot_time=0)
    assert not resume_allowed("healthd: remap-failure gpu2 drain-rma 2026-11-22T00:00:00Z", boot_time=2e9)
    reboot = "healthd: xid 79 gpu3 (GPU-x) drain-reboot 2026-11-22T00:00:00Z"
    assert not resume_allowed(reboot, boot_time=1795305600 - 60)  # booted before the drain
    assert resume_allowed(reboot, boot_time=1795305600 + 60)  # rebooted since


def test_sighup_reload_applies_a_good_config_and_keeps_the_old_one_on_a_bad_edit(tmp_path):
    path = tmp_path / "healthd.toml"
    base = f'node = "node3"\nstate_dir = "{tmp_path}/run"\njournal_dir = "{tmp_path}/lib"\nmetrics = ""\n'
    path.write_text(base + "check_interval = 15\n")
    from clusterctl.healthd.config import load_config

    daemon = Daemon(load_config(path), config_path=path, slurm=FakeSlurm())  # type: ignore[arg-type]
    path.write_text(base + "check_interval = 5\nnvml_timeout = 1\n")
    daemon._reload()
    assert daemon.config.check_interval == 5 and daemon.calls.timeout == 1
    path.write_text(base + "check_interval = 'soon'\n")
    daemon._reload()
    assert daemon.config.check_interval == 5  # a bad edit never takes a running daemon down


def test_a_resumed_node_treats_the_same_fault_again_as_new(make):
    slurm = FakeSlurm()
    daemon = make(slurm)
    assert daemon.event_dedup.first((3, "xid", 48), 0.0)
    daemon._judge("nvml-event", [Finding("xid", "nvml-event", 0.0, gpu=3, xid=48)])
    apply_all(daemon)
    slurm.reason = ""  # an admin resumed the node
    daemon.node_state = slurm.state()
    daemon.clock = lambda: 100.0
    daemon._acknowledge_if_resumed()
    assert daemon.event_dedup.first((3, "xid", 48), 101.0), "not suppressed as part of the old storm"
