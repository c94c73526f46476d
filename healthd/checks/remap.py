"""Memory the GPU repaired: remapped rows (row remapping) and retired pages (older GPUs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterctl.healthd.checks.family import CheckFamily, Condition, gpu_finding, limit
from clusterctl.healthd.findings import Action, Finding

if TYPE_CHECKING:
    from clusterctl.healthd.checks.sustained import Sustained
    from clusterctl.healthd.gpu_sample import GpuSample


@dataclass(frozen=True)
class RemapLimits:
    """[checks] limits of this family."""

    uncorrectable_remap_limit: int = limit(512, 0, 1_000_000)
    retired_pages_limit: int = limit(63, 0, 1_000_000)


def check(sample: GpuSample, limits: RemapLimits, sustained: Sustained, now: float) -> list[Finding]:
    """A failed remap or too many repairs: replace the GPU; a pending one: reset it when idle."""
    out = []
    if sample.remap_failure:
        out.append(gpu_finding(sample, now, "remap-failure", 1, "row remapping failure"))
    elif sample.remap_uncorrectable >= limits.uncorrectable_remap_limit:
        out.append(gpu_finding(sample, now, "remap-uncorrectable", sample.remap_uncorrectable))
    elif sample.remap_pending:
        out.append(gpu_finding(sample, now, "remap-pending", 1, f"{sample.remap_uncorrectable} uncorrectable rows remapped"))
    retired = sample.retired_pages_sbe + sample.retired_pages_dbe
    if retired >= limits.retired_pages_limit:
        out.append(gpu_finding(sample, now, "retired-pages", retired))
    elif sample.retired_pending:
        out.append(gpu_finding(sample, now, "retired-pending", retired))
    return out


FAMILY = CheckFamily("remap", ("remap-failure", "remap-uncorrectable", "remap-pending", "retired-pages",
                               "retired-pending"), (
    Condition("remap-failure", Action.DRAIN_RMA, "row remapping failure"),
    Condition("remap-uncorrectable", Action.DRAIN_RMA, "uncorrectable remapped rows at the limit (512)"),
    Condition("retired-pages", Action.DRAIN_RMA, "retired pages at the limit (63)"),
    Condition("remap-pending", Action.RESET_AT_IDLE, "row remap pending: reset the GPU when idle"),
    Condition("retired-pending", Action.RESET_AT_IDLE, "page retirement pending: reset the GPU when idle"),
), check)
