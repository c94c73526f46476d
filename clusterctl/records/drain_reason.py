"""The Slurm drain reason healthd (and the hooks) write and the supervisor and healthd read back.

Format: `healthd: <what> [gpu<N> | pci <bus>] [(<uuid>)] <action> <UTC time>`, e.g.
`healthd: xid 79 gpu3 (GPU-1a2b) drain-reset 2026-11-22T15:04:05Z`.  The prefix is what makes
a drain ours: a reason without it is an admin's and is never overwritten or resumed by us.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterctl.clock import parse_utc
from clusterctl.records.actions import Action

REASON_PREFIX = "healthd:"
"""Every drain healthd (or a hook) makes starts with this; a reason without it is an admin's."""

_REASON = re.compile(
    r"^healthd: (?P<kind>[a-z][a-z0-9-]*)(?: (?P<xid>\d{1,5}))?"
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
        return f"{REASON_PREFIX} {self.what}{where}{uuid} {self.action.label} {self.at}"


def is_ours(reason: str) -> bool:
    """The reason was written by healthd or a clusterctl hook."""
    return reason.startswith(REASON_PREFIX)


def parse_drain_reason(reason: str) -> DrainReason | None:
    """A reason healthd wrote → its parts; None for anyone else's reason or one we cannot read.

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
                       pci=match["pci"], uuid=match["uuid"] or "")
