"""Volatile uncorrectable (double-bit) ECC errors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clusterctl.healthd.checks.family import CheckFamily, Condition, gpu_finding
from clusterctl.healthd.findings import Action, Finding

if TYPE_CHECKING:
    from clusterctl.healthd.checks.sustained import Sustained
    from clusterctl.healthd.gpu_sample import GpuSample


def check(sample: GpuSample, limits: Any, sustained: Sustained, now: float) -> list[Finding]:
    """Any volatile DBE drains: the GPU's memory is corrupt until it is reset."""
    if sample.ecc_volatile_dbe > 0:
        return [gpu_finding(sample, now, "ecc-dbe", sample.ecc_volatile_dbe, f"{sample.ecc_volatile_dbe} volatile DBE")]
    return []


FAMILY = CheckFamily("ecc", ("ecc-dbe",), (
    Condition("ecc-dbe", Action.DRAIN_RESET, "volatile uncorrectable ECC errors"),
), check)
