"""The supervisor's memory and judgement (pure): the run's state replayed from its journal,
and what to do after an attempt ends.

Replaying the journal gives the same state every time, which is what makes a restarted
supervisor repeat no action: an attempt with a `decided` event is never decided again; a
`submitting` without `submitted` is reconciled with Slurm before anything is resubmitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from clusterctl.launcher.pure.classify import Outcome
from clusterctl.launcher.pure.spec import RestartSection
from clusterctl.records.run_journal import (
    BlamedNode, Decided, DecisionAction, Ending, OutcomeKind, RecoveredInAllocation, RunEnded, RunEvent,
    StragglerFound, Submitted,
    Submitting, SubmitLost,
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
    program_failures: int = 0
    restarts: int = 0
    restarts_without_progress: int = 0
    best_step: int | None = None
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
    program_failures = restarts = without_progress = 0
    best_step: int | None = None
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
            if e.outcome == OutcomeKind.PROGRAM_FAILURE:
                program_failures += 1
            step = e.checkpoint_step
            if step is not None and (best_step is None or step > best_step):
                best_step, without_progress = step, 0  # same rule as decide(): progress resets the count
            else:
                without_progress += 1
            if e.action == DecisionAction.RESUBMIT:
                restarts += 1
                next_submit_at = e.at + e.delay
        elif isinstance(e, RecoveredInAllocation | StragglerFound):
            for b in e.blame:  # given back to Slurm inside the job: a resubmission must avoid them too
                blamed[b.node] = (b.until if b.until is not None else e.at, b.reason)
        elif isinstance(e, SubmitLost):
            attempts.pop(e.attempt, None)
        elif isinstance(e, RunEnded):
            ended = e
    return RunState(tuple(attempts[k] for k in sorted(attempts)), blamed, program_failures, restarts,
                    without_progress, best_step, ended, next_submit_at)


@dataclass(frozen=True)
class Decision:
    """What to do after an attempt: done, stop (with why) or resubmit after `delay` seconds."""

    action: DecisionAction
    message: str
    delay: float = 0.0


def decide(outcome: Outcome, state: RunState, policy: RestartSection, checkpoint_step: int | None) -> Decision:
    """Apply the restart policy to an attempt's outcome (`state` is the run before this decision)."""
    if outcome.kind == OutcomeKind.COMPLETED:
        return Decision(DecisionAction.DONE, "the run completed")
    if outcome.kind not in (OutcomeKind.NODE_FAILURE, OutcomeKind.PROGRAM_FAILURE, OutcomeKind.RESUBMIT):
        return Decision(DecisionAction.STOP, outcome.message)
    if outcome.kind == OutcomeKind.PROGRAM_FAILURE and state.program_failures + 1 > policy.max_program_failures:
        return Decision(DecisionAction.STOP, f"{outcome.message}; {state.program_failures + 1} such failures "
                                f"(restart.max_program_failures = {policy.max_program_failures}): stopping, no node "
                                "blamed; see the job log")
    if state.restarts + 1 > policy.max_restarts:
        return Decision(DecisionAction.STOP, f"{outcome.message}; restart.max_restarts = {policy.max_restarts} reached")
    progressed = checkpoint_step is not None and (state.best_step is None or checkpoint_step > state.best_step)
    without_progress = 0 if progressed else state.restarts_without_progress + 1
    if without_progress > policy.retry_budget:
        return Decision(DecisionAction.STOP, f"{outcome.message}; {without_progress} attempts in a row without the checkpoint "
                                f"advancing (restart.retry_budget = {policy.retry_budget}): stopping")
    # After progress, go again at once (the bad node is excluded); each attempt in a row
    # without progress doubles the wait.
    delay = 0.0 if without_progress == 0 else min(policy.backoff_max_seconds,
                                                  policy.backoff_seconds * 2 ** (without_progress - 1))
    return Decision(DecisionAction.RESUBMIT, outcome.message, delay)
