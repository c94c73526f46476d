"""The one drain door: every drain clusterctl makes is decided by `decide` (pure) and made by `apply`.

Three drainers use it: healthd's daemon (its applier), healthd's prolog, epilog and
HealthCheckProgram (`prolog/run.py`, `epilog/run.py`, `healthd/healthcheck.py`; all through `healthd/drain_requests.py`), and a job's
straggler verdicts (`launcher/shared/straggler_actions.py`, through `SlurmDrains`).  Each drains as
an *owner* (`slurm/drain_owners.py`: `healthd:` for hardware faults, `clusterctl straggler:` for
straggler verdicts) with the rules of its owner (`DrainRules`).  A drain request carries its reason
as an object (`records/drain_reason.DrainReason`, typed here by the `Reason` Protocol: the Slurm door
imports no record): the door reads the owner from it, and renders it to text only for Slurm (and the
breaker's ledger, which records it).

The rules, in order (`decide`):
1. A node name that is not one (`names.is_node_name`: `-x`, `a,b`, `n[1-2]`) is refused before it
   reaches any argv (`bad-node-name`).
2. A drain writes its owner's reason only (`not-owners-reason`, read from the reason's owner): a straggler verdict cannot write
   healthd's prefix, nor healthd the straggler's.
3. Resume only the owner's own drain (`not-ours`): healthd never resumes a straggler drain, and
   nobody resumes an admin's.
4. Never drain over another drain (`kept-other-drain`): an admin's reason, another tool's or
   another owner's is never relabelled.  A node Slurm took down is left alone too, except by
   owners whose rules say `over_down` (healthd, so a GPU fault found during a slurmd outage is
   still on the node when it comes back).  The owner's own drain is not made twice
   (`already-drained`).
5. Never past the owner's share cap of the partition (`breaker-open`): `(held + 1) / nodes >
   max_share` refuses, where `held` counts **only this owner's drains** in the partition.  So a
   straggler drain neither takes a slot of healthd's breaker nor counts as a healthd fault, and
   healthd's faults do not use up the stragglers' share.  Rules with `at_least_one` may always
   hold one node of a partition of two or more (so one slow node of a small partition can go).
6. `dry_run`: decided, nothing called (`dry-run`).

`apply` is the effect: read the node (unless the caller just did), take the owner's share from
its counter (healthd's breaker: its shared ledger or Slurm's count; the straggler verdicts:
Slurm's count of `clusterctl straggler:` drains, `SlurmShareCounter`), decide, make the one
Slurm call decided, and tell the counter whether the drain was made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeVar

from clusterctl.slurm.commands import Runner, subprocess_runner
from clusterctl.slurm.drain_owners import STRAGGLER, DrainOwner
from clusterctl.slurm.names import node_name_problem
from clusterctl.slurm.nodes import NodeState, PartitionShare, SlurmNode

STRAGGLER_MAX_SHARE = 0.1
"""The most of a partition straggler verdicts may hold drained (at least one node of a partition of two
or more): a buggy straggler watch, or one fooled by a slow shared filesystem, cannot empty a partition."""


@dataclass(frozen=True)
class DrainRules:
    """How one owner drains."""

    owner: DrainOwner
    max_share: float
    """The most of a partition this owner may hold drained (1 or more: no cap)."""
    partition: str = ""
    """The partition whose share is counted ("": the node's first)."""
    dry_run: bool = False
    at_least_one: bool = False
    """One node of a partition of two or more may always be held, whatever `max_share` says."""
    over_down: bool = False
    """Drain a node Slurm took down (not drained by anyone): its reason becomes this owner's."""


STRAGGLER_RULES = DrainRules(STRAGGLER, STRAGGLER_MAX_SHARE, at_least_one=True)
"""A job's straggler verdicts: their own prefix, their own share of the node's first partition."""


class Reason(Protocol):
    """What the door needs of a drain reason (`records/drain_reason.DrainReason` is one): who writes it,
    and its text for Slurm's reason field."""

    @property
    def owner(self) -> DrainOwner: ...

    def render(self) -> str: ...


DrainCall = Literal["drain", "resume"]
"""The one Slurm call a verdict makes."""

DrainResult = Literal["drained", "resumed", "already-drained", "kept-other-drain", "not-ours", "breaker-open",
                      "dry-run", "bad-node-name", "not-owners-reason"]
"""What the door decided (`decide`), as every drainer logs and journals it."""


@dataclass(frozen=True)
class DrainRequest:
    """Drain `node` for `reason` (its owner's), or resume it (no reason: the door lifts only its owner's drain).

    A drain without a reason (one no owner could be read from) is refused as not the owner's."""

    node: str
    op: DrainCall
    reason: Reason | None = None

    @property
    def text(self) -> str:
        """The reason as Slurm is given it ("" without one)."""
        return self.reason.render() if self.reason is not None else ""


@dataclass(frozen=True)
class DrainVerdict:
    """What the door decided, and the one Slurm call to make (None: nothing)."""

    result: DrainResult
    call: DrainCall | None = None
    detail: str = ""
    """Why not, in one line (the share cap's count, the bad name)."""


def cap_partition(rules: DrainRules, request: DrainRequest, node: NodeState) -> str | None:
    """The partition whose share must be counted before this request (None: no need to count)."""
    if request.op != "drain" or node.draining or rules.max_share >= 1:
        return None
    return rules.partition or (node.partitions[0] if node.partitions else "") or None


def decide(rules: DrainRules, request: DrainRequest, node: NodeState, share: PartitionShare | None) -> DrainVerdict:
    """The door's decision for `request` on `node` as Slurm shows it now; `share`: the partition named by
    `cap_partition`, counting only `rules.owner`'s drains (None: not counted, no cap applied)."""
    problem = node_name_problem(request.node)
    if problem is not None:
        return DrainVerdict("bad-node-name", None, problem)
    owner = rules.owner
    if request.op == "resume":
        if not node.drained_by(owner):
            return DrainVerdict("not-ours")
        return DrainVerdict("dry-run") if rules.dry_run else DrainVerdict("resumed", "resume")
    if request.reason is None or request.reason.owner != owner:
        return DrainVerdict("not-owners-reason", None, f"{request.text[:80]!r} is not a reason of {owner.label}")
    if node.draining and not node.drained_by(owner):
        return DrainVerdict("kept-other-drain")  # never relabel an admin's, another tool's or another owner's drain
    if node.draining:
        return DrainVerdict("already-drained")
    if node.down and not rules.over_down:
        return DrainVerdict("kept-other-drain", None, f"{node.name} is {node.state} ({node.reason or 'no reason'})")
    partition = cap_partition(rules, request, node)
    if partition and share is not None and share.nodes:
        # This node is not drained (checked above): every drained one counted is another node.
        held = share.drained_by_us
        over = (held + 1) / share.nodes > rules.max_share
        if over and not (rules.at_least_one and held == 0 and share.nodes > 1):
            return DrainVerdict("breaker-open", None,
                                f"{held} of {share.nodes} nodes in {partition} already drained by {owner.label}; "
                                f"draining {request.node} would exceed {rules.max_share:.0%}")
    return DrainVerdict("dry-run") if rules.dry_run else DrainVerdict("drained", "drain")


# ---- the effect -------------------------------------------------------------------------------

class NodeDoor(Protocol):
    """One node's Slurm calls the door makes (part of `nodes.NodeSlurm`: `SlurmNode`, or tests/fakes.py's fake)."""

    def state(self) -> NodeState: ...

    def drain(self, reason: str) -> None: ...

    def resume(self) -> None: ...


class CountingNodeDoor(NodeDoor, Protocol):
    """A node door that can also count an owner's drains in a partition through Slurm (`SlurmNode`)."""

    def partition_share(self, partition: str, owner: DrainOwner = ...) -> PartitionShare: ...


class CountedShare(Protocol):
    """A counter's answer: the share to judge by (None: not counted)."""

    @property
    def share(self) -> PartitionShare | None: ...


Taken = TypeVar("Taken", bound=CountedShare)


class ShareCounter(Protocol[Taken]):
    """How an owner counts its share before a drain, and settles the count after it (healthd's Breaker)."""

    def share_before_drain(self, partition: str | None, reason: str, *, would_drain: bool,
                           partition_size: int | None = None) -> Taken: ...

    def after_drain(self, taken: Taken, drained: bool) -> None: ...


@dataclass(frozen=True)
class DrainApplied:
    """What `apply` did: its verdict, the node as read before, and as the call left it (None: never read)."""

    verdict: DrainVerdict
    node: NodeState | None
    after: NodeState | None

    def describe(self) -> str:
        """One line for a log or a journal."""
        verdict, node = self.verdict, self.node
        reason = node.reason if node is not None else ""
        return {
            "drained": f"drained: {self.after.reason if self.after else ''}",
            "already-drained": f"already drained ({reason})",
            "kept-other-drain": f"not drained: kept another drain ({verdict.detail or reason})",
            "breaker-open": f"not drained: share cap reached ({verdict.detail})",
            "resumed": "resumed",
        }.get(verdict.result, f"not drained: {verdict.result}{': ' + verdict.detail if verdict.detail else ''}")


def apply(door: NodeDoor, rules: DrainRules, request: DrainRequest, counter: ShareCounter[Taken], *,
          node: NodeState | None = None, partition_size: int | None = None) -> DrainApplied:
    """Read the node (unless `node` was just read), count the owner's share, decide, make the decided call.

    `door` is `request.node`'s.  A slot the counter took for a drain that was not made is given
    back (`after_drain`).  Raises SlurmCommandError when Slurm cannot be asked or refuses the call.
    """
    problem = node_name_problem(request.node)
    if problem is not None:  # before any argv
        return DrainApplied(DrainVerdict("bad-node-name", None, problem), None, None)
    if node is None:
        node = door.state()
    partition = cap_partition(rules, request, node)
    would_drain = decide(rules, request, node, None).call == "drain"
    text = request.text  # rendered once: what Slurm is given, and what the counter's ledger records
    taken = counter.share_before_drain(partition, text, would_drain=would_drain, partition_size=partition_size)
    verdict = decide(rules, request, node, taken.share)
    after = node
    drained = False
    try:
        if verdict.call == "drain":
            door.drain(text)
            drained = True
            after = replace(node, flags=(*node.flags, "DRAIN"), reason=text)
    finally:
        counter.after_drain(taken, drained)
    if verdict.call == "resume":
        door.resume()
        after = replace(node, flags=tuple(f for f in node.flags if f != "DRAIN"), reason="",
                        state="idle" if node.state in ("drained", "drain") else node.state)
    return DrainApplied(verdict, node, after)


@dataclass(frozen=True)
class SlurmCount:
    """Slurm's count of one owner's drains in a partition."""

    share: PartitionShare | None


class SlurmShareCounter:
    """An owner's share counted through Slurm (one grouped `sinfo` of the partition); nothing to settle.

    Two drainers counting at the same moment may both see room for one more node: the cap can be
    passed by the number of drains racing (straggler verdicts are rare, one per node per job)."""

    def __init__(self, slurm: CountingNodeDoor, owner: DrainOwner) -> None:
        self.slurm, self.owner = slurm, owner

    def share_before_drain(self, partition: str | None, reason: str, *, would_drain: bool,
                           partition_size: int | None = None) -> SlurmCount:
        if partition is None or not would_drain:
            return SlurmCount(None)
        return SlurmCount(self.slurm.partition_share(partition, self.owner))

    def after_drain(self, taken: SlurmCount, drained: bool) -> None:
        return None


class SlurmDrains:
    """The door for a drainer of many nodes (a job's straggler verdicts): `drain(node, reason)` through
    `apply` with `rules` and the owner's share counted by Slurm."""

    def __init__(self, rules: DrainRules = STRAGGLER_RULES, runner: Runner = subprocess_runner, timeout: float = 10.0,
                 *, node_door: Callable[[str], CountingNodeDoor] | None = None) -> None:
        self.rules = rules
        self.node_door: Callable[[str], CountingNodeDoor] = node_door or (lambda name: SlurmNode(name, runner, timeout))

    def drain(self, node: str, reason: Reason) -> DrainApplied:
        """Drain `node` with `reason` (it must be this owner's) if the rules allow.

        Raises SlurmCommandError when Slurm cannot be asked or refuses (e.g. the user is not an operator)."""
        request = DrainRequest(node, "drain", reason)
        problem = node_name_problem(node)
        if problem is not None:  # before a SlurmNode (and its argv) exists
            return DrainApplied(DrainVerdict("bad-node-name", None, problem), None, None)
        slurm = self.node_door(node)
        return apply(slurm, self.rules, request, SlurmShareCounter(slurm, self.rules.owner))
