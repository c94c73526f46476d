"""`healthd evidence` joins what NVML reads now with what healthd holds about each GPU; a job's straggler
action asks only for the GPUs the job has on the node (`--job-gpus`)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.healthd.checks import GpuSample
from clusterctl.healthd.cli import cli as healthd_cli
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.evidence import EVERY_GPU, current_state, gpu_evidence, job_gpus, read_evidence, sample_gpus
from clusterctl.healthd.gate import gpu_index_list
from clusterctl.records.actions import Action
from clusterctl.records.gpu_evidence import GpuEvidence
from clusterctl.records.healthd_state import GpuState, HealthdState, StateFinding, write_healthd_state
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


# ---- a job's own GPUs on a node it shares -------------------------------------------------------

AT = 1795305600.0
GPU5_HOT = StateFinding("clock-events", Action.WARN, "clock event reasons 0x40 for 312 s", "periodic", AT - 5,
                        gpu=5, current=True)


def shared_node(tmp_path) -> tuple[FakeNvml, HealthdConfig]:
    """node2's 8 GPUs at full clocks but GPU 5 (another job's), thermally throttled, which healthd also holds."""
    samples = {i: GpuSample(i, f"GPU-{i}", temperature_c=60, sm_clock_mhz=1980, sm_clock_max_mhz=1980)
               for i in range(8)}
    samples[5] = GpuSample(5, "GPU-5", temperature_c=91, clock_event_reasons=0x40, sm_clock_mhz=792,
                           sm_clock_max_mhz=1980)
    config = HealthdConfig(node="node2", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib")
    write_healthd_state(config.state_dir, HealthdState(
        "node2", 1, "v", AT - 1, "2026-11-23T00:00:00Z", True,
        gpus=tuple(GpuState(i, f"GPU-{i}", f"0000:1{i}:00", (GPU5_HOT,) if i == 5 else ()) for i in range(8))))
    return FakeNvml(8, samples), config


def test_a_jobs_evidence_on_a_shared_node_leaves_out_another_jobs_throttled_gpu(tmp_path):
    nvml, config = shared_node(tmp_path)
    # SLURM_JOB_GPUS as a step from the batch script on another node carries it: that node's list, not this one's.
    mine = read_evidence(nvml, config, AT, job_gpus({"SLURM_STEP_GPUS": "0,1,2,3", "SLURM_JOB_GPUS": "4,5,6,7"}))
    assert [g.index for g in mine.gpus] == [0, 1, 2, 3]
    assert mine.scope == "GPU 0,1,2,3: this job's on this node (SLURM_STEP_GPUS)"
    assert mine.slowdown_reasons() == () and mine.problems == ()
    assert "GPU 5" not in json.dumps(mine.to_json()) and "GPU 5" not in "\n".join(mine.to_text())
    assert mine.to_text()[0] == "node2: 4 GPUs read (GPU 0,1,2,3: this job's on this node (SLURM_STEP_GPUS))"
    assert nvml.calls == ["init", "sample 0", "sample 1", "sample 2", "sample 3", "shutdown"]
    # The admin's look at the whole node still names it.
    every = read_evidence(shared_node(tmp_path)[0], config, AT, EVERY_GPU)
    assert every.scope == "every GPU of the node" and [r.split(":")[0] for r in every.slowdown_reasons()] == ["GPU 5"]


@pytest.mark.parametrize("value", ["0-3", "0,,1", "gpu:4", "0;1", "-1", "+2", "\u0663", "12345", "0,1 2"])
def test_a_step_gpu_list_that_is_not_one_is_a_problem_line_and_no_gpu_is_read(tmp_path, value):
    nvml, config = shared_node(tmp_path)
    evidence = read_evidence(nvml, config, AT, job_gpus({"SLURM_STEP_GPUS": value}))
    assert evidence.gpus == () and evidence.slowdown_reasons() == () and nvml.calls == []
    assert evidence.scope == "no GPU: SLURM_STEP_GPUS is not a GPU list"
    [problem] = evidence.problems
    assert problem.startswith(f"SLURM_STEP_GPUS={value!r} is not a GPU list: ") and problem.endswith("no GPU was read")


def test_a_job_without_gpus_on_the_node_reads_none_and_says_why(tmp_path):
    nvml, config = shared_node(tmp_path)
    for environ in ({}, {"SLURM_STEP_GPUS": ""}):
        evidence = read_evidence(nvml, config, AT, job_gpus(environ))
        assert evidence.gpus == () and nvml.calls == []
        assert evidence.problems == ("SLURM_STEP_GPUS is not set: Slurm names no GPU of this job on this node, so no "
                                     "GPU was read (the other GPUs are other jobs')",)
    assert GpuEvidence.from_json(evidence.to_json(), "here") == evidence


@given(st.lists(st.integers(0, 9999), min_size=1, max_size=16), st.randoms())
def test_a_gpu_list_as_slurm_writes_it_reads_back_as_its_set(indexes, rng):
    shuffled = list(indexes)
    rng.shuffle(shuffled)
    assert gpu_index_list(",".join(map(str, shuffled))) == sorted(set(indexes))


INDEX = r"[ \t]*[0-9]{1,4}[ \t]*"


@given(st.text(max_size=30) | st.from_regex(rf"{INDEX}(,{INDEX})*", fullmatch=True))
def test_a_gpu_list_is_read_only_when_every_entry_is_an_index_and_anything_else_is_a_value_error(text):
    try:
        gpus = gpu_index_list(text)
    except ValueError as exc:
        assert re.fullmatch(rf"{INDEX}(,{INDEX})*", text) is None and "is not a GPU index" in str(exc)
        return
    assert gpus == sorted({int(part) for part in text.split(",")})


def test_the_command_reads_no_gpu_for_a_step_without_any_and_refuses_a_bad_gpus_option(tmp_path):
    config = tmp_path / "healthd.toml"
    config.write_text('node = "node2"\n')
    for env in ({"SLURM_STEP_GPUS": None}, {"SLURM_STEP_GPUS": "0-3"}):
        # No NVML on this machine: a step that names no GPU never needs it.
        result = CliRunner().invoke(healthd_cli, ["evidence", "--job-gpus", "--json", "--config", str(config)], env=env)
        assert result.exit_code == 0, result.output
        record = GpuEvidence.from_json(json.loads(result.output), "stdout")
        assert record.node == "node2" and record.gpus == () and record.scope.startswith("no GPU: SLURM_STEP_GPUS")
    for argv, said in ((["--gpus", "0", "--job-gpus"], "give --gpus or --job-gpus, not both"),
                       (["--gpus", "0-3"], "--gpus: '0-3' is not a GPU index")):
        result = CliRunner().invoke(healthd_cli, ["evidence", *argv, "--config", str(config)])
        assert result.exit_code == 2 and f"healthd: error: {said}" in result.output, result.output
        assert "Traceback" not in result.output
