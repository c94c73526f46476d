"""Where a run's time went, and how often it should checkpoint (pure).

Per attempt (times from Slurm, kept in the journal's `decided` events):
queue wait = start − submit; run = end − start; for an attempt that failed, the work redone
is the time since its last complete checkpoint (or since its start).  Restart overhead is the
gap between one attempt's end and the next one's submission, plus the time each restart inside
an allocation (on a spare, `recovered-in-allocation`) took.  Time lost to slow nodes is what the
job's straggler watch summed: per step, the slowest node's compute time over the job's (the whole
job waits for it in every collective).  Productive time is run time minus work redone and time lost
to slow nodes, and goodput is productive time over the run's wall time.  A job that shrank (no spare left,
`restart.min_data_parallel`) trains on, but with fewer data-parallel replicas: the capacity it lost is its own
cause, the time it ran smaller times the share of replicas missing (a step at 2 of 3 replicas does 2/3 of the
work in the same time; clusterctl's programs keep the global batch by accumulating, so the step takes 3/2 as
long: the same loss), apart from the time lost to restarts, queues and redone work.

Advice: the Young/Daly interval sqrt(2 · C · MTBF), with C the measured time training stalls per
checkpoint and MTBF the observed run time per node failure.  C is the median of the checkpoints' save
times: the save to shared storage, or with multi-level checkpoints (`tiers`) the local save (the slowest
node's, from complete.json), since the copy to the buddy and the flush to shared storage run behind
training.  `checkpoint_cost_source` says which.

`report` accounts a run from its journal alone; `status` (`run_goodput`) accounts it so far, with Slurm's
times of the attempts no supervisor has decided on yet (the running one), so that the same run gives the
same goodput to both once it has ended.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.pure.restart_policy import AttemptState, replay
from clusterctl.records.run_journal import OutcomeKind, RecoveredInAllocation, RunEvent, SlurmTimes

COST_SAVE = "save"
"""The checkpoint's cost is its save to shared storage (the program's own)."""
COST_LOCAL_SAVE = "local-save"
"""The checkpoint's cost is its local save, the slowest node's (multi-level checkpoints)."""


@dataclass(frozen=True)
class AttemptTimes:
    """One attempt's clock readings (epoch seconds; 0 = did not happen)."""

    number: int
    submit: float
    start: float
    end: float
    failed: bool
    node_failure: bool


@dataclass(frozen=True)
class Goodput:
    """The run's time budget and the checkpoint-interval advice."""

    wall_seconds: float
    productive_seconds: float
    redone_seconds: float
    queue_seconds: float
    restart_overhead_seconds: float
    goodput: float | None
    node_failures: int
    mtbf_seconds: float | None
    checkpoint_cost_seconds: float | None
    checkpoint_interval_seconds: float | None
    advised_interval_seconds: float | None
    slow_node_seconds: float = 0.0
    checkpoint_cost_source: str = COST_SAVE
    """Which time `checkpoint_cost_seconds` is: COST_SAVE or COST_LOCAL_SAVE."""
    reduced_capacity_seconds: float = 0.0
    """Capacity lost running smaller after a shrink: seconds at fewer replicas × the share of replicas missing."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, seconds rounded to the millisecond."""
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def young_daly(checkpoint_cost: float, mtbf: float) -> float:
    """The checkpoint interval that minimises expected lost time: sqrt(2 · C · MTBF)."""
    return math.sqrt(2.0 * checkpoint_cost * mtbf)


@dataclass(frozen=True)
class InAllocationRestart:
    """A node failure recovered inside a job: when the new step started, and how long the restart took; after a
    shrink, the new step's data-parallel size and the spec's (None: it ran at the spec's size)."""

    at: float
    restart_seconds: float
    data_parallel: int | None = None
    original_data_parallel: int | None = None

    @property
    def missing_share(self) -> float:
        """The share of the spec's data-parallel replicas the new step runs without (0 at full size)."""
        if self.data_parallel is None or not self.original_data_parallel:
            return 0.0
        return max(0.0, 1.0 - self.data_parallel / self.original_data_parallel)


