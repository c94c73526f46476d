"""NVLink links that are inactive."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clusterctl.healthd.checks.family import CheckFamily, Condition, gpu_finding
from clusterctl.healthd.findings import Action, Finding

if TYPE_CHECKING:
    from clusterctl.healthd.checks.sustained import Sustained
    from clusterctl.healthd.gpu_sample import GpuSample


def check(sample: GpuSample, limits: Any, sustained: Sustained, now: float) -> list[Finding]:
    """Any inactive link drains: the job's collectives would crawl over the fallback path."""
    if sample.nvlink_down:
        links = ",".join(map(str, sample.nvlink_down))
        return [gpu_finding(sample, now, "nvlink-down", links, f"links {links} inactive")]
    return []


FAMILY = CheckFamily("nvlink", ("nvlink-down",), (
    Condition("nvlink-down", Action.DRAIN_RESET, "an NVLink link is inactive"),
), check)
