"""`healthd evidence`: what this node's GPUs say now, as the record a slow job's agent reads.

`gpu_evidence` (pure) joins NVML samples with healthd's current findings into a
clusterctl.records.gpu_evidence record; `read_evidence` takes the samples (NVML, every call under
a timeout) and the state file.  It only reads: the job's user runs it, as a step on the node.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from clusterctl.healthd.checks import GpuSample
from clusterctl.healthd.config import HealthdConfig
from clusterctl.records.gpu_evidence import GpuEvidence, GpuReading
from clusterctl.records.healthd_state import HealthdState


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
                                   sample.ecc_volatile_dbe, findings))
    return GpuEvidence(node, at, tuple(readings), tuple(problems))


def read_evidence(config: HealthdConfig, gpus: Collection[int] | None = None) -> GpuEvidence:
    """Sample this node's GPUs (all, or `gpus`) through NVML now and join healthd's state file.

    Raises pynvml.NVMLError / NvmlHang when NVML cannot be opened at all; a GPU or a state file that
    cannot be read is a problem line of the record instead.
    """
    import pynvml

    from clusterctl.healthd.gate import read_state
    from clusterctl.healthd.nvml import Nvml, NvmlHang, TimedCalls

    problems: list[str] = []
    nvml = Nvml(TimedCalls(config.nvml_timeout, max_abandoned=1))
    nvml.init()
    try:
        identities = nvml.discover()
        samples = []
        for identity in identities:
            if gpus is not None and identity.index not in gpus:
                continue
            try:
                samples.append(nvml.sample(identity.index))
            except (pynvml.NVMLError, NvmlHang) as exc:
                problems.append(f"GPU {identity.index}: NVML: {exc}")
    finally:
        nvml.shutdown()
    state, unusable = read_state(config)
    if unusable:
        problems.append(unusable)
    elif state is None:
        problems.append(f"no healthd state in {config.state_dir} (is healthd running on this node?)")
    return gpu_evidence(config.node_name, time.time(), samples, state, problems)
