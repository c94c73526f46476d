"""healthd sees the network and the shared storage: IB/RoCE ports read from a real sysfs-shaped tree (the
testbed's own builder writes it, faults injected as the testbed injects them), NIC PCIe links, error
counters judged by their rates, and a storage probe that a hung mount cannot hang."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.checks.counter_rate import CounterRates
from clusterctl.healthd.checks.network import NetworkMemory, check_network, read_nics
from clusterctl.healthd.checks.pcie import check_nic_links
from clusterctl.healthd.checks.storage import StorageLimits, StorageProbe, seconds_to_slot
from clusterctl.healthd.config import ConfigError, config_from_mapping
from clusterctl.healthd.findings import Finding
from clusterctl.healthd.policy import drain_reason, judge
from clusterctl.records.actions import Action
from clusterctl.records.drain_reason import parse_drain_reason

pytest.importorskip("clusterctl_testbed", reason="builds its trees with the testbed package: pip install -e ./testbed")

from clusterctl_testbed.ib_faults import IbFault, build_tree, inject_ib  # noqa: E402

T0 = 1795305600.0


class Node:
    """One node's tree and healthd's memory of it: `check(now)` is one periodic pass over its network."""

    def __init__(self, root: Path, limits: CheckLimits | None = None, devices: tuple[str, ...] = ()) -> None:
        self.root, self.limits, self.devices = root, limits or CheckLimits(), devices
        self.memory = NetworkMemory()

    def check(self, now: float) -> list[Finding]:
        nics = read_nics(self.root, self.devices)
        return check_network(nics, self.limits, self.memory, now) + check_nic_links(nics.links, now)


@pytest.fixture()
def node(tmp_path) -> Node:
    build_tree(tmp_path)
    return Node(tmp_path)


def kinds(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.kind, f.detail) for f in findings]


def test_a_healthy_tree_reads_as_eight_active_ndr_ports_on_x16_links_and_finds_nothing(node):
    nics = read_nics(node.root)
    assert [p.name for p in nics.ports] == [f"mlx5_{i}/1" for i in range(8)]
    assert {(p.state, p.phys_state, p.rate_gbps) for p in nics.ports} == {("ACTIVE", "LinkUp", 400.0)}
    assert {(link.width, link.width_max, link.speed, link.speed_max) for link in nics.links} == {(16, 16, 32.0, 32.0)}
    assert [node.check(T0 + 15 * i) for i in range(6)] == [[]] * 6


def test_a_node_without_infiniband_has_nothing_to_say(tmp_path):
    assert read_nics(tmp_path / "nothing-here").ports == ()
    assert Node(tmp_path).check(T0) == []


def test_a_port_that_goes_down_is_found_and_its_drain_reason_names_port_and_states(node):
    node.check(T0)
    inject_ib(node.root, IbFault("ib-port-down", nic=3))
    (finding,) = node.check(T0 + 15)
    assert (finding.kind, finding.detail) == ("ib-port-down", "mlx5_3/1 state DOWN phys_state Disabled")
    verdict = judge(finding)
    assert verdict.action is Action.DRAIN_RESET
    reason = drain_reason(finding, verdict, T0 + 15).render()
    assert reason == "healthd: ib-port-down [mlx5_3/1 state DOWN phys_state Disabled] drain-reset 2026-11-22T00:00:15Z"
    parsed = parse_drain_reason(reason)
    assert parsed is not None and parsed.kind == "ib-port-down" and parsed.evidence.startswith("mlx5_3/1")


def test_a_port_at_half_its_rate_is_slow_against_its_best_rate_or_the_configured_one(node, tmp_path):
    node.check(T0)
    inject_ib(node.root, IbFault("ib-rate-halved", nic=1))
    assert kinds(node.check(T0 + 15)) == [("ib-port-slow", "mlx5_1/1 rate 200 Gb/s < expected 400 Gb/s")]
    # A port degraded before healthd started is only caught by the site's expected rate.
    fresh = Node(node.root)
    assert fresh.check(T0) == []
    told = Node(node.root, CheckLimits(ib_expected_rate_gbps=400))
    assert [f.value for f in told.check(T0)] == ["mlx5_1/1"]


def test_symbol_errors_climbing_are_found_by_their_rate_with_counter_rate_and_threshold(node):
    for i in range(3):
        assert node.check(T0 + 15 * i) == []
    inject_ib(node.root, IbFault("ib-symbol-errors", nic=5, value=40))
    (finding,) = node.check(T0 + 45)
    assert finding.kind == "ib-errors" and finding.value == "mlx5_5/1"
    assert finding.detail == "mlx5_5/1 symbol_error 53.3/min > 10/min"  # 40 errors over the last 45 s
    assert "[mlx5_5/1 symbol_error 53.3/min > 10/min]" in drain_reason(finding, judge(finding), T0).render()


def test_a_few_symbol_errors_an_hour_are_no_finding(node):
    for i in range(40):
        if i % 20 == 10:
            inject_ib(node.root, IbFault("ib-symbol-errors", nic=0, value=3))
        assert node.check(T0 + 15 * i) == []


def test_a_flapping_link_is_found_even_though_the_port_reads_active_again(node):
    node.check(T0)
    node.check(T0 + 15)
    inject_ib(node.root, IbFault("ib-link-flap", nic=2))
    found = kinds(node.check(T0 + 30))
    assert ("ib-link-flap", "mlx5_2/1 link_downed 2.0/min > 0.5/min") in found


def test_counters_reset_by_an_admin_or_a_driver_reload_are_no_finding(node):
    counter = node.root / "sys/class/infiniband/mlx5_4/ports/1/counters/symbol_error"
    counter.write_text("60000\n")
    node.check(T0)
    counter.write_text("0\n")  # perfquery -x, or the driver reloaded
    assert node.check(T0 + 15) == []
    assert node.check(T0 + 45) == []


def test_only_the_devices_named_are_judged(tmp_path):
    build_tree(tmp_path, nics=2)
    inject_ib(tmp_path, IbFault("ib-port-down", nic=1))
    assert [f.value for f in Node(tmp_path).check(T0)] == ["mlx5_1/1"]
    assert Node(tmp_path, devices=("mlx5_0",)).check(T0) == []


def test_a_nic_whose_pcie_link_trained_narrow_drains_for_a_reboot(node):
    inject_ib(node.root, IbFault("nic-pcie-degraded", nic=6, value=8))
    (finding,) = node.check(T0)
    assert (finding.kind, finding.detail) == ("pcie-degraded", "mlx5_6 PCIe width x8 < x16")
    assert judge(finding).action is Action.DRAIN_REBOOT


def test_clearing_a_port_makes_it_healthy_again(node):
    inject_ib(node.root, IbFault("ib-port-down", nic=0))
    assert node.check(T0)
    inject_ib(node.root, IbFault("ib-clear", nic=0))
    assert node.check(T0 + 15) == []


def test_an_unknown_network_fault_or_port_is_refused_by_name(node):
    with pytest.raises(ValueError, match="unknown network fault 'melt'; known: ib-port-down"):
        inject_ib(node.root, IbFault("melt"))
    with pytest.raises(ValueError, match="no port 2 of mlx5_0"):
        inject_ib(node.root, IbFault("ib-port-down", port=2))


# ---- the counter-rate logic: resets, wraps and gaps never make a false finding ---------------------

reads = st.lists(st.tuples(st.floats(0.5, 600.0), st.integers(-10**6, 10**6)), min_size=1, max_size=60)


@given(reads)
@settings(max_examples=300, deadline=None)
def test_a_rate_is_never_negative_and_never_counts_what_came_before_a_reset(steps):
    rates, now, value = CounterRates(), T0, 0
    for gap, change in steps:
        now, value = now + gap, max(0, value + change)
        rate = rates.per_minute("c", value, now)
        assert rate is None or rate >= 0


@given(st.lists(st.floats(0.5, 600.0), min_size=1, max_size=60), st.floats(0.0, 100.0))
@settings(max_examples=300, deadline=None)
def test_a_counter_climbing_at_a_steady_rate_reads_that_rate_whatever_the_gaps(gaps, per_minute):
    rates, now = CounterRates(), T0
    rates.per_minute("c", 0, now)
    start = now
    for gap in gaps:
        now += gap
        rate = rates.per_minute("c", int((now - start) * per_minute / 60), now)
        if rate is not None:
            assert rate <= per_minute + 60 / 30 + 1e-9  # at most one count of rounding over the 30 s minimum span


@given(st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=40))
@settings(max_examples=300, deadline=None)
def test_wraps_and_resets_alone_never_exceed_the_increase_actually_seen(values):
    """Any sequence of values (wraps, resets, jumps): the rate never exceeds what a rise since the last
    drop explains over the span it was seen in."""
    rates, now = CounterRates(), T0
    since_drop: list[tuple[float, int]] = []
    for value in values:
        now += 15
        if since_drop and value < since_drop[-1][1]:
            since_drop = []
        since_drop.append((now, value))
        rate = rates.per_minute("c", value, now)
        if rate is not None:
            rise = value - since_drop[0][1]
            assert 0 <= rate <= rise * 60 / 30 * (1 + 1e-12)


def test_a_long_gap_gives_the_mean_over_it_not_a_spike():
    rates = CounterRates()
    rates.per_minute("c", 0, T0)
    assert rates.per_minute("c", 60, T0 + 3600) == pytest.approx(1.0)


def test_reads_closer_than_half_a_window_give_no_rate_yet():
    rates = CounterRates()
    rates.per_minute("c", 0, T0)
    assert rates.per_minute("c", 1, T0 + 0.1) is None  # not 600/min from one error


# ---- the storage probe --------------------------------------------------------------------------------


def slot_of(probe: StorageProbe) -> float:
    """The first time from T0 on that `probe`'s node probes (its slot in the default storage interval)."""
    return T0 + seconds_to_slot(probe.phase, StorageLimits().storage_interval_s, T0)


