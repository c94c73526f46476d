"""When the training ends: the steps left over the steps per second measured recently (pure).

`clusterctl status` and its `--watch` ask `eta` with the spec's `[job] total_steps`, the highest step the
job's ranks reported and the job's steps/s as its agent measured them (each node's own counters over the
last max(30 s, 3 heartbeats); a new step after a recovery is measured afresh, so the rate is the one of
training, not of the run with its restarts).  That gives the time training still needs at today's pace.
The run also loses time to queue waits, restarts, work redone and slow nodes: the same remaining training
at the run's goodput so far (productive time over wall time, `goodput.account`) is `seconds_at_goodput`,
what the run will take if it keeps losing time as it has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ESTIMATE = "estimate"
DONE = "done"
UNKNOWN = "unknown"
NO_TOTAL = "set [job] total_steps in the spec"
NO_STEP = "no step reported yet"
NO_RATE = "no steps/s measured yet"
NO_PROGRESS = "no step was made in the last measurement window"


@dataclass(frozen=True)
class Eta:
    """How far the training is from its last step: `state` ESTIMATE (with `seconds`), DONE (the job reported
    the total step, or a later one) or UNKNOWN (`why` says why, in words that follow "ETA unknown: ").

    `seconds`: training time left at `steps_per_s`; `seconds_at_goodput`: the same at the run's `goodput`
    so far (None when no goodput is known, or none was productive yet); never negative, never infinite."""

    state: str
    total_steps: int | None = None
    step: int | None = None
    steps_per_s: float | None = None
    seconds: float | None = None
    goodput: float | None = None
    seconds_at_goodput: float | None = None
    why: str = ""

    @property
    def steps_left(self) -> int | None:
        """Steps from `step` to `total_steps` (0 when done), None when either is unknown."""
        if self.total_steps is None or self.step is None:
            return None
        return max(0, self.total_steps - self.step)

    def to_json(self) -> dict[str, Any]:
        """As `status --json` shows it (`eta`)."""
        return {"state": self.state, "total_steps": self.total_steps, "step": self.step,
                "steps_left": self.steps_left, "steps_per_s": self.steps_per_s, "seconds": self.seconds,
                "goodput": self.goodput, "seconds_at_goodput": self.seconds_at_goodput, "why": self.why}


def eta(total_steps: int | None, step: int | None, steps_per_s: float | None, goodput: float | None = None,
        not_training: str = "", finished: bool = False) -> Eta:
    """The ETA of a run whose job reported `step` (its highest), making `steps_per_s` recently, towards
    `total_steps` (None: the spec names none).  `goodput`: the run's goodput so far (a fraction).
    `not_training`: why no rate applies now ('' while the job trains: its job waits in the queue, the run
    stopped), said instead of a rate.  DONE when the run `finished` (ended done: its program said so) or
    `step` is at or past the total, whatever the rest says."""
    if finished or (total_steps is not None and step is not None and step >= total_steps):
        return Eta(DONE, total_steps, step, steps_per_s, 0.0, goodput, 0.0)
    known = Eta(UNKNOWN, total_steps, step, steps_per_s, goodput=goodput)
    if total_steps is None:
        return _unknown(known, NO_TOTAL)
    if not_training:
        return _unknown(known, not_training)
    if step is None:
        return _unknown(known, NO_STEP)
    if steps_per_s is None or math.isnan(steps_per_s):
        return _unknown(known, NO_RATE)
    if steps_per_s <= 0.0:
        return _unknown(known, NO_PROGRESS)
    seconds = (total_steps - step) / steps_per_s
    if not math.isfinite(seconds):
        return _unknown(known, f"{steps_per_s:.3g} steps/s is too slow to tell")
    at_goodput = None
    if goodput is not None and math.isfinite(goodput) and goodput > 0.0:
        at_goodput = seconds / min(goodput, 1.0)
        if not math.isfinite(at_goodput):
            at_goodput = None
    return Eta(ESTIMATE, total_steps, step, steps_per_s, seconds, goodput, at_goodput)


def _unknown(known: Eta, why: str) -> Eta:
    return Eta(UNKNOWN, known.total_steps, known.step, known.steps_per_s, goodput=known.goodput, why=why)
