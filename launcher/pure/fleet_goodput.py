"""A day of one large job's failures, simulated: what each recovery policy keeps of its node-hours (pure).

A seeded discrete-event model of one job of `Fleet.nodes` nodes over `Fleet.window_seconds` (24 h by default),
for the three ways a job can meet a node failure (issue #43):

- RESUBMIT (resubmit-only): every failure ends the attempt; the job waits in the queue, starts again on a new
  allocation of full size and resumes from its last checkpoint.
- SPARES (spares-then-resubmit, clusterctl today): while the allocation holds a spare, the failed node is given
  back and the spare takes its place in the allocation; with no spare left, it resubmits as RESUBMIT, and the
  new allocation comes with a full set of spares.
- SHRINK (shrink+grow, issue #43): spares first, as SPARES; with no spare left, the job drops the whole
  data-parallel replica that held the failed node (its other nodes are given back) and goes on smaller from its
  last checkpoint, in the allocation; it grows the replica back at the first checkpoint after the failed node
  is repaired and a request for the replica's nodes has waited its turn in the queue (`Fleet.grow_wait_seconds`).
  Below `Fleet.min_nodes` it resubmits instead.

What is modelled, and what is assumed (every figure is a parameter; the bench says where each comes from):

- Failures are a Poisson process at rate (working nodes) / node MTBF: a job running smaller fails less often.
  Spares held idle do not fail; no failure happens during a recovery (recoveries are seconds to minutes against
  a job MTBF of hours).  One failure in `working nodes` is the batch host's, which recovers in
  `batch_host_recovery_seconds` (Slurm must declare it DOWN first) by either path.
- Repaired nodes never come back as spares: the failed node is given back to Slurm (drained), as today; only
  a resubmission brings a full set of spares again.  Repair times are lognormal.
- Checkpoints: after every (re)start the job trains `checkpoint_interval_seconds`, then stalls
  `checkpoint_stall_seconds` while the checkpoint is written, and so on; a checkpoint counts once its stall
  is over.  A failure loses everything since the last one that counted (training and any stall under way).
- A resubmission costs `resubmit_seconds` (fault → stepping again with an idle queue) plus `queue_seconds`;
  nodes are held for neither.  A recovery in the allocation (a spare swapped in, a replica dropped, a replica
  grown back) costs `in_allocation_seconds` of the working nodes.  A grow happens at a checkpoint, so it loses
  no work.

Accounting, in node-seconds of the job's nominal size (`nodes` × the window): every node-second is exactly one
of useful (training a checkpoint kept), checkpoint (stalls), lost work (redone after a failure, or not kept yet
when the window ends: at most one interval), restart (recoveries and start-up), queue (waiting for a resubmitted
attempt) or capacity (the nodes of dropped replicas, while they are missing).  Goodput is useful over nominal;
time lost is checkpoint + lost work + restart + queue; capacity lost is what running smaller costs.  Spares
are outside the nominal size: their idle node-hours are counted apart (`spare_node_seconds`), and
`held_goodput` is useful over the node-hours the job actually held (working nodes and spares, while held).

Random numbers come from the `Random` door (`random.Random` fits) and are drawn in the same order by every
policy — per failure its repair time, whether it was the batch host, then the hazard until the next one — so
that the policies compared on one seed meet the same failures (common random numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

RESUBMIT = "resubmit-only"
SPARES = "spares-then-resubmit"
SHRINK = "shrink+grow"
POLICIES = (RESUBMIT, SPARES, SHRINK)


class Random(Protocol):
    """The random source (`random.Random` satisfies it)."""

    def random(self) -> float: ...

    def expovariate(self, lambd: float, /) -> float: ...

    def lognormvariate(self, mu: float, sigma: float, /) -> float: ...


class FleetModelError(ValueError):
    """A parameter out of its range; the message names it."""


@dataclass(frozen=True)
class Fleet:
    """The job, its failures and its recoveries.  Seconds throughout."""

    nodes: int = 12_500
    """The job's nominal size (working nodes at full size)."""
    replica_nodes: int = 20
    """Nodes in one data-parallel replica (tensor parallel inside a node × pipeline stages): what a shrink drops."""
    spares: int = 0
    """Spare nodes held by each allocation (refilled only by a resubmission)."""
    min_nodes: int = 0
    """SHRINK: a failure that would leave fewer working nodes than this resubmits instead."""
    node_mtbf_seconds: float = 1.5 * 3600 * 12_500
    """One node's mean time between failures (the job at 12,500 nodes sees one every 1.5 h by default)."""
    repair_median_seconds: float = 4 * 3600
    """The median of the lognormal repair time."""
    repair_sigma: float = 0.8
    """The lognormal repair time's sigma (of its logarithm)."""
    checkpoint_interval_seconds: float = 116.0
    """Training between two checkpoints."""
    checkpoint_stall_seconds: float = 1.25
    """Training stalls this long per checkpoint."""
    in_allocation_seconds: float = 9.17
    """A recovery inside the allocation: fault → stepping again (a spare swapped, a replica dropped or grown)."""
    batch_host_recovery_seconds: float = 443.7
    """The batch host lost: fault → stepping again, by either path (Slurm declares it DOWN first)."""
    resubmit_seconds: float = 26.5
    """A resubmission, fault → stepping again, with no wait in the queue."""
    queue_seconds: float = 1800.0
    """A resubmitted attempt's wait in the queue."""
    grow_wait_seconds: float | None = None
    """SHRINK: a grow request's wait in the queue (None: `queue_seconds`)."""
    window_seconds: float = 24 * 3600

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.replica_nodes < 1 or self.nodes % self.replica_nodes:
            raise FleetModelError(f"nodes ({self.nodes}) must be a positive multiple of replica_nodes "
                                  f"({self.replica_nodes})")
        if self.spares < 0 or self.min_nodes < 0:
            raise FleetModelError("spares and min_nodes must be at least 0")
        if self.checkpoint_interval_seconds <= 0:
            raise FleetModelError("checkpoint_interval_seconds must be more than 0")
        positive = ("node_mtbf_seconds", "repair_median_seconds", "window_seconds")
        not_negative = ("repair_sigma", "checkpoint_stall_seconds", "in_allocation_seconds",
                        "batch_host_recovery_seconds", "resubmit_seconds", "queue_seconds")
        for name in positive:
            if not getattr(self, name) > 0:
                raise FleetModelError(f"{name} must be more than 0")
        for name in not_negative:
            if not getattr(self, name) >= 0:
                raise FleetModelError(f"{name} must be at least 0")
        if self.grow_wait_seconds is not None and not self.grow_wait_seconds >= 0:
            raise FleetModelError("grow_wait_seconds must be at least 0")

    @property
    def job_mtbf_seconds(self) -> float:
        """The job's mean time between failures at its nominal size."""
        return self.node_mtbf_seconds / self.nodes


