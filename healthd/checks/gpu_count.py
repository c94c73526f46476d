"""A GPU lost to NVML, or fewer GPUs enumerated than the node should have."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterctl.healthd.checks.family import CheckFamily, Condition, gpu_finding, limit
from clusterctl.healthd.findings import Action, Finding

if TYPE_CHECKING:
    from clusterctl.healthd.gpu_sample import GpuSample


@dataclass(frozen=True)
class GpuCountLimits:
    """[checks] limits of this family."""

    expected_gpus: int = limit(8, 0, 1024)


def check_lost(sample: GpuSample, now: float) -> list[Finding]:
    """A lost GPU answers nothing else: it is the one finding of its sample."""
    return [gpu_finding(sample, now, "gpu-lost", detail="NVML_ERROR_GPU_IS_LOST")] if sample.lost else []


def check_gpu_count(count: int, limits: GpuCountLimits, now: float) -> list[Finding]:
    """A node that enumerates fewer GPUs than it should has lost one."""
    if count < limits.expected_gpus:
        return [Finding("gpu-missing", "periodic", now, value=count,
                        detail=f"{count} of {limits.expected_gpus} GPUs visible")]
    return []


FAMILY = CheckFamily("gpu count", ("gpu-lost", "gpu-missing"), (
    Condition("gpu-lost", Action.DRAIN_REBOOT, "NVML reports the GPU lost"),
    Condition("gpu-missing", Action.DRAIN_REBOOT, "fewer GPUs than expected"),
))