def reduced_capacity(attempts: Sequence[AttemptTimes], in_allocation: Sequence[InAllocationRestart],
                     now: float) -> float:
    """Capacity lost running smaller: for each step a shrunk job started, the time until the next restart in the
    same attempt (or the attempt's end) times the share of replicas it ran without."""
    lost = 0.0
    ordered = sorted(in_allocation, key=lambda r: r.at)
    for i, r in enumerate(ordered):
        if r.missing_share <= 0:
            continue
        attempt = next((a for a in attempts if a.start and a.start <= r.at <= (a.end or now)), None)
        end = (attempt.end or now) if attempt is not None else now
        later = [n.at - n.restart_seconds for n in ordered[i + 1:] if r.at < n.at - n.restart_seconds <= end]
        lost += max(0.0, min([end, *later]) - r.at) * r.missing_share
    return lost


LOST_QUEUE = "queue"
"""Waiting in Slurm's queue for an attempt to start."""
LOST_REDONE = "redone"
"""Work done again after a failure: since the last complete checkpoint before it."""
LOST_RESTART = "restart"
"""Between one attempt's end and the next one's submission, or a restart inside an allocation."""


@dataclass(frozen=True)
class LostSpan:
    """A stretch of the run's wall time lost to `cause` (LOST_QUEUE, LOST_REDONE or LOST_RESTART), epoch seconds."""

    cause: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        """How long it lasted."""
        return self.end - self.start


def lost_spans(attempts: Sequence[AttemptTimes], checkpoints: Sequence[Checkpoint], now: float,
               in_allocation: Sequence[InAllocationRestart] = ()) -> tuple[LostSpan, ...]:
    """Where the run's time was lost, span by span, in the order `account` counts them (the restarts
    inside allocations first, then attempt by attempt): their sums by cause are `account`'s queue,
    redone and restart-overhead seconds.  Time lost to slow nodes is spread over every step and has no span."""
    stamps = sorted(c.written_at for c in checkpoints if c.written_at)
    spans: list[LostSpan] = []
    for r in in_allocation:
        failed_at = r.at - r.restart_seconds
        saved = [t for t in stamps if t <= failed_at]
        if r.restart_seconds > 0:
            spans.append(LostSpan(LOST_RESTART, failed_at, r.at))
        if saved and failed_at > saved[-1]:
            spans.append(LostSpan(LOST_REDONE, saved[-1], failed_at))
    previous_end = None
    for a in attempts:
        end = a.end or now
        if previous_end is not None and a.submit and a.submit > previous_end:
            spans.append(LostSpan(LOST_RESTART, previous_end, a.submit))
        if a.start:
            if a.start > a.submit:
                spans.append(LostSpan(LOST_QUEUE, a.submit, a.start))
            if a.failed:
                saved = [t for t in stamps if a.start <= t <= end]
                begin = saved[-1] if saved else a.start
                if end > begin:
                    spans.append(LostSpan(LOST_REDONE, begin, end))
        elif a.submit and end > a.submit:
            spans.append(LostSpan(LOST_QUEUE, a.submit, end))
        previous_end = end if a.end else None
    return tuple(spans)


