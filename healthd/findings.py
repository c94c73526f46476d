"""What healthd observes (findings) and what it decides about them (verdicts). Pure data."""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterctl.records.actions import Action
from clusterctl.records.finding_kind import FINDING_KINDS, FindingKind

__all__ = ["FINDING_KINDS", "Action", "Finding", "FindingKind", "Verdict"]


@dataclass(frozen=True)
class Finding:
    """One observation about a GPU or the host.

    `kind` is what was seen, one of the closed vocabulary `FindingKind`
    (clusterctl/records/finding_kind.py): "xid", "gpu-lost", "ecc-dbe", "thermal", ...
    """

    kind: FindingKind
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
