"""GPU temperature: a warning while hot, a drain when it stays hot for minutes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterctl.healthd.checks.family import CheckFamily, Condition, gpu_finding, limit
from clusterctl.healthd.findings import Action, Finding

if TYPE_CHECKING:
    from clusterctl.healthd.checks.sustained import Sustained
    from clusterctl.healthd.gpu_sample import GpuSample


@dataclass(frozen=True)
class ThermalLimits:
    """[checks] limits of this family."""

    temperature_warn_c: int = limit(87, 1, 200)
    temperature_sustain_s: float = limit(300, 0.0, 86400.0)


def check(sample: GpuSample, limits: ThermalLimits, sustained: Sustained, now: float) -> list[Finding]:
    """"thermal" from the second hot sample on, "thermal-sustained" once it held `temperature_sustain_s`."""
    if sample.temperature_c is None:
        return []
    hot = sample.temperature_c >= limits.temperature_warn_c
    held = sustained.duration(f"thermal:{sample.index}", hot, now)
    if held is not None and held >= limits.temperature_sustain_s:
        return [gpu_finding(sample, now, "thermal-sustained", sample.temperature_c,
                            f"{sample.temperature_c} C for {held:.0f} s")]
    if held is not None and held > 0:
        return [gpu_finding(sample, now, "thermal", sample.temperature_c, f"{sample.temperature_c} C")]
    return []


FAMILY = CheckFamily("thermal", ("thermal", "thermal-sustained"), (
    Condition("thermal", Action.WARN, "temperature high"),
    Condition("thermal-sustained", Action.DRAIN_RESET, "temperature high for minutes"),
), check)
