"""`healthd evidence` joins what NVML reads now with what healthd holds about each GPU."""

from __future__ import annotations

from clusterctl.healthd.checks import GpuSample
from clusterctl.healthd.evidence import current_state, gpu_evidence, sample_gpus
from clusterctl.records.actions import Action
from clusterctl.records.healthd_state import GpuState, HealthdState, StateFinding
from tests.fakes import FakeNvml


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


def test_a_pending_row_remap_is_carried_and_a_stale_state_is_left_out():
    stale = HealthdState("node4", 1, "v", 100.0, "2026-11-23T00:00:00Z", True, gpus=(GpuState(
        0, "GPU-0", "0000:18:00", (StateFinding("clock-events", Action.WARN, "clock event reasons 0x40 for 312 s",
                                                "periodic", 90.0, gpu=0, current=True),)),))
    assert current_state(stale, 120.0, 30.0) == (stale, None)
    state, why = current_state(stale, 200.0, 30.0)
    assert state is None and why == ("healthd's state is 100 s old (is healthd running on this node?): "
                                     "its findings are left out")
    evidence = gpu_evidence("node4", 200.0, [GpuSample(0, "GPU-0", remap_pending=True)], state, [why])
    assert evidence.gpus[0].remapped_pending and evidence.gpus[0].findings == ()
    assert evidence.slowdown_reasons() == ()


def test_every_counted_gpu_is_sampled_and_what_cannot_be_read_is_a_problem_line():
    import pynvml

    nvml = FakeNvml(4, {0: GpuSample(0, "GPU-0"), 1: GpuSample(1, lost=True),
                        2: pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN), 3: GpuSample(3, "GPU-3")})
    samples, problems = sample_gpus(nvml, [3, 1, 2, 9])
    assert [s.index for s in samples] == [1, 3] and samples[0].lost
    assert problems == ["GPU 9: not on this node (NVML counts 4 GPUs)", "GPU 2: NVML: Unknown Error"]
    assert nvml.calls == ["init", "sample 1", "sample 2", "sample 3", "shutdown"]


def test_after_a_hang_no_further_gpu_is_asked():
    from clusterctl.healthd.nvml import NvmlHang

    nvml = FakeNvml(4, {0: GpuSample(0), 1: NvmlHang("nvmlDeviceGetTemperature", 5.0)})
    samples, problems = sample_gpus(nvml)
    assert [s.index for s in samples] == [0]
    assert problems == ["GPU 1: NVML: nvmlDeviceGetTemperature did not return within 5 s",
                        "GPU 2,3: not read (NVML hung on GPU 1)"]
    assert nvml.calls[-1] == "shutdown"
    hung = FakeNvml(2, {}, discover=NvmlHang("nvmlDeviceGetUUID", 5.0))
    assert sample_gpus(hung) == ([], ["NVML: nvmlDeviceGetUUID did not return within 5 s",
                                      "GPU 0,1: not read (NVML hung while identifying the GPUs)"])