@dataclass(frozen=True)
class DayOfFailures:
    """One policy's simulated window: where the nominal node-seconds went.  The six shares sum to 1."""

    policy: str
    goodput: float
    """Useful node-seconds over the nominal ones (nodes × window)."""
    checkpoint_share: float
    lost_work_share: float
    restart_share: float
    queue_share: float
    capacity_share: float
    """The nodes of dropped replicas, while they were missing (SHRINK only)."""
    held_goodput: float
    """Useful node-seconds over the node-seconds the job held (working nodes and spares)."""
    spare_node_seconds: float
    """Node-seconds of spares held idle."""
    failures: int
    swaps: int
    """Failures recovered by a spare in the allocation."""
    shrinks: int
    grows: int
    resubmissions: int

    @property
    def time_lost_share(self) -> float:
        """Checkpoint stalls, lost work, restarts and the queue."""
        return self.checkpoint_share + self.lost_work_share + self.restart_share + self.queue_share


@dataclass
class _Ledger:
    """Node-seconds by cause while one window is simulated (local to `simulate`)."""

    useful: float = 0.0
    checkpoint: float = 0.0
    lost: float = 0.0
    restart: float = 0.0
    queue: float = 0.0
    capacity: float = 0.0
    held: float = 0.0
    spare: float = 0.0


