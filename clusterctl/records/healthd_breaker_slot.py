"""One drain slot of the breaker's shared ledger (`<breaker_dir>/<partition>/slot-<i>`).

Written by the healthd (or hook) that claims the slot just before it drains its node, read by
every other node's healthd (who holds what, since when) and by `healthd breaker`.  The same file
is linked as `node-<node>`, so a node finds its own slot without reading the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clusterctl.records.versioned import check_header, field, header, number_field

KIND = "healthd-breaker-slot"
VERSION = 1


@dataclass(frozen=True)
class BreakerSlot:
    """Node `node` holds slot `slot` of `partition`'s drain slots since `at`, for `reason`."""

    node: str
    partition: str
    slot: int
    reason: str
    at: float  # seconds since the epoch

    @property
    def name(self) -> str:
        """The slot's file name in the partition's directory."""
        return slot_name(self.slot)

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "node": self.node, "partition": self.partition, "slot": self.slot,
                "reason": self.reason, "at": self.at}

    @classmethod
    def from_json(cls, data: object, where: str) -> BreakerSlot:
        """Parse a stored record; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        return cls(field(body, "node", str, where), field(body, "partition", str, where),
                   field(body, "slot", int, where), field(body, "reason", str, where),
                   number_field(body, "at", where))


def slot_name(index: int) -> str:
    """`slot-<index>`: the names whose count is the number of nodes healthd drained in a partition."""
    return f"slot-{index}"


def holder_name(node: str) -> str:
    """`node-<node>`: the second name of the slot `node` holds."""
    return f"node-{node}"
