"""The fault policy and the periodic checks (pure)."""

from __future__ import annotations

import json
import re

import pytest

from clusterctl.healthd.checks import CheckLimits, GpuSample, HostSample, Sustained, check_gpu, check_gpu_count, check_host
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.policy import PolicyConfig, drain_reason, judge
from clusterctl.records.drain_reason import DrainReason, parse_drain_reason


def xid(n: int, gpu: int = 3, at: float = 1000.0, jobs: tuple[str, ...] = ()) -> Finding:
    return Finding("xid", "nvml-event", at, gpu=gpu, uuid="GPU-x", xid=n, job_ids=jobs)


@pytest.mark.parametrize("number, action", [
    (79, Action.DRAIN_REBOOT), (48, Action.DRAIN_RESET), (64, Action.DRAIN_RMA), (45, Action.IGNORE),
    (8, Action.IGNORE), (13, Action.APP_FAULT), (31, Action.APP_FAULT), (43, Action.APP_FAULT),
    (63, Action.RESET_AT_IDLE), (92, Action.WARN), (119, Action.DRAIN_RESET), (74, Action.DRAIN_RESET),
    (9999, Action.WARN),
])
def test_xid_table(number, action):
    assert judge(xid(number)).action is action


def test_app_xid_drains_only_when_the_same_gpu_repeats_across_jobs():
    first = xid(13, jobs=("101",), at=0)
    assert judge(first).action is Action.APP_FAULT
    assert judge(xid(13, jobs=("101",), at=60), [first]).action is Action.APP_FAULT  # same job again
    assert judge(xid(31, gpu=4, jobs=("102",), at=60), [first]).action is Action.APP_FAULT  # another GPU
    repeat = judge(xid(43, jobs=("102",), at=3600), [first])
    assert repeat.action is Action.DRAIN_RESET and "2 different jobs (101, 102)" in repeat.reason
    late = xid(13, jobs=("103",), at=2 * 86400)
    assert judge(late, [first]).action is Action.APP_FAULT  # outside the 24 h window


def test_recovery_action_overrides_and_promotion_config():
    assert judge(Finding("recovery-action", "periodic", 0, gpu=1, value=2)).action is Action.DRAIN_REBOOT
    assert judge(Finding("recovery-action", "periodic", 0, gpu=1, value=0)).action is Action.IGNORE
    promoted = judge(xid(9999), config=PolicyConfig({9999: Action.DRAIN_RESET}))
    assert promoted.action is Action.DRAIN_RESET and "promoted" in promoted.reason


def test_drain_reason_is_owned_and_says_what_where_when():
    finding = xid(79)
    reason = drain_reason(finding, judge(finding), 1795316400.0).render()
    assert reason == "healthd: xid 79 gpu3 (GPU-x) drain-reboot 2026-11-22T03:00:00Z"
    assert parse_drain_reason(reason) == DrainReason("xid", Action.DRAIN_REBOOT, "2026-11-22T03:00:00Z", xid=79,
                                                     gpu=3, uuid="GPU-x")


def test_policy_table_is_complete_and_versioned():
    from click.testing import CliRunner

    from clusterctl.healthd.cli import cli
    from clusterctl.healthd.policy import CONDITION_TABLE, POLICY_VERSION, XID_TABLE

    shown = json.loads(CliRunner().invoke(cli, ["policy", "--json"]).output)
    assert shown["version"] == POLICY_VERSION and re.fullmatch(r"\d{4}\.\d{1,2}\.\d+", POLICY_VERSION)
    signals = " ".join(rule["signal"] for rule in shown["rules"])
    assert all(str(number) in signals for xids, _, _ in XID_TABLE for number in xids)
    assert all(kind in signals for kind, _, _ in CONDITION_TABLE)


LIMITS = CheckLimits(temperature_sustain_s=300, clock_events_sustain_s=300)


def kinds(findings):
    return [f.kind for f in findings]


def test_gpu_checks():
    s = Sustained()
    assert kinds(check_gpu(GpuSample(0, lost=True), LIMITS, s, 0)) == ["gpu-lost"]
    assert kinds(check_gpu(GpuSample(0, ecc_volatile_dbe=1), LIMITS, s, 0)) == ["ecc-dbe"]
    assert kinds(check_gpu(GpuSample(0, remap_failure=True, remap_pending=True), LIMITS, s, 0)) == ["remap-failure"]
    assert kinds(check_gpu(GpuSample(0, remap_pending=True), LIMITS, s, 0)) == ["remap-pending"]
    assert kinds(check_gpu(GpuSample(0, remap_uncorrectable=512), LIMITS, s, 0)) == ["remap-uncorrectable"]
    assert kinds(check_gpu(GpuSample(0, retired_pages_dbe=63), LIMITS, s, 0)) == ["retired-pages"]
    assert kinds(check_gpu(GpuSample(0, nvlink_down=(3,)), LIMITS, s, 0)) == ["nvlink-down"]
    assert kinds(check_gpu(GpuSample(0, ecc_volatile_sbe=5000, temperature_c=40), LIMITS, s, 0)) == []


def test_heat_counts_only_when_sustained():
    s = Sustained()
    assert kinds(check_gpu(GpuSample(1, temperature_c=95), LIMITS, s, 0)) == []
    assert kinds(check_gpu(GpuSample(1, temperature_c=95), LIMITS, s, 60)) == ["thermal"]
    assert kinds(check_gpu(GpuSample(1, temperature_c=60), LIMITS, s, 120)) == []  # spike over
    for t in (200, 400, 600):
        out = check_gpu(GpuSample(1, temperature_c=95), LIMITS, s, t)
    assert kinds(out) == ["thermal-sustained"]
    assert judge(out[0]).action is Action.DRAIN_RESET


def test_clock_slowdowns_count_only_when_sustained_and_never_a_power_cap():
    s = Sustained()
    # A software power cap (0x4) is a site setting, never a finding; HW slowdown (0x8) sustained is.
    assert kinds(check_gpu(GpuSample(2, clock_event_reasons=0x4), LIMITS, s, 0)) == []
    check_gpu(GpuSample(2, clock_event_reasons=0x8), LIMITS, s, 0)
    assert kinds(check_gpu(GpuSample(2, clock_event_reasons=0x8), LIMITS, s, 301)) == ["clock-events"]


def test_a_node_enumerating_fewer_gpus_has_lost_one():
    assert kinds(check_gpu_count(7, LIMITS, 0)) == ["gpu-missing"]
    assert kinds(check_gpu_count(8, LIMITS, 0)) == []


def test_host_memory_space_and_read_only_paths():
    host = HostSample(memory_available_fraction=0.01, disk_free_fraction={"/scratch": 0.001, "/": 0.5},
                      readonly_paths=("/scratch",))
    assert kinds(check_host(host, LIMITS, 0)) == ["host-memory", "host-disk", "host-readonly"]


def test_a_kernel_xid_for_an_unnamed_gpu_gives_its_pci_address():
    finding = Finding("xid", "kmsg", 0, xid=79, value="0000:5d:00")
    assert drain_reason(finding, judge(finding), 0).render() == \
        "healthd: xid 79 pci 0000:5d:00 drain-reboot 1970-01-01T00:00:00Z"


def test_app_xids_with_no_known_job_are_not_a_repeat():
    earlier = xid(31, jobs=("unknown",), at=0)
    assert judge(xid(13, jobs=("7",), at=60), [earlier]).action is Action.APP_FAULT
