"""The one sampler of this node's GPUs and host, shared by the daemon and the hooks.

The daemon's periodic check and the prolog/epilog/HealthCheckProgram's direct check read
the node the same way (same calls, same read-only rule), so they cannot disagree about it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from clusterctl.healthd.checks import CheckLimits, HostSample, Sustained, check_gpu, check_gpu_count
from clusterctl.healthd.findings import Finding

if TYPE_CHECKING:
    from clusterctl.healthd.nvml import NvmlReader


def sample_host(paths: Sequence[str]) -> HostSample:
    """Available memory, free space and read-only state of `paths` (a path that cannot be read is skipped).

    Read-only is asked of the path itself (statvfs), so a path below a mount point counts too.
    """
    memory = psutil.virtual_memory()
    free: dict[str, float] = {}
    readonly: list[str] = []
    for path in paths:
        try:
            usage = shutil.disk_usage(path)
            flags = os.statvfs(path).f_flag
        except OSError:
            continue
        free[path] = usage.free / usage.total if usage.total else 1.0
        if flags & os.ST_RDONLY:
            readonly.append(path)
    available = memory.available / memory.total if memory.total else 1.0
    return HostSample(available, free, tuple(readonly))


@dataclass(frozen=True)
class GpuScan:
    """What one pass over the GPUs found, and how many GPUs NVML enumerated (None: it could not say)."""

    findings: tuple[Finding, ...]
    count: int | None = None


def scan_gpus(nvml: NvmlReader, limits: CheckLimits, sustained: Sustained, now: float, *, source: str,
              gpus: Sequence[int] | None = None) -> GpuScan:
    """Sample `gpus` (None: every enumerated GPU) through `nvml` (an `NvmlReader`: healthd.nvml.Nvml) and check them.

    A GPU the caller names that NVML does not enumerate is missing; an NVML call that hangs
    or fails is itself a finding (for that GPU, or for the node when the count fails).
    """
    from clusterctl.healthd.nvml import NvmlError, NvmlHang

    findings: list[Finding] = []
    try:
        count = nvml.count()
    except NvmlHang as exc:
        return GpuScan((Finding("nvml-hang", source, now, value=exc.function, detail=str(exc)),))
    except NvmlError as exc:
        return GpuScan((Finding("nvml-error", source, now, detail=f"NVML: {exc}"),))
    findings += check_gpu_count(count, limits, now)
    for index in (gpus if gpus is not None else range(count)):  # also GPUs lost before we started
        if index >= count:
            findings.append(Finding("gpu-missing", source, now, gpu=index,
                                    detail=f"the job's GPU {index} is not enumerated"))
            continue
        try:
            findings += check_gpu(nvml.sample(index), limits, sustained, now)
        except NvmlHang as exc:
            findings.append(Finding("nvml-hang", source, now, gpu=index, value=exc.function, detail=str(exc)))
        except NvmlError as exc:
            findings.append(Finding("nvml-error", source, now, gpu=index, detail=f"NVML: {exc}"))
    return GpuScan(tuple(findings), count)