def account(attempts: Sequence[AttemptTimes], checkpoints: Sequence[Checkpoint], now: float,
            in_allocation: Sequence[InAllocationRestart] = (), slow_node_seconds: float = 0.0,
            tiers: bool = False) -> Goodput:
    """Account a run's time from its attempts, the checkpoints it wrote, the restarts inside jobs
    (each: its own restart time, and the work since the last checkpoint before it redone) and the
    seconds its jobs lost waiting for slow nodes.  `tiers`: the checkpoints are multi-level ones (those
    flushed whole to shared storage), whose save times are the local save's, the slowest node's."""
    stamps = sorted(c.written_at for c in checkpoints if c.written_at)
    spans = lost_spans(attempts, checkpoints, now, in_allocation)
    redone = queue = overhead = 0.0
    for span in spans:
        if span.cause == LOST_QUEUE:
            queue += span.seconds
        elif span.cause == LOST_REDONE:
            redone += span.seconds
        else:
            overhead += span.seconds
    # A restart inside an allocation is inside its attempt's run time, but no training happened.
    run = -sum(r.restart_seconds for r in in_allocation)
    for a in attempts:
        if a.start:
            run += max(0.0, (a.end or now) - a.start)
    first = min((a.submit for a in attempts if a.submit), default=now)
    last = max((a.end or now for a in attempts), default=now)
    wall = max(0.0, last - first)
    run = max(0.0, run)
    slow = min(max(0.0, slow_node_seconds), max(0.0, run - redone))
    smaller = min(reduced_capacity(attempts, in_allocation, now), max(0.0, run - redone - slow))
    productive = max(0.0, run - redone - slow - smaller)
    failures = sum(1 for a in attempts if a.node_failure) + len(in_allocation)
    mtbf = run / failures if failures else None
    costs = [c.save_seconds for c in checkpoints if c.save_seconds is not None]
    cost = statistics.median(costs) if costs else None
    gaps = [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
    interval = statistics.median(gaps) if gaps else None
    advice = young_daly(cost, mtbf) if cost is not None and mtbf is not None else None
    return Goodput(wall, productive, redone, queue, overhead, productive / wall if wall > 0 else None, failures,
                   mtbf, cost, interval, advice, slow, COST_LOCAL_SAVE if tiers else COST_SAVE, smaller)


def attempt_times(attempt: AttemptState, slurm: SlurmTimes | None = None) -> AttemptTimes:
    """One attempt's clock readings: those its `decided` event kept, or, for an attempt not decided yet (it runs,
    or it ended and no supervisor has decided yet), `slurm`'s times of its job (never counted as failed: what
    its end was is not decided).  The journal's sbatch time is sub-second, Slurm's are whole seconds: it is
    taken for the submission when there."""
    decided = attempt.decided
    times = decided.times if decided is not None else slurm
    return AttemptTimes(attempt.number, attempt.submitted_at or (times.submit if times else None) or 0.0,
                        (times.start if times else None) or 0.0, (times.end if times else None) or 0.0,
                        decided is not None and decided.outcome != OutcomeKind.COMPLETED,
                        decided is not None and decided.outcome == OutcomeKind.NODE_FAILURE)


def restarts_of(recoveries: Sequence[RecoveredInAllocation]) -> list[InAllocationRestart]:
    """The restarts inside allocations as `account` counts them: when each new step started, and how long the
    restart took (the sum of its phases)."""
    # The spec's size: the largest a shrunk job's journal names (its first shrink's `before`).
    original = max((e.data_parallel_before for e in recoveries if e.data_parallel_before is not None), default=None)
    return [InAllocationRestart(e.at, sum(seconds for _, seconds in e.phases), e.data_parallel_after, original)
            for e in recoveries]


def run_goodput(events: Sequence[RunEvent], checkpoints: Sequence[Checkpoint], now: float,
                slow_node_seconds: float = 0.0, tiers: bool = False,
                slurm: Mapping[str, SlurmTimes] = MappingProxyType({})) -> Goodput:
    """The run's goodput so far from its journal's `events`, its complete checkpoints, the seconds its jobs lost
    to slow nodes and Slurm's times of the jobs no supervisor has decided on yet (`slurm`, by job id): what
    `report` accounts, with the running attempt counted from its start, not as queue time."""
    attempts = replay(events).attempts
    times = [attempt_times(a, slurm.get(a.job_id) if a.job_id is not None else None) for a in attempts]
    recoveries = [e for e in events if isinstance(e, RecoveredInAllocation)]
    return account(times, list(checkpoints), now, restarts_of(recoveries), slow_node_seconds, tiers)
