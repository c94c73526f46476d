"""The partition's drained share the breaker judges a drain by: from the shared ledger when
`breaker_dir` is set (no whole-table read), else from one grouped `sinfo` of the partition.

Used the same way by the daemon and the hooks: `share_before_drain` before the drain door decides (drains.apply),
then `after_drain` with whether the drain was made, so a slot claimed for a drain that did not
happen (another drain got there first, dry run, Slurm unreachable) is given back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import ClusterctlError
from clusterctl.healthd.breaker_ledger import LEDGER_ERRORS, BreakerLedger, Claim, breaker_cap
from clusterctl.slurm.nodes import NodeSlurm, NodeState, PartitionShare

log = logging.getLogger("healthd")


@dataclass(frozen=True)
class DrainShare:
    """The share to judge by, and the ledger slot claimed for this drain (None: no ledger in use)."""

    share: PartitionShare | None
    partition: str | None
    claim: Claim | None = None


class Breaker:
    """The breaker's reads for one node: the ledger under `breaker_dir` first, Slurm's count as fallback."""

    def __init__(self, slurm: NodeSlurm, node: str, breaker_dir: Path | None, max_share: float, *,
                 now: Callable[[], float] = time.time) -> None:
        self.slurm, self.max_share = slurm, max_share
        self.ledger = BreakerLedger(breaker_dir, node, now=now) if breaker_dir is not None else None

    def share_before_drain(self, partition: str | None, reason: str, *, would_drain: bool,
                           partition_size: int | None = None) -> DrainShare:
        """The drained share of `partition` (None: the breaker does not count this action).

        With a ledger and `would_drain` (the drain is wanted whatever the share), a slot is
        claimed now: granted, the share counts the other holders only (the drain fits); refused,
        every slot is taken (the engine refuses).  An unusable ledger is logged and Slurm is asked.
        """
        if partition is None:
            return DrainShare(None, None)
        if self.ledger is not None and would_drain:
            try:
                size = partition_size if partition_size is not None else self.slurm.partition_size(partition)
                claim = self.ledger.claim(partition, breaker_cap(size, self.max_share), reason)
                return DrainShare(PartitionShare(partition, size, claim.held_by_others), partition, claim)
            except LEDGER_ERRORS as exc:
                log.error("breaker ledger unusable, counting the partition through Slurm instead: %s", exc)
        return DrainShare(self.slurm.partition_share(partition), partition)

    def after_drain(self, taken: DrainShare, drained: bool) -> None:
        """Give back a slot claimed for a drain that was not made."""
        if drained or taken.claim is None or not taken.claim.new or taken.partition is None:
            return
        self.release(taken.partition)

    def release(self, partition: str | None) -> None:
        """Give back this node's slot of `partition`, if it holds one (its node is back in service)."""
        if self.ledger is None or partition is None:
            return
        try:
            given = self.ledger.release(partition)
        except LEDGER_ERRORS as exc:
            log.error("breaker ledger: could not give back this node's slot: %s", exc)
            return
        if given is not None:
            log.info("breaker ledger: gave back %s of %s (held since %s for %s)", given.name, partition,
                     time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(given.at)), given.reason)

    def reconcile(self, node: NodeState, partition: str | None) -> None:
        """After reading `node`: the ledger agrees with Slurm.  Not drained by healthd any more
        (resumed, or an admin's drain now) → its slot goes back; drained by healthd without a
        slot (drained before breaker_dir was set, or the drain's answer was lost) → it takes one,
        so the others count it.  One lookup when nothing is to be done."""
        if self.ledger is None or partition is None:
            return
        try:
            holds = self.ledger.holds(partition)
            if holds and not node.drained_by_us:
                self.release(partition)
            elif not holds and node.drained_by_us:
                size = self.slurm.partition_size(partition)
                claim = self.ledger.claim(partition, breaker_cap(size, self.max_share), node.reason)
                if not claim.granted:
                    log.warning("breaker ledger: %s is drained by healthd but every slot of %s is held "
                                "(%d): it is over the cap", node.name, partition, claim.held_by_others)
        except (ClusterctlError, OSError) as exc:  # the ledger's errors and Slurm's
            log.error("breaker ledger unusable: %s", exc)


def node_partition(configured: str, node: NodeState | None) -> str | None:
    """The partition the breaker counts for this node (the configured one, else its first)."""
    if configured:
        return configured
    if node is not None and node.partitions:
        return node.partitions[0]
    return None
