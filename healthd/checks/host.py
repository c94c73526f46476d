"""The host: available memory, free space and read-only mounts (sampled through psutil by healthd/sampler.py)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from clusterctl.healthd.checks.family import CheckFamily, Condition, limit
from clusterctl.healthd.findings import Action, Finding, FindingKind


@dataclass(frozen=True)
class HostSample:
    """Host resources through psutil."""

    memory_available_fraction: float = 1.0
    disk_free_fraction: dict[str, float] = field(default_factory=dict)
    readonly_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostLimits:
    """[checks] limits of this family."""

    memory_min_available: float = limit(0.02, 0.0, 1.0)
    disk_min_free: float = limit(0.02, 0.0, 1.0)


def check_host(sample: HostSample, limits: HostLimits, now: float, drain_paths: Collection[str] = ()) -> list[Finding]:
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


FAMILY = CheckFamily("host", ("host-memory", "host-disk", "host-disk-full", "host-readonly"), (
    Condition("host-memory", Action.WARN, "host memory nearly exhausted"),
    Condition("host-disk", Action.WARN, "a path is (nearly) full; users can fill it: warn only (see disk_drain_paths)"),
    Condition("host-disk-full", Action.DRAIN_RESET,
              "a path the site opted in to drain for (disk_drain_paths) is (nearly) full"),
    Condition("host-readonly", Action.DRAIN_REBOOT, "a configured path is mounted read-only"),
))
