"""`healthd evidence` joins what NVML reads now with what healthd holds about each GPU."""

from __future__ import annotations

from clusterctl.healthd.checks import GpuSample
from clusterctl.healthd.evidence import gpu_evidence
from clusterctl.records.actions import Action
from clusterctl.records.healthd_state import GpuState, HealthdState, StateFinding


def test_healthds_findings_join_the_gpu_they_are_about_and_acknowledged_ones_are_left_out():
    held = StateFinding("clock-events", Action.WARN, "clock event reasons 0x40 for 312 s", "periodic", 1.0, gpu=1,
                        current=True)
    old = StateFinding("xid", Action.DRAIN_RESET, "xid 79", "nvml-event", 0.5, xid=79, gpu=1, acknowledged=True)
    state = HealthdState("node4", 1, "v", 2.0, "2026-11-23T00:00:00Z", True,
                         gpus=(GpuState(0, "GPU-0", "0000:18:00"), GpuState(1, "GPU-1", "0000:2a:00", (held, old))))
    samples = [GpuSample(0, "GPU-0", temperature_c=40, sm_clock_mhz=1980, sm_clock_max_mhz=1980),
               GpuSample(1, "GPU-1", temperature_c=92, clock_event_reasons=0x40, sm_clock_mhz=990,
                         sm_clock_max_mhz=1980, ecc_volatile_sbe=3)]
    evidence = gpu_evidence("node4", 5.0, samples, state)
    assert [g.findings for g in evidence.gpus] == [(), ("clock-events: clock event reasons 0x40 for 312 s (warn)",)]
    assert evidence.gpus[1].ecc_corrected_volatile == 3
    assert evidence.slowdown_reasons() == (
        "GPU 1: clock event reasons HW thermal slowdown (0x40); SM clock 990/1980 MHz (50%); "
        "healthd: clock-events: clock event reasons 0x40 for 312 s (warn); 92 °C",)


def test_without_healthds_state_the_gpus_still_speak_and_a_lost_one_says_so():
    evidence = gpu_evidence("node4", 5.0, [GpuSample(2, "GPU-2", lost=True)], None, ["no healthd state"])
    assert evidence.gpus[0].findings == ("gpu-lost: NVML says the GPU is lost",)
    assert evidence.problems == ("no healthd state",)
