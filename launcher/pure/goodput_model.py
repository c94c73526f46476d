"""How much of a large job's time goes to training, for a checkpoint path and a failure rate (pure).

A projection, not an account (`goodput.py` accounts a run that happened).  It compares today's
path, where every checkpoint is a synchronous save to shared storage and every resume reads it back
from there, with the multi-level one (docs/checkpoint-tiers.md): a save returns once the node's
copy is in its own memory or disk, a background thread copies it to the node's buddy and flushes
every k-th checkpoint to shared storage, and a resume reads from the node's own tier (survivors)
and its buddy (the replacement node), unless the failure took a node and its buddy together; then
it reads the last flushed checkpoint from shared storage.

The model is Young's and Daly's first-order one, with the recovery split by where it reads from.
Failures of the job arrive at rate λ = nodes / node MTBF.  Checkpoints start every s seconds of
wall time: s − δ of training, then a stall of δ.  A failure costs detection D, restart R, the read
L, and the work since the newest checkpoint complete where the resume reads it was taken: s/2 on
average, plus the time from its start until the copy was complete there (a failure in that window
resumes from the checkpoint before): the stall δ, and for a background copy its lag after the save
returned.  Today: cost A + s/2 with A = D + R + L_shared + δ.  Multi-level: with probability q the
failure took a node and its buddy (resume from shared storage: k·s/2 lost, plus δ and the flush's
lag F), else it costs L_local plus s/2 plus δ and the buddy copy's lag P.  Writing the expected cost
of a failure as A + B·s/2:

    goodput(s) = (1 − δ'/s) · (1 − λ·(A + B·s/2))        δ' = δ + σ·(P + F/k)

(σ: the share of training speed the background copies take while they run; 0 by default), which is
largest at s* = sqrt(2·δ'·(MTBF − A) / B): Young's sqrt(2·δ·MTBF) when A is small and B = 1.  The
interval is kept at least as long as the background copies take (s ≥ P, k·s ≥ F: a save never
waits for the previous one's copies) and at least `shortest_interval_seconds` of training.

q: a buddy's copy is needed from the failure until the replacement node has read it (D + R +
L_local); the buddy fails in that window with probability 1 − exp(−window / node MTBF), and
`correlated_pair_loss` adds failures that take both whatever the timing (a rack's power, a
cluster-wide outage: the local tier is memory).  First-order means failures during a recovery or a
checkpoint are not counted twice: accurate when D + R + L and s are small against the job's MTBF
(at 12,500 nodes of Llama 3's rate the job MTBF is about 30 minutes; recoveries of a few minutes
overstate goodput by a few percent, for both paths alike).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clusterctl.launcher.pure.goodput import young_daly

LLAMA3_NODE_MTBF_SECONDS = 54 * 86_400 * (16_384 // 8) / 419
"""Llama 3 (Dubey et al. 2024, §3.3.4): 419 unexpected interruptions in 54 days on 16,384 GPUs,
i.e. 2,048 nodes of 8: one interruption per node every ~264 days (22.8 million seconds)."""


@dataclass(frozen=True)
class Job:
    """The job and its failures.  Seconds throughout."""

    nodes: int
    detect_seconds: float
    restart_seconds: float
    node_mtbf_seconds: float = LLAMA3_NODE_MTBF_SECONDS
    correlated_pair_loss: float = 0.0
    """The share of failures that take a node and its buddy together whatever the timing."""
    shortest_interval_seconds: float = 1.0
    """At least this much training between two checkpoints (a step is not split)."""

    @property
    def mtbf_seconds(self) -> float:
        """The job's mean time between failures: any of its nodes fails."""
        return self.node_mtbf_seconds / max(self.nodes, 1)


@dataclass(frozen=True)
class SyncPath:
    """Today's path: every checkpoint is written to shared storage while training waits."""

    stall_seconds: float
    """Training waits this long per checkpoint (the slowest node's write to shared storage)."""
    read_seconds: float
    """A resume reads the checkpoint back from shared storage in this long."""


@dataclass(frozen=True)
class TieredPath:
    """The multi-level path: local tier, a copy on the buddy, a flush to shared storage every k-th."""

    stall_seconds: float
    """Training waits this long per checkpoint (the node-local copy committed)."""
    local_read_seconds: float
    """A resume from the nodes' own tiers and the replacement's buddy: the slowest node's read."""
    shared_read_seconds: float
    """A resume from shared storage (a node and its buddy lost together)."""
    replicate_seconds: float = 0.0
    """From a save's return until its copy is complete on the buddy."""
    flush_seconds: float = 0.0
    """From a flushed save's return until its copy is complete on shared storage."""
    flush_every: int = 1
    """Every k-th checkpoint is flushed to shared storage."""
    background_slowdown: float = 0.0
    """The share of training speed lost while a background copy runs (0: none)."""


