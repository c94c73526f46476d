"""Periodic checks: turn a sample of a GPU or of the host into findings (pure functions).

Conditions that matter only when they last (temperature, clock slowdowns) are judged
through `Sustained`, which remembers since when each one has been true.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from clusterctl.healthd.findings import Finding, FindingKind

# NVML clock event reasons (nvmlClocksEventReason*): hardware slowdowns worth a warning.
# A software power cap (0x4) is a site's own setting and never a fault.
CLOCK_EVENT_HW_SLOWDOWN = 0x8
CLOCK_EVENT_SW_THERMAL = 0x20
CLOCK_EVENT_HW_THERMAL = 0x40
CLOCK_EVENT_HW_POWER_BRAKE = 0x80
CLOCK_EVENTS_WORTH_A_LOOK = (CLOCK_EVENT_HW_SLOWDOWN | CLOCK_EVENT_SW_THERMAL | CLOCK_EVENT_HW_THERMAL
                             | CLOCK_EVENT_HW_POWER_BRAKE)


@dataclass(frozen=True)
class GpuSample:
    """One read of a GPU's health counters through NVML."""

    index: int
    uuid: str = ""
    lost: bool = False
    ecc_volatile_dbe: int = 0
    ecc_volatile_sbe: int = 0
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired_pages_sbe: int = 0
    retired_pages_dbe: int = 0
    retired_pending: bool = False
    temperature_c: int | None = None
    clock_event_reasons: int = 0
    nvlink_down: tuple[int, ...] = ()
    recovery_action: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None


@dataclass(frozen=True)
class HostSample:
    """Host resources through psutil."""

    memory_available_fraction: float = 1.0
    disk_free_fraction: dict[str, float] = field(default_factory=dict)
    readonly_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckLimits:
    """Thresholds of the periodic checks (from clusterctl.healthd.toml [checks])."""

    expected_gpus: int = 8
    uncorrectable_remap_limit: int = 512
    retired_pages_limit: int = 63
    temperature_warn_c: int = 87
    temperature_sustain_s: float = 300
    clock_events_sustain_s: float = 300
    memory_min_available: float = 0.02
    disk_min_free: float = 0.02


class Sustained:
    """Remembers since when each condition has been true; forgets it as soon as it is not."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}

    def duration(self, key: str, active: bool, now: float) -> float | None:
        """Seconds the condition has held (None if it does not hold now)."""
        if not active:
            self.since.pop(key, None)
            return None
        return now - self.since.setdefault(key, now)


def check_gpu(sample: GpuSample, limits: CheckLimits, sustained: Sustained, now: float) -> list[Finding]:
    """Findings for one GPU sample."""
    def finding(kind: FindingKind, value: object = None, detail: str = "") -> Finding:
        return Finding(kind, "periodic", now, gpu=sample.index, uuid=sample.uuid, value=value, detail=detail)  # type: ignore[arg-type]

    if sample.lost:
        return [finding("gpu-lost", detail="NVML_ERROR_GPU_IS_LOST")]
    out = []
    if sample.ecc_volatile_dbe > 0:
        out.append(finding("ecc-dbe", sample.ecc_volatile_dbe, f"{sample.ecc_volatile_dbe} volatile DBE"))
    if sample.remap_failure:
        out.append(finding("remap-failure", 1, "row remapping failure"))
    elif sample.remap_uncorrectable >= limits.uncorrectable_remap_limit:
        out.append(finding("remap-uncorrectable", sample.remap_uncorrectable))
    elif sample.remap_pending:
        out.append(finding("remap-pending", 1, f"{sample.remap_uncorrectable} uncorrectable rows remapped"))
    retired = sample.retired_pages_sbe + sample.retired_pages_dbe
    if retired >= limits.retired_pages_limit:
        out.append(finding("retired-pages", retired))
    elif sample.retired_pending:
        out.append(finding("retired-pending", retired))
    if sample.nvlink_down:
        out.append(finding("nvlink-down", ",".join(map(str, sample.nvlink_down)),
                           f"links {','.join(map(str, sample.nvlink_down))} inactive"))
    if sample.recovery_action:
        out.append(finding("recovery-action", sample.recovery_action))
    if sample.temperature_c is not None:
        hot = sample.temperature_c >= limits.temperature_warn_c
        held = sustained.duration(f"thermal:{sample.index}", hot, now)
        if held is not None and held >= limits.temperature_sustain_s:
            out.append(finding("thermal-sustained", sample.temperature_c, f"{sample.temperature_c} C for {held:.0f} s"))
        elif held is not None and held > 0:
            out.append(finding("thermal", sample.temperature_c, f"{sample.temperature_c} C"))
    slow = sample.clock_event_reasons & CLOCK_EVENTS_WORTH_A_LOOK
    held = sustained.duration(f"clocks:{sample.index}", bool(slow), now)
    if held is not None and held >= limits.clock_events_sustain_s:
        out.append(finding("clock-events", hex(slow), f"clock event reasons {hex(slow)} for {held:.0f} s"))
    return out


def check_gpu_count(count: int, limits: CheckLimits, now: float) -> list[Finding]:
    """A node that enumerates fewer GPUs than it should has lost one."""
    if count < limits.expected_gpus:
        return [Finding("gpu-missing", "periodic", now, value=count,
                        detail=f"{count} of {limits.expected_gpus} GPUs visible")]
    return []


def check_host(sample: HostSample, limits: CheckLimits, now: float, drain_paths: Collection[str] = ()) -> list[Finding]:
    """Findings about host memory, free space and read-only mounts.

    A full path is "host-disk" (a warning): users fill /tmp and the like in ordinary work,
    and a node must not leave service because of it.  Only a path the site opted in to
    (`drain_paths`, healthd.toml `disk_drain_paths`) is "host-disk-full", which drains.
    """
    out = []
    if sample.memory_available_fraction < limits.memory_min_available:
        out.append(Finding("host-memory", "host", now, value=round(sample.memory_available_fraction, 4)))
    for path, free in sorted(sample.disk_free_fraction.items()):
        if free < limits.disk_min_free:
            kind: FindingKind = "host-disk-full" if path in drain_paths else "host-disk"
            out.append(Finding(kind, "host", now, value=path, detail=f"{path} {free:.1%} free"))
    for path in sample.readonly_paths:
        out.append(Finding("host-readonly", "host", now, value=path, detail=f"{path} is read-only"))
    return out
