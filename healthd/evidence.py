"""`healthd evidence`: what this node's GPUs say now, as the record a slow job's agent reads.

`gpu_evidence` (pure) joins NVML samples with healthd's current findings into a
clusterctl.records.gpu_evidence record; `sample_gpus` reads the samples through the NVML door it
is given (an `NvmlReader`: healthd.nvml.Nvml, every call under a timeout) and `read_evidence` adds healthd's state
file.  It only reads: the job's user runs it, as a step on the node.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from clusterctl.healthd.checks import GpuSample
from clusterctl.healthd.config import HealthdConfig
from clusterctl.records.gpu_evidence import GpuEvidence, GpuReading
from clusterctl.records.healthd_state import HealthdState

if TYPE_CHECKING:
    from clusterctl.healthd.nvml import NvmlReader


def gpu_evidence(node: str, at: float, samples: Sequence[GpuSample], state: HealthdState | None,
                 problems: Sequence[str] = ()) -> GpuEvidence:
    """The evidence record of `node` from its GPUs' `samples` and healthd's `state` (None: not readable)."""
    held = {gpu.index: gpu.findings for gpu in state.gpus} if state is not None else {}
    readings = []
    for sample in samples:
        findings = tuple(f"{f.what}: {f.reason} ({f.action.label})" for f in held.get(sample.index, ())
                         if not f.acknowledged)
        if sample.lost:
            findings = ("gpu-lost: NVML says the GPU is lost",) + findings
        readings.append(GpuReading(sample.index, sample.uuid, sample.clock_event_reasons, sample.sm_clock_mhz,
                                   sample.sm_clock_max_mhz, sample.temperature_c, sample.ecc_volatile_sbe,
                                   sample.ecc_volatile_dbe, sample.remap_pending, findings))
    return GpuEvidence(node, at, tuple(readings), tuple(problems))


def current_state(state: HealthdState | None, at: float, max_age: float) -> tuple[HealthdState | None, str | None]:
    """`state` when healthd wrote it within `max_age` seconds of `at`; else None and why (the findings
    of a daemon that stopped are no longer current, and must not make a node look slowed)."""
    if state is None or at - state.updated_at <= max_age:
        return state, None
    return None, (f"healthd's state is {at - state.updated_at:.0f} s old (is healthd running on this node?): "
                  f"its findings are left out")


def sample_gpus(nvml: NvmlReader, gpus: Collection[int] | None = None) -> tuple[list[GpuSample], list[str]]:
    """Sample every GPU NVML counts (or those of `gpus`) through `nvml`, and one problem line per GPU
    that could not be read or is not there.

    Raises pynvml.NVMLError / NvmlHang when NVML cannot be opened or cannot count the GPUs at all.
    """
    import pynvml

    from clusterctl.healthd.nvml import NvmlHang

    problems: list[str] = []
    samples: list[GpuSample] = []
    nvml.init()
    try:
        count = nvml.count()
        asked = sorted(set(gpus)) if gpus is not None else list(range(count))
        problems += [f"GPU {i}: not on this node (NVML counts {count} GPUs)" for i in asked if i >= count]
        asked = [i for i in asked if i < count]
        try:
            nvml.discover()  # the UUIDs; a GPU it cannot identify is still sampled below
        except NvmlHang as exc:
            # The driver is stuck: every further call would be refused (or wait out its own timeout).
            problems.append(f"NVML: {exc}")
            if asked:
                problems.append(f"GPU {_indexes(asked)}: not read (NVML hung while identifying the GPUs)")
            return samples, problems
        except pynvml.NVMLError as exc:
            problems.append(f"NVML: cannot identify every GPU: {exc}")
        for position, index in enumerate(asked):
            try:
                # Every enumerated index, not only the identified ones: a lost GPU is evidence too.
                samples.append(nvml.sample(index))
            except NvmlHang as exc:
                problems.append(f"GPU {index}: NVML: {exc}")
                if rest := asked[position + 1:]:
                    problems.append(f"GPU {_indexes(rest)}: not read (NVML hung on GPU {index})")
                break
            except pynvml.NVMLError as exc:
                problems.append(f"GPU {index}: NVML: {exc}")
    finally:
        nvml.shutdown()
    return samples, problems


def _indexes(indexes: Sequence[int]) -> str:
    return ",".join(map(str, indexes))


def read_evidence(nvml: NvmlReader, config: HealthdConfig, at: float, gpus: Collection[int] | None = None) -> GpuEvidence:
    """This node's GPUs (all, or `gpus`) read through `nvml` now, joined with healthd's state file.

    Raises pynvml.NVMLError / NvmlHang when NVML cannot be used at all; a GPU or a state file that
    cannot be read is a problem line of the record instead (the daemon may not run).
    """
    from clusterctl.healthd.gate import read_state

    samples, problems = sample_gpus(nvml, gpus)
    state, unusable = read_state(config)
    if unusable:
        problems.append(unusable)
    elif state is None:
        problems.append(f"no healthd state in {config.state_dir} (is healthd running on this node?)")
    # By age only (gate.state_is_fresh's limit): a job's user may not see healthd's process (hidepid).
    state, stale = current_state(state, at, max(3 * config.check_interval, 30.0))
    if stale:
        problems.append(stale)
    return gpu_evidence(config.node_name, at, samples, state, problems)