@dataclass(frozen=True)
class Projection:
    """One path's advised interval and where its time goes, on average."""

    path: str
    interval_seconds: float
    """The advised training time between two checkpoints (s − δ)."""
    young_seconds: float
    """Young's interval for the stall and the job's MTBF (`goodput.young_daly`), for comparison."""
    goodput: float
    """The projected share of wall time spent training, in [0, 1]."""
    stall_share: float
    """The share of time in checkpoint stalls (and background slowdown), first order."""
    failure_share: float
    """The share of time lost to failures: detection, restart, reads, redone work; first order."""
    job_mtbf_seconds: float
    pair_loss: float
    """The probability that a failure's resume must read from shared storage (0 today: always)."""
    recovery_seconds: float
    """A failure's expected detection + restart + read."""
    lost_work_seconds: float
    """A failure's expected redone work at the advised interval (wall time since the kept checkpoint was taken)."""
    flush_interval_seconds: float
    """Wall time between two checkpoints that reach shared storage."""


def project_sync(job: Job, path: SyncPath) -> Projection:
    """Today's path: every checkpoint flushed synchronously, every resume from shared storage."""
    recovery = job.detect_seconds + job.restart_seconds + path.read_seconds
    return _project("sync", job, path.stall_seconds, path.stall_seconds, recovery, path.stall_seconds, 1.0, 0.0, 0.0,
                    1)


def project_tiered(job: Job, path: TieredPath) -> Projection:
    """The multi-level path; `pair_loss` (q) from the job's node MTBF and `correlated_pair_loss`."""
    k = max(path.flush_every, 1)
    q = pair_loss(job, path)
    fixed = job.detect_seconds + job.restart_seconds
    recovery = fixed + (1 - q) * path.local_read_seconds + q * path.shared_read_seconds
    lag = path.stall_seconds + (1 - q) * path.replicate_seconds + q * path.flush_seconds
    per_interval = (1 - q) + q * k  # a pair loss goes back to the last flushed checkpoint: k intervals
    stall = path.stall_seconds + path.background_slowdown * (path.replicate_seconds + path.flush_seconds / k)
    shortest = max(path.replicate_seconds, path.flush_seconds / k)
    return _project("tiered", job, path.stall_seconds, stall, recovery, lag, per_interval, q, shortest, k)


def pair_loss(job: Job, path: TieredPath) -> float:
    """The probability that a failure also took the failed node's buddy before its copy was read."""
    window = job.detect_seconds + job.restart_seconds + path.local_read_seconds
    independent = -math.expm1(-max(window, 0.0) / job.node_mtbf_seconds) if job.node_mtbf_seconds > 0 else 1.0
    correlated = min(max(job.correlated_pair_loss, 0.0), 1.0)
    return min(1.0, correlated + (1 - correlated) * independent)


def _project(name: str, job: Job, stall: float, effective_stall: float, recovery: float, lag: float,
             per_interval: float, q: float, shortest_wall: float, flush_every: int) -> Projection:
    """Where goodput(s) = (1 − δ'/s)(1 − λ(A + B·s/2)) is largest, s ≥ the floors; see the module's docstring."""
    mtbf = job.mtbf_seconds
    fixed = recovery + lag  # A
    floor = max(shortest_wall, stall + max(job.shortest_interval_seconds, 0.0))
    best = math.sqrt(2 * effective_stall * max(mtbf - fixed, 0.0) / per_interval) if mtbf > 0 else 0.0
    s = max(best, floor, 1e-9)
    rate = 1 / mtbf if mtbf > 0 else math.inf
    stall_share = min(effective_stall / s, 1.0)
    failure_share = min(rate * (fixed + per_interval * s / 2), 1.0)
    goodput = min(max((1 - stall_share) * (1 - failure_share), 0.0), 1.0)
    return Projection(
        path=name, interval_seconds=s - stall, young_seconds=young_daly(stall, mtbf) if mtbf > 0 else 0.0,
        goodput=goodput, stall_share=stall_share, failure_share=failure_share, job_mtbf_seconds=mtbf,
        pair_loss=q, recovery_seconds=recovery, lost_work_seconds=lag + per_interval * s / 2,
        flush_interval_seconds=s * flush_every)
