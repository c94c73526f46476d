"""What healthd observes (findings) and what it decides about them (verdicts). Pure data."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Action(enum.IntEnum):
    """What a finding calls for, in increasing severity (comparisons pick the worst)."""

    IGNORE = 0
    APP_FAULT = 1  # the job's own fault: record against the job, keep the node
    WARN = 2
    RESET_AT_IDLE = 3  # healthy enough to run, reset the GPU when the node is idle
    DRAIN_RESET = 4
    DRAIN_REBOOT = 5
    DRAIN_RMA = 6  # hardware must be replaced: never resumed automatically

    @property
    def drains(self) -> bool:
        return self >= Action.DRAIN_RESET

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


@dataclass(frozen=True)
class Finding:
    """One observation about a GPU or the host.

    `kind` is what was seen: "xid", "gpu-lost", "ecc-dbe", "remap-failure", "remap-pending",
    "remap-uncorrectable", "retired-pages", "retired-pending", "gpu-missing", "nvlink-down",
    "thermal", "clock-events", "recovery-action", "nvml-hang", "nvml-error", "host-memory",
    "host-disk", "host-readonly".
    """

    kind: str
    source: str  # "nvml-event", "kmsg", "periodic", "host"
    at: float
    gpu: int | None = None
    uuid: str = ""
    xid: int | None = None
    value: float | int | str | None = None
    detail: str = ""
    job_ids: tuple[str, ...] = field(default=())

    @property
    def what(self) -> str:
        """Short human label: "xid 79", "ecc-dbe", ..."""
        return f"xid {self.xid}" if self.kind == "xid" and self.xid is not None else self.kind


@dataclass(frozen=True)
class Verdict:
    """The policy's answer for a finding: the action and a reason an admin can act on."""

    action: Action
    reason: str
    rule: str  # which row of the policy decided, for `healthd status` and audits
