"""Who drained a node, as Slurm's reason field says it: each owner's prefix, and `owner_of` a reason.

The prefix says which owner drained the node: each owner resumes and counts only its own drains,
and a reason with no known prefix is an admin's (or another tool's) and is never overwritten or
resumed.  The rest of a reason (what, which GPU, the action, when) is `records/drain_reason.py`'s.

Straggler drains made before the straggler owner existed read `healthd: straggler ...`; they
are the straggler owner's too (`owner_of`), so healthd neither counts nor resumes them.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def owner_of(reason: str) -> DrainOwner | None:
    """Which owner wrote this reason (None: an admin or another tool, never ours to touch)."""
    if reason.startswith(LEGACY_STRAGGLER_PREFIX):
        return STRAGGLER
    return next((owner for owner in OWNERS if reason.startswith(owner.prefix)), None)