def simulate(fleet: Fleet, policy: str, rng: Random) -> DayOfFailures:
    """One window of `fleet` under `policy` (RESUBMIT, SPARES or SHRINK), its failures drawn from `rng`."""
    if policy not in POLICIES:
        raise FleetModelError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
    n, end = fleet.nodes, fleet.window_seconds
    train, stall = fleet.checkpoint_interval_seconds, fleet.checkpoint_stall_seconds
    cycle = train + stall
    grow_wait = fleet.queue_seconds if fleet.grow_wait_seconds is None else fleet.grow_wait_seconds
    mu = math.log(fleet.repair_median_seconds)
    uses_spares = policy != RESUBMIT
    spares = fleet.spares if uses_spares else 0
    ledger = _Ledger()
    working, t = n, 0.0
    dropped: list[float] = []  # SHRINK: when each dropped replica may be grown back
    hazard = rng.expovariate(1.0)
    failures = swaps = shrinks = grows = resubmissions = 0

    def pause(seconds: float, at_size: int, held: int, cause: str) -> float:
        """`seconds` without training from `t` (clipped to the window): the working nodes' time to `cause`."""
        span = max(0.0, min(seconds, end - t))
        setattr(ledger, cause, getattr(ledger, cause) + at_size * span)
        ledger.capacity += (n - at_size) * span
        ledger.held += held * span
        ledger.spare += (spares if held else 0) * span
        return t + span

    while t < end:
        # A running stretch from a (re)start at t: train, stall, train, stall, ... at `working` nodes.
        fail_at = t + hazard * fleet.node_mtbf_seconds / working
        grow_at = math.inf
        if dropped:
            ready = max(min(dropped), t)
            grow_at = t + math.ceil((ready - t) / cycle) * cycle
        if end <= min(fail_at, grow_at):
            kind, stop = "end", end
        elif grow_at <= fail_at:
            kind, stop = "grow", grow_at
        else:
            kind, stop = "failure", fail_at
        elapsed = stop - t
        cycles, into = divmod(elapsed, cycle)
        if kind == "grow":  # at a checkpoint, just counted
            cycles, into = round(elapsed / cycle), 0.0
        ledger.useful += working * cycles * train
        ledger.checkpoint += working * cycles * stall
        # Since the last checkpoint: redone after a failure; at the window's end not kept yet (so lost too: kept
        # work only grows as the job goes on, and a policy that is ahead is never behind at the end).
        ledger.lost += working * min(into, train)
        if kind == "failure":
            ledger.lost += working * max(into - train, 0.0)
        else:
            ledger.checkpoint += working * max(into - train, 0.0)
        ledger.capacity += (n - working) * elapsed
        ledger.held += (working + spares) * elapsed
        ledger.spare += spares * elapsed
        hazard = max(0.0, hazard - elapsed * working / fleet.node_mtbf_seconds)
        t = stop
        if kind == "end":
            break
        if kind == "grow":
            back = sum(1 for r in dropped if r <= t + 1e-6)  # grow_at was rounded up to a checkpoint
            dropped = [r for r in dropped if r > t + 1e-6]
            working += back * fleet.replica_nodes
            grows += back
            t = pause(fleet.in_allocation_seconds, working, working + spares, "restart")
            continue
        failures += 1
        repair = rng.lognormvariate(mu, fleet.repair_sigma)
        batch_host = rng.random() < 1 / working
        hazard = rng.expovariate(1.0)
        in_allocation = fleet.batch_host_recovery_seconds if batch_host else fleet.in_allocation_seconds
        if uses_spares and spares > 0:
            spares -= 1
            swaps += 1
            t = pause(in_allocation, working, working + spares, "restart")
        elif policy == SHRINK and working - fleet.replica_nodes >= max(fleet.min_nodes, 1):
            working -= fleet.replica_nodes
            shrinks += 1
            dropped.append(t + max(repair, grow_wait))
            t = pause(in_allocation, working, working + spares, "restart")
        else:
            resubmissions += 1
            working, spares, dropped = n, 0, []
            t = pause(max(fleet.resubmit_seconds, in_allocation if batch_host else 0.0), n, 0, "restart")
            t = pause(fleet.queue_seconds, n, 0, "queue")
            spares = fleet.spares if uses_spares else 0
    nominal = n * end
    return DayOfFailures(
        policy=policy, goodput=ledger.useful / nominal, checkpoint_share=ledger.checkpoint / nominal,
        lost_work_share=ledger.lost / nominal, restart_share=ledger.restart / nominal,
        queue_share=ledger.queue / nominal, capacity_share=ledger.capacity / nominal,
        held_goodput=ledger.useful / ledger.held if ledger.held > 0 else 0.0, spare_node_seconds=ledger.spare,
        failures=failures, swaps=swaps, shrinks=shrinks, grows=grows, resubmissions=resubmissions)
