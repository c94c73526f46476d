"""The Slurm drain reason clusterctl writes (healthd, its hooks, the job's straggler verdicts) and reads back.

Format: `<owner prefix> <what> [gpu<N> | pci <bus>] [(<uuid>)] <action> <UTC time>`, e.g.
`healthd: xid 79 gpu3 (GPU-1a2b) drain-reset 2026-11-22T15:04:05Z` or
`clusterctl straggler: slow-gpus drain-reset 2026-11-22T15:04:05Z`.  The prefix says which owner
drained the node (`owner_of`): each owner resumes and counts only its own drains, and a reason
with no known prefix is an admin's (or another tool's) and is never overwritten or resumed.

Straggler drains made before the straggler owner existed read `healthd: straggler ...`; they
are the straggler owner's too (`owner_of`), so healthd neither counts nor resumes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterctl.clock import parse_utc
from clusterctl.records.actions import Action

REASON_PREFIX = "healthd:"
"""Every drain healthd (or a hook) makes starts with this."""


@dataclass(frozen=True)
class DrainOwner:
    """Who drains a node, as its reason says it: each owner touches only drains with its own prefix."""

    name: str
    prefix: str
    """What every reason of this owner starts with."""
    label: str
    """How messages name this owner's drains ("already drained by <label>")."""


HEALTHD = DrainOwner("healthd", REASON_PREFIX, "healthd")
"""healthd's daemon and its prolog, epilog and HealthCheckProgram: hardware faults."""
STRAGGLER = DrainOwner("straggler", "clusterctl straggler:", "straggler verdicts")
"""A job's straggler watch (its agent or supervisor): a node whose GPUs' own evidence explains its slowness."""
OWNERS = (HEALTHD, STRAGGLER)
LEGACY_STRAGGLER_PREFIX = "healthd: straggler "
"""How straggler drains were spelled before they had an owner of their own (still the straggler owner's)."""

_REASON = re.compile(
    r"^(?P<prefix>healthd:|clusterctl straggler:) (?P<kind>[a-z][a-z0-9-]*)(?: (?P<xid>\d{1,5}))?"
    r"(?: gpu(?P<gpu>\d{1,4})| pci (?P<pci>[0-9A-Fa-f:.]{1,32}))?"
    r"(?: \((?P<uuid>[^()\s]{1,80})\))?"
    r" (?P<action>[a-z-]+) (?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")


@dataclass(frozen=True)
class DrainReason:
    """What healthd drained a node for, as it says it in Slurm's reason field."""

    kind: str  # "xid", "gpu-lost", "ecc-dbe", "host-disk", ...
    action: Action
    at: str  # UTC, `2026-11-22T15:04:05Z`
    xid: int | None = None
    gpu: int | None = None
    pci: str | None = None  # a GPU NVML can no longer name, from the kernel log
    uuid: str = ""
    owner: DrainOwner = HEALTHD

    @property
    def what(self) -> str:
        """`xid 79`, `ecc-dbe`: the finding's short label."""
        return f"{self.kind} {self.xid}" if self.xid is not None else self.kind

    @property
    def at_seconds(self) -> float:
        """The drain time as seconds since the epoch."""
        seconds = parse_utc(self.at)
        assert seconds is not None  # guaranteed by render/parse
        return seconds

    def render(self) -> str:
        """The text given to `scontrol update ... Reason=`."""
        where = f" gpu{self.gpu}" if self.gpu is not None else f" pci {self.pci}" if self.pci else ""
        uuid = f" ({self.uuid})" if self.uuid else ""
        return f"{self.owner.prefix} {self.what}{where}{uuid} {self.action.label} {self.at}"


def owner_of(reason: str) -> DrainOwner | None:
    """Which owner wrote this reason (None: an admin or another tool, never ours to touch)."""
    if reason.startswith(LEGACY_STRAGGLER_PREFIX):
        return STRAGGLER
    return next((owner for owner in OWNERS if reason.startswith(owner.prefix)), None)


def is_ours(reason: str) -> bool:
    """The reason was written by healthd or a clusterctl hook (not a straggler verdict)."""
    return owner_of(reason) is HEALTHD


def parse_drain_reason(reason: str) -> DrainReason | None:
    """A reason clusterctl wrote → its parts and owner; None for anyone else's reason or one we cannot read.

    None is safe for every caller: an unreadable reason is treated as not ours, so it is
    neither resumed nor overwritten automatically.
    """
    match = _REASON.match(reason.strip())
    if match is None or parse_utc(match["at"]) is None:
        return None
    try:
        action = Action.from_label(match["action"])
    except ValueError:
        return None
    return DrainReason(kind=match["kind"], action=action, at=match["at"],
                       xid=int(match["xid"]) if match["xid"] else None,
                       gpu=int(match["gpu"]) if match["gpu"] else None,
                       pci=match["pci"], uuid=match["uuid"] or "", owner=owner_of(reason.strip()) or HEALTHD)
