"""Clock event reasons: hardware slowdowns that last."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterctl.healthd.checks.family import CheckFamily, Condition, gpu_finding, limit
from clusterctl.healthd.findings import Action, Finding

if TYPE_CHECKING:
    from clusterctl.healthd.checks.sustained import Sustained
    from clusterctl.healthd.gpu_sample import GpuSample

# NVML clock event reasons (nvmlClocksEventReason*): hardware slowdowns worth a warning.
# A software power cap (0x4) is a site's own setting and never a fault.
CLOCK_EVENT_HW_SLOWDOWN = 0x8
CLOCK_EVENT_SW_THERMAL = 0x20
CLOCK_EVENT_HW_THERMAL = 0x40
CLOCK_EVENT_HW_POWER_BRAKE = 0x80
CLOCK_EVENTS_WORTH_A_LOOK = (CLOCK_EVENT_HW_SLOWDOWN | CLOCK_EVENT_SW_THERMAL | CLOCK_EVENT_HW_THERMAL
                             | CLOCK_EVENT_HW_POWER_BRAKE)


@dataclass(frozen=True)
class ClockLimits:
    """[checks] limits of this family."""

    clock_events_sustain_s: float = limit(300, 0.0, 86400.0)


def check(sample: GpuSample, limits: ClockLimits, sustained: Sustained, now: float) -> list[Finding]:
    """"clock-events" once a hardware slowdown held `clock_events_sustain_s`."""
    slow = sample.clock_event_reasons & CLOCK_EVENTS_WORTH_A_LOOK
    held = sustained.duration(f"clocks:{sample.index}", bool(slow), now)
    if held is not None and held >= limits.clock_events_sustain_s:
        return [gpu_finding(sample, now, "clock-events", hex(slow), f"clock event reasons {hex(slow)} for {held:.0f} s")]
    return []


FAMILY = CheckFamily("clocks", ("clock-events",), (
    Condition("clock-events", Action.WARN, "hardware slowdown / thermal / power-brake clock events, sustained"),
), check)