def test_a_working_path_passes_and_leaves_nothing_behind(tmp_path):
    probe = StorageProbe(time.monotonic)
    assert probe.check([str(tmp_path)], StorageLimits(), slot_of(probe)) == []
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_cannot_be_written_is_a_storage_error(tmp_path):
    missing = tmp_path / "unmounted"
    probe = StorageProbe(time.monotonic)
    (finding,) = probe.check([str(missing)], StorageLimits(), slot_of(probe))
    assert finding.kind == "storage-error" and finding.value == str(missing)
    assert finding.detail.startswith(f"{missing} probe failed: No such file or directory")
    assert judge(finding).action is Action.DRAIN_RESET


def test_a_hung_mount_is_found_within_its_deadline_and_never_gets_a_second_stuck_thread(tmp_path):
    release, started = threading.Event(), []

    def hangs(path: str) -> None:
        started.append(path)
        release.wait(30)

    probe = StorageProbe(time.monotonic, run=hangs)
    limits = StorageLimits(storage_timeout_s=0.2)
    began, slot = time.monotonic(), slot_of(probe)
    (first,) = probe.check(["/lustre/ckpt"], limits, slot)
    assert time.monotonic() - began < 2
    assert first.kind == "storage-hung" and first.detail.startswith("/lustre/ckpt write/fsync/read/unlink not done")
    assert judge(first).action is Action.DRAIN_REBOOT
    began = time.monotonic()
    (second,) = probe.check(["/lustre/ckpt"], limits, slot + 15)
    assert second.kind == "storage-hung" and started == ["/lustre/ckpt"]  # still the one probe
    assert time.monotonic() - began < 0.1  # known hung: the pass does not wait for it again
    reason = drain_reason(second, judge(second), slot + 15).render()
    assert reason.startswith("healthd: storage-hung [/lustre/ckpt write/fsync/read/unlink not done after")
    release.set()
    time.sleep(0.05)
    assert probe.check(["/lustre/ckpt"], limits, slot + 30) == []  # back: probed again at once


