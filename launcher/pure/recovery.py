"""The recovery judge (pure): after a failure, restart in place, swap a spare, resubmit, or stop.

Both places that recover ask this one function: the in-allocation agent (inside a job with
spares) when a step ends, and the supervisor (on the login node) when an attempt ends.  Each
gathers what happened (`Happened`: the outcome and its blame, the last complete checkpoint, and
inside an allocation which nodes it still has) and the run's `RestartBudget` (what the journal
says has been used), and acts on the `Recovery` it gets back.

One budget, counted one way: every recovery, in place, on a spare or through the queue, uses one
of `restart.max_restarts`, and counts against `restart.retry_budget` unless the checkpoint
advanced since the last one.  The journal holds one event per recovery (`recovered-in-allocation`
from the agent, `decided` with action `resubmit` from the supervisor) and the supervisor's replay
folds each through `RestartBudget.spend`, the function the judge itself charges with: a replayed
budget is the budget the live decisions saw.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from clusterctl.launcher.pure.classify import Blame, Outcome
from clusterctl.launcher.pure.placement import PlannedMap
from clusterctl.launcher.pure.shrink import JobShape, NoShrink, plan_shrink
from clusterctl.launcher.pure.spec import RestartSection
from clusterctl.records.run_journal import DecisionAction, OutcomeKind

HANG_RESTARTS_IN_PLACE = 1
"""How often one allocation starts a step again on the same nodes after its ranks hung with no node to
give back (every rank at once, or ranks on the agent's own host); a second such hang goes to the queue."""
RECOVERABLE = frozenset({OutcomeKind.NODE_FAILURE, OutcomeKind.PROGRAM_FAILURE, OutcomeKind.RESUBMIT})
"""Outcomes a restart may help; any other (storage full, misplaced ranks, asked to stop, cancelled) stops."""


@dataclass(frozen=True)
class RestartBudget:
    """What a run has used of its restart policy, as replayed from its journal."""

    restarts: int = 0
    """Recoveries so far: in place, on a spare, or by resubmission (each uses one of restart.max_restarts)."""
    program_failures: int = 0
    """Attempts that ended by the program's own failure (restart.max_program_failures)."""
    without_progress: int = 0
    """Decisions in a row without the checkpoint advancing (restart.retry_budget)."""
    best_step: int | None = None
    """The newest complete checkpoint's step any decision saw."""

    def spend(self, outcome: OutcomeKind, checkpoint_step: int | None, recovered: bool) -> RestartBudget:
        """The budget after one journaled decision: an attempt or a step that ended `outcome` with the last
        complete checkpoint at `checkpoint_step`, and `recovered` (restarted in place, on a spare or by
        resubmission) or not (stopped, done)."""
        progressed = checkpoint_step is not None and (self.best_step is None or checkpoint_step > self.best_step)
        return RestartBudget(
            restarts=self.restarts + (1 if recovered else 0),
            program_failures=self.program_failures + (1 if outcome == OutcomeKind.PROGRAM_FAILURE else 0),
            without_progress=0 if progressed else self.without_progress + 1,
            best_step=checkpoint_step if progressed else self.best_step)


@dataclass(frozen=True)
class Allocation:
    """Where the agent stands inside its job: the nodes its last step ran on (allocation order), how many
    the job needs, the batch host (where the agent runs: never given back), and how often this
    allocation already started a step again on the same nodes after a hang.  `shape`: what a shrink
    re-plans with (the last step's layout, the topology); None: this agent cannot shrink the job."""

    nodes: tuple[str, ...]
    needed: int
    batch_host: str
    hang_restarts: int = 0
    shape: JobShape | None = None

    @property
    def spares(self) -> int:
        """Nodes beyond the job's needs, left to swap in."""
        return len(self.nodes) - self.needed


@dataclass(frozen=True)
class Happened:
    """What the judge is asked about: how an attempt (or a step) ended, with the nodes blamed, the last
    complete checkpoint's step, and `where`: inside an allocation (the agent) or None (the supervisor, on
    the login node).  `hung`: the step was ended because its ranks stopped progressing (the blame, if any,
    is the nodes whose ranks stopped first)."""

    outcome: Outcome
    checkpoint_step: int | None = None
    where: Allocation | None = None
    hung: bool = False


class Act(enum.StrEnum):
    """What to do.  The first three are what the supervisor journals (`DecisionAction`); the others
    happen inside an allocation."""

    DONE = "done"
    STOP = "stop"
    RESUBMIT = "resubmit"
    RESTART_IN_PLACE = "restart-in-place"
    SWAP = "swap"
    SHRINK = "shrink"
    """Inside an allocation with no spare left: drop whole data-parallel replicas and go on on fewer nodes."""
    END_JOB = "end-job"
    """Inside an allocation: end the job and leave the decision to the supervisor (nothing is journaled)."""

    @property
    def recovers(self) -> bool:
        """A new step or attempt follows: one restart of the budget is used."""
        return self in (Act.RESUBMIT, Act.RESTART_IN_PLACE, Act.SWAP, Act.SHRINK)

    @property
    def in_allocation(self) -> bool:
        """A new step in the same allocation."""
        return self in (Act.RESTART_IN_PLACE, Act.SWAP, Act.SHRINK)

    def decision(self) -> DecisionAction:
        """As the supervisor journals it (`decided`'s action)."""
        if self in (Act.DONE, Act.STOP, Act.RESUBMIT):
            return DecisionAction(self.value)
        raise ValueError(f"{self} happens inside an allocation; the supervisor never journals it")


@dataclass(frozen=True)
class Recovery:
    """The judge's answer: what to do and why; `blame`: the nodes to give back (a swap) or to exclude
    (a resubmission, an ended job); `nodes`: the next step's nodes (in place, swapped or shrunk); `delay`: the
    wait before a resubmission; `budget`: the run's budget once this answer is journaled (what a replay
    of the journal gives).  A shrink also says the next step's `data_parallel` size and the surviving nodes
    it does not use, to `give_back` with the blamed ones."""

    act: Act
    message: str
    budget: RestartBudget
    blame: tuple[Blame, ...] = ()
    nodes: tuple[str, ...] = ()
    delay: float = 0.0
    data_parallel: int | None = None
    give_back: tuple[str, ...] = ()
    planned: PlannedMap | None = field(default=None, compare=False, repr=False)
    """A shrink's map as the judge planned it, for the next step to take rather than plan again."""


def judge(happened: Happened, budget: RestartBudget, policy: RestartSection) -> Recovery:
    """What to do after `happened`, with `budget` used so far of the restart `policy`."""
    if happened.where is None:
        return _on_the_login_node(happened, budget, policy)
    return _in_the_allocation(happened, happened.where, budget, policy)


def _over_budget(outcome: Outcome, spent: RestartBudget, policy: RestartSection) -> str:
    """Why spending one more restart is not allowed ('' when it is), in the order a user reads them."""
    if outcome.kind == OutcomeKind.PROGRAM_FAILURE and spent.program_failures > policy.max_program_failures:
        return (f"{spent.program_failures} such failures (restart.max_program_failures = "
                f"{policy.max_program_failures}): stopping, no node blamed; see the job log")
    if spent.restarts > policy.max_restarts:
        return f"restart.max_restarts = {policy.max_restarts} reached"
    if spent.without_progress > policy.retry_budget:
        return (f"{spent.without_progress} attempts in a row without the checkpoint advancing "
                f"(restart.retry_budget = {policy.retry_budget}): stopping")
    return ""


def _on_the_login_node(happened: Happened, budget: RestartBudget, policy: RestartSection) -> Recovery:
    outcome = happened.outcome
    step = happened.checkpoint_step
    if outcome.kind == OutcomeKind.COMPLETED:
        return Recovery(Act.DONE, "the run completed", budget.spend(outcome.kind, step, recovered=False))
    if outcome.kind not in RECOVERABLE:
        return Recovery(Act.STOP, outcome.message, budget.spend(outcome.kind, step, recovered=False))
    spent = budget.spend(outcome.kind, step, recovered=True)
    over = _over_budget(outcome, spent, policy)
    if over:
        return Recovery(Act.STOP, f"{outcome.message}; {over}", budget.spend(outcome.kind, step, recovered=False),
                        outcome.blame)
    # After progress, go again at once (the bad node is excluded); each attempt in a row
    # without progress doubles the wait.
    delay = 0.0 if spent.without_progress == 0 else min(
        policy.backoff_max_seconds, policy.backoff_seconds * 2 ** (spent.without_progress - 1))
    return Recovery(Act.RESUBMIT, outcome.message, spent, outcome.blame, delay=delay)


def _in_the_allocation(happened: Happened, where: Allocation, budget: RestartBudget,
                       policy: RestartSection) -> Recovery:
    outcome = happened.outcome
    blamed = {b.node for b in outcome.blame}
    # What the agent cannot recover itself ends the job: the supervisor then judges the attempt (and
    # journals it), so nothing here is charged to the budget.
    if outcome.kind == OutcomeKind.COMPLETED:
        return Recovery(Act.DONE, "the step completed", budget)
    if outcome.kind == OutcomeKind.PROGRAM_FAILURE:
        return Recovery(Act.END_JOB, f"{outcome.message}: the supervisor judges it", budget)
    if outcome.kind not in (OutcomeKind.NODE_FAILURE, OutcomeKind.RESUBMIT):
        return Recovery(Act.END_JOB, f"{outcome.message}; ending the job for the supervisor", budget)
    if happened.hung and (not blamed or where.batch_host in blamed):
        # Every rank stopped at once: no node to tell apart (a filesystem or network stall, or a hang
        # too quick to see who went first); or ranks hung on the agent's own host, which cannot be
        # given back.  Start again on the same nodes, once per allocation.
        if where.hang_restarts >= HANG_RESTARTS_IN_PLACE:
            return Recovery(Act.END_JOB, f"the whole step hung again ({outcome.message}); ending the job for "
                                         "the supervisor", budget)
        message = ("every rank stopped progressing at once: starting the step again on the same nodes" if not blamed
                   else f"ranks hung on the batch host {where.batch_host} (where this agent runs): starting the "
                        "step again on the same nodes")
        return _restart_here(Recovery(Act.RESTART_IN_PLACE, message, budget, nodes=where.nodes), happened, budget,
                             policy)
    if where.batch_host in blamed:
        # The agent runs there: giving it back would leave the job's steps without their driver.
        reasons = "; ".join(b.reason for b in outcome.blame if b.node == where.batch_host)
        return Recovery(Act.END_JOB, f"the batch host {where.batch_host} failed ({reasons}); ending the job for "
                                     "the supervisor to resubmit without it", budget, outcome.blame)
    if not blamed:  # the program asked for a restart (restart.exit_actions)
        return _restart_here(Recovery(Act.RESTART_IN_PLACE, outcome.message, budget, nodes=where.nodes), happened,
                             budget, policy)
    remaining = tuple(n for n in where.nodes if n not in blamed)
    names = ", ".join(sorted(blamed))
    if len(remaining) < where.needed:
        lost = f"{names} failed and {len(remaining)} nodes remain for {where.needed}: no spare left"
        shrink = _shrink(where, remaining, policy)
        if isinstance(shrink, str):
            why = f", and {shrink}" if shrink else ""
            return Recovery(Act.END_JOB, f"{lost}{why}; ending the job for the supervisor to resubmit", budget,
                            outcome.blame)
        return _restart_here(replace(shrink, message=f"{lost}: {shrink.message}", blame=outcome.blame), happened,
                             budget, policy)
    return _restart_here(Recovery(Act.SWAP, f"{names} failed; {len(remaining) - where.needed} spare(s) left after "
                                            "this restart", budget, outcome.blame, remaining), happened, budget, policy)


def _restart_here(wanted: Recovery, happened: Happened, budget: RestartBudget, policy: RestartSection) -> Recovery:
    """`wanted` (a new step in the allocation) if the budget allows one more restart, else end the job."""
    spent = budget.spend(happened.outcome.kind, happened.checkpoint_step, recovered=True)
    over = _over_budget(happened.outcome, spent, policy)
    if over:
        return Recovery(Act.END_JOB, f"{happened.outcome.message}; {over}: ending the job for the supervisor",
                        budget, wanted.blame)
    return replace(wanted, budget=spent)


def _shrink(where: Allocation, remaining: tuple[str, ...], policy: RestartSection) -> Recovery | str:
    """A shrink onto `remaining` (the budget not yet charged), or why the job may not or cannot shrink ('' when
    the agent gave no shape to shrink: it does not shrink)."""
    shape = where.shape
    floor = policy.min_data_parallel
    if shape is None:
        return ""
    if floor is None or floor >= shape.original_data_parallel:
        return (f"the spec does not allow shrinking (restart.min_data_parallel = parallel.dp = "
                f"{shape.original_data_parallel})")
    planned = plan_shrink(shape, remaining, where.batch_host, floor)
    if isinstance(planned, NoShrink):
        return f"the job cannot shrink: {planned.reason}"
    before = shape.layout.dp
    given = f"; giving back {' '.join(planned.give_back)} (unused)" if planned.give_back else ""
    idle = (f"; the batch host {where.batch_host} stays without ranks (the agent runs there)"
            if planned.batch_host_idle else "")
    return Recovery(Act.SHRINK, f"shrinking from {before} to {planned.data_parallel} data-parallel replicas on "
                                f"{len(planned.nodes)} nodes{given}{idle}",
                    RestartBudget(), nodes=planned.nodes, data_parallel=planned.data_parallel,
                    give_back=planned.give_back, planned=planned.planned)
