"""The Slurm drain reason clusterctl writes (healthd, its hooks, the job's straggler verdicts) and reads back.

Format: `<owner prefix> <what> [gpu<N> | pci <bus>] [(<uuid>)] [[<evidence>]] <action> <UTC time>`, e.g.
`healthd: xid 79 gpu3 (GPU-1a2b) drain-reset 2026-11-22T15:04:05Z`,
`healthd: ib-errors [mlx5_0/1 symbol_error 42.0/min > 10/min] drain-reset 2026-11-22T15:04:05Z` or
`clusterctl straggler: slow-gpus drain-reset 2026-11-22T15:04:05Z`.  The prefix says which owner
drained the node (`owner_of`): the owners and their prefixes are the Slurm door's
(`slurm/drain_owners.py`, re-exported here), since the door reads them on every node it is shown;
this module reads and writes the rest of the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterctl.clock import parse_utc
from clusterctl.records.actions import Action
from clusterctl.slurm.drain_owners import (
    HEALTHD, LEGACY_STRAGGLER_PREFIX, OWNERS, REASON_PREFIX, STRAGGLER, DrainOwner, owner_of,
)

__all__ = ["HEALTHD", "LEGACY_STRAGGLER_PREFIX", "MAX_EVIDENCE", "OWNERS", "REASON_PREFIX", "STRAGGLER", "DrainOwner",
           "DrainReason", "as_evidence", "is_ours", "owner_of", "parse_drain_reason"]

_REASON = re.compile(
    r"^(?P<prefix>healthd:|clusterctl straggler:) (?P<kind>[a-z][a-z0-9-]*)(?: (?P<xid>\d{1,5}))?"
    r"(?: gpu(?P<gpu>\d{1,4})| pci (?P<pci>[0-9A-Fa-f:.]{1,32}))?"
    r"(?: \((?P<uuid>[^()\s]{1,80})\))?"
    r"(?: \[(?P<evidence>[^\[\]]{1,160})\])?"
    r" (?P<action>[a-z-]+) (?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")
MAX_EVIDENCE = 160  # the bound of `evidence` in _REASON


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
    evidence: str = ""
    """What an admin acts on, for the checks that say it (`mlx5_0/1 symbol_error 42.0/min > 10/min`): one line,
    without square brackets, at most MAX_EVIDENCE characters (`as_evidence` makes any text so)."""

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
        evidence = f" [{self.evidence}]" if self.evidence else ""
        return f"{self.owner.prefix} {self.what}{where}{uuid}{evidence} {self.action.label} {self.at}"


def as_evidence(text: str) -> str:
    """`text` as a reason's evidence: one line of printable characters, square brackets made round, cut to
    MAX_EVIDENCE characters."""
    printable = "".join(c if c.isprintable() else " " for c in text)
    flat = " ".join(printable.replace("[", "(").replace("]", ")").split())
    return flat if len(flat) <= MAX_EVIDENCE else flat[:MAX_EVIDENCE - 3] + "..."


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
                       pci=match["pci"], uuid=match["uuid"] or "", owner=owner_of(reason.strip()) or HEALTHD,
                       evidence=match["evidence"] or "")