# ---- configuration ------------------------------------------------------------------------------------


def test_the_network_and_storage_settings_are_read_and_checked():
    config = config_from_mapping({"ib_root": "/srv/node1", "ib_devices": ["mlx5_0", "mlx5_1"],
                                  "storage_paths": ["/lustre/ckpt"],
                                  "checks": {"ib_symbol_error_per_min": 100, "storage_timeout_s": 2.5}})
    assert (str(config.ib_root), config.ib_devices, config.storage_paths) == ("/srv/node1", ("mlx5_0", "mlx5_1"),
                                                                             ("/lustre/ckpt",))
    assert (config.checks.ib_symbol_error_per_min, config.checks.storage_timeout_s) == (100, 2.5)
    with pytest.raises(ConfigError, match=r"key `ib_devices` must be a list of at most 64 device names"):
        config_from_mapping({"ib_devices": ["mlx5_0; rm -rf /"]})
    with pytest.raises(ConfigError, match=r"key `storage_paths` must be an absolute path"):
        config_from_mapping({"storage_paths": ["lustre"]})


# ---- through the daemon: a finding of the periodic pass becomes a drain with its evidence in Slurm -----


def test_the_daemons_periodic_pass_drains_for_a_flapping_port_with_the_counter_in_slurms_reason(tmp_path):
    from clusterctl.clock import Clock
    from clusterctl.healthd.config import HealthdConfig
    from clusterctl.healthd.daemon import Applied, Daemon
    from tests.fakes import FakePartition

    build_tree(tmp_path / "sysroot")
    now = [T0]
    config = HealthdConfig(node="node3", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib", metrics="",
                           disk_paths=(), ib_root=tmp_path / "sysroot", storage_paths=(str(tmp_path),))
    slurm = FakePartition()
    shell = Daemon(config, slurm=slurm("node3"), clock=Clock(now=lambda: now[0]), boot_time=lambda: T0 - 3600)
    for _ in range(2):
        shell.handle(shell.periodic.check())
        now[0] += 15
    inject_ib(tmp_path / "sysroot", IbFault("ib-link-flap", nic=7, value=3))
    shell.handle(shell.periodic.check())
    action = shell.actions.get_nowait()
    shell.handle(Applied(action, shell.apply(action), shell.applied_node))
    assert slurm.drains == ["healthd: ib-link-flap [mlx5_7/1 link_downed 6.0/min > 0.5/min] drain-reset "
                            "2026-11-22T00:00:30Z"]


@given(st.text(max_size=400), st.sampled_from(["ib-errors", "pcie-degraded", "storage-hung"]),
       st.one_of(st.none(), st.integers(0, 7)))
@settings(max_examples=300, deadline=None)
def test_any_evidence_text_reads_back_from_the_reason_it_is_written_into(text, kind, gpu):
    from clusterctl.records.drain_reason import MAX_EVIDENCE, DrainReason, as_evidence

    reason = DrainReason(kind, Action.DRAIN_RESET, "2026-11-22T00:00:15Z", gpu=gpu, evidence=as_evidence(text))
    assert len(reason.evidence) <= MAX_EVIDENCE and reason.evidence.isprintable()
    assert parse_drain_reason(reason.render()) == reason


def test_the_testbeds_inject_verb_refuses_a_network_fault_with_a_word_for_its_count():
    from click.testing import CliRunner

    from tests.conftest import import_testbed

    result = CliRunner().invoke(import_testbed("cli").cli, ["inject", "node3", "ib-symbol-errors", "many", "--nic", "2"])
    assert result.exit_code == 2
    assert "ib-symbol-errors takes at most one whole number, found 'many'" in result.output
    assert "Traceback" not in result.output
