"""What healthd observes (findings) and what it decides about them (verdicts). Pure data."""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterctl.records.actions import Action

__all__ = ["Action", "Finding", "Verdict"]


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
    """The job that owned this GPU when it happened (one id), "unknown", or empty: not asked."""
    users: tuple[str, ...] = field(default=())
    """The uid of that job's user, when known (same length as `job_ids`)."""

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
