"""The supervisor's memory (pure): the run's state replayed from its journal.

Replaying the journal gives the same state every time, which is what makes a restarted
supervisor repeat no action: an attempt with a `decided` event is never decided again; a
`submitting` without `submitted` is reconciled with Slurm before anything is resubmitted.
What to do after a failure is `recovery.judge`'s; the restart budget replayed here is charged
with its own rule (`RestartBudget.spend`), once per journaled decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from clusterctl.launcher.pure.recovery import RestartBudget
from clusterctl.records.run_journal import (
    BlamedNode, Decided, DecisionAction, Ending, OutcomeKind, RecoveredInAllocation, RunEnded, RunEvent,
    StragglerFound, Submitted, Submitting, SubmitLost,
)


@dataclass(frozen=True)
class AttemptState:
    """One attempt as the journal knows it."""

    number: int
    job_id: str | None
    comment: str
    submitted_at: float
    decided: Decided | None = None
    ended_by_us: tuple[BlamedNode, ...] = ()


@dataclass(frozen=True)
class RunState:
    """Everything the supervisor needs to know, replayed from the journal."""

    attempts: tuple[AttemptState, ...] = ()
    blamed: dict[str, tuple[float, str]] = field(default_factory=dict)  # node -> (until, reason)
    budget: RestartBudget = RestartBudget()
    """What the run has used of its restart policy: every recovery, in place, on a spare or resubmitted."""
    ended: RunEnded | None = None
    next_submit_at: float = 0.0

    @property
    def current(self) -> AttemptState | None:
        """The newest attempt, None before the first."""
        return self.attempts[-1] if self.attempts else None

    def excluded(self, now: float) -> list[str]:
        """Nodes whose blame has not expired."""
        return sorted(n for n, (until, _) in self.blamed.items() if until > now)


def replay(events: Sequence[RunEvent]) -> RunState:
    """Fold the journal into a RunState (events that do not change it, like `created`, are passed over)."""
    attempts: dict[int, AttemptState] = {}
    blamed: dict[str, tuple[float, str]] = {}
    budget = RestartBudget()
    ended: RunEnded | None = None
    next_submit_at = 0.0
    for e in events:
        if isinstance(e, Submitting):
            attempts[e.attempt] = AttemptState(e.attempt, None, e.comment, e.at)
        elif isinstance(e, Submitted):
            old = attempts.get(e.attempt)
            attempts[e.attempt] = AttemptState(e.attempt, e.job_id, old.comment if old else "", e.at)
        elif isinstance(e, Ending):
            attempts[e.attempt] = replace(attempts[e.attempt], ended_by_us=e.blame)
        elif isinstance(e, Decided):
            attempts[e.attempt] = replace(attempts[e.attempt], decided=e)
            for b in e.blame:
                blamed[b.node] = (b.until if b.until is not None else e.at, b.reason)
            budget = budget.spend(e.outcome, e.checkpoint_step, recovered=e.action == DecisionAction.RESUBMIT)
            if e.action == DecisionAction.RESUBMIT:
                next_submit_at = e.at + e.delay
        elif isinstance(e, RecoveredInAllocation | StragglerFound):
            if isinstance(e, RecoveredInAllocation):  # a restart inside the job: one of the same budget
                budget = budget.spend(OutcomeKind.NODE_FAILURE if e.blame else OutcomeKind.RESUBMIT,
                                      e.checkpoint_step, recovered=True)
            for b in e.blame:  # given back to Slurm inside the job: a resubmission must avoid them too
                blamed[b.node] = (b.until if b.until is not None else e.at, b.reason)
        elif isinstance(e, SubmitLost):
            attempts.pop(e.attempt, None)
        elif isinstance(e, RunEnded):
            ended = e
    return RunState(tuple(attempts[k] for k in sorted(attempts)), blamed, budget, ended, next_submit_at)
