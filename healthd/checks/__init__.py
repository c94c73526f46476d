"""healthd's health checks: one module per family, each declaring the finding kinds it produces, its
[checks] limits (with their defaults and ranges: healthd/config.py reads them from here), its policy
rows (healthd/policy.py gathers them) and its judgement (pure: a sample in, findings out).

What each family reads is sampled in one place: GPUs through healthd/nvml.py (`GpuSample`), the host
through healthd/sampler.py (`HostSample`); the network family reads its sysfs tree itself
(`network.read_nics`) and the storage family runs its own probe (`storage.StorageProbe`), both from
healthd/periodic.py.

A new family is a new module here and its line in `FAMILIES` (its limits also join `CheckLimits`).
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.healthd.checks import (
    clocks, diagnostic, ecc, gpu_count, host, network, nvlink, nvml_calls, pcie, recovery, remap, storage, thermal,
    xid,
)
from clusterctl.healthd.checks.clocks import (
    CLOCK_EVENT_HW_POWER_BRAKE, CLOCK_EVENT_HW_SLOWDOWN, CLOCK_EVENT_HW_THERMAL, CLOCK_EVENT_SW_THERMAL,
    CLOCK_EVENTS_WORTH_A_LOOK,
)
from clusterctl.healthd.checks.family import CheckFamily, Condition
from clusterctl.healthd.checks.gpu_count import check_gpu_count, check_lost
from clusterctl.healthd.checks.host import HostSample, check_host
from clusterctl.healthd.checks.sustained import Sustained
from clusterctl.healthd.findings import Finding
from clusterctl.healthd.gpu_sample import GpuSample

__all__ = [
    "CLOCK_EVENTS_WORTH_A_LOOK", "CLOCK_EVENT_HW_POWER_BRAKE", "CLOCK_EVENT_HW_SLOWDOWN", "CLOCK_EVENT_HW_THERMAL",
    "CLOCK_EVENT_SW_THERMAL", "FAMILIES", "CheckFamily", "CheckLimits", "Condition", "GpuSample", "HostSample",
    "Sustained", "check_gpu", "check_gpu_count", "check_host",
]

FAMILIES: tuple[CheckFamily, ...] = (
    xid.FAMILY, gpu_count.FAMILY, ecc.FAMILY, remap.FAMILY, nvlink.FAMILY, recovery.FAMILY, thermal.FAMILY,
    clocks.FAMILY, nvml_calls.FAMILY, host.FAMILY, pcie.FAMILY, network.FAMILY, storage.FAMILY, diagnostic.FAMILY,
)
"""Every family; a GPU sample is judged by theirs in this order (the order of its findings)."""


# A dataclass takes its bases' fields last base first: [checks] keys keep the order they have always had.
@dataclass(frozen=True)
class CheckLimits(storage.StorageLimits, network.NetworkLimits, pcie.PcieLimits, nvlink.NvlinkLimits,
                  host.HostLimits, clocks.ClockLimits, thermal.ThermalLimits, remap.RemapLimits,
                  gpu_count.GpuCountLimits):
    """Thresholds of the periodic checks (from clusterctl.healthd.toml [checks]): every family's own limits."""


def check_gpu(sample: GpuSample, limits: CheckLimits, sustained: Sustained, now: float) -> list[Finding]:
    """Findings for one GPU sample (a lost GPU answers nothing else)."""
    if sample.lost:
        return check_lost(sample, now)
    return [finding for family in FAMILIES if family.check_gpu is not None
            for finding in family.check_gpu(sample, limits, sustained, now)]
