"""The recovery judge: one answer to "what now?" for the supervisor and the in-allocation agent, with
one restart budget that every recovery (in place, on a spare, through the queue) uses, and that a
replay of the journal counts the same way the live decisions did."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.launcher.pure.classify import Blame, Outcome, step_outcome
from clusterctl.launcher.pure.parallel import ParallelLayout
from clusterctl.launcher.pure.shrink import JobShape
from clusterctl.slurm.topology import parse_topology_conf
from clusterctl.launcher.pure.recovery import Act, Allocation, Happened, Recovery, RestartBudget, judge
from clusterctl.launcher.pure.restart_policy import replay
from clusterctl.launcher.pure.spec import RestartSection
from clusterctl.records.run_journal import (
    Created, Decided, OutcomeKind, RecoveredInAllocation, RunEnded, RunEvent, EventKind, Submitted,
)

NODES = tuple(f"node{i}" for i in range(1, 7))
BATCH_HOST = NODES[0]
ACTIONS = ((75, "restart"), (76, "exclude-node"), (77, "stop"))


def _blame(*nodes: str) -> tuple[Blame, ...]:
    return tuple(Blame(n, "healthd: xid 79", ("drained by healthd: healthd: xid 79",)) for n in nodes)


policies = st.builds(RestartSection, max_restarts=st.integers(0, 6), max_program_failures=st.integers(0, 3),
                     retry_budget=st.integers(1, 4), backoff_seconds=st.just(1.0), backoff_max_seconds=st.just(8.0),
                     min_data_parallel=st.one_of(st.none(), st.integers(1, 4)))
budgets = st.builds(RestartBudget, restarts=st.integers(0, 8), program_failures=st.integers(0, 4),
                    without_progress=st.integers(0, 5), best_step=st.one_of(st.none(), st.integers(0, 100)))
steps = st.one_of(st.none(), st.integers(0, 100))
outcomes = st.one_of(
    st.builds(lambda nodes: Outcome(OutcomeKind.NODE_FAILURE, "node failed", _blame(*nodes)),
              st.lists(st.sampled_from(NODES[1:]), min_size=1, max_size=3, unique=True)),
    st.just(Outcome(OutcomeKind.NODE_FAILURE, "NODE_FAIL but no node of the job is down now")),
    st.just(Outcome(OutcomeKind.PROGRAM_FAILURE, "exit 1 with every node healthy")),
    st.just(Outcome(OutcomeKind.RESUBMIT, "the program asked to restart")),
    st.just(Outcome(OutcomeKind.COMPLETED, "completed")),
    st.just(Outcome(OutcomeKind.STORAGE_FULL, "No space left on device")),
    st.just(Outcome(OutcomeKind.PROGRAM_ASKED_STOP, "the program asked to stop")),
)
SHAPE = JobShape(ParallelLayout(tp=4, dp=4), 4, 8, parse_topology_conf("SwitchName=leaf Nodes=node[1-6]"))
"""Two nodes of two replicas each: a job that may shrink to dp = 2 on one node."""
places = st.one_of(st.none(), st.builds(lambda spares, hangs, shape: Allocation(NODES[:2 + spares], 2, BATCH_HOST,
                                                                                hangs, shape),
                                        st.integers(0, 3), st.integers(0, 1), st.sampled_from([None, SHAPE])))


@dataclass
class Run:
    """A run's journal as the supervisor and the agent write it, each acting on the judge's answers."""

    policy: RestartSection
    events: list[RunEvent]
    attempt: int = 1
    restart_in_job: int = 0
    ended: bool = False

    def happen(self, happened: Happened) -> Recovery:
        recovery = judge(happened, replay(self.events).budget, self.policy)
        if happened.where is not None and recovery.act.in_allocation:  # the agent: a new step, journaled
            self.restart_in_job += 1
            self.events.append(RecoveredInAllocation(
                at=1.0, job_id=str(self.attempt), restart=self.restart_in_job,
                blame=tuple(b.to_journal() for b in recovery.blame), nodes=recovery.nodes,
                checkpoint_step=happened.checkpoint_step, reason="" if recovery.blame else recovery.message))
        elif happened.where is None:  # the supervisor: every decision journaled
            self.events.append(Decided(at=1.0, attempt=self.attempt, job_id=str(self.attempt), state="FAILED",
                                       exit_code=1, outcome=happened.outcome.kind, message=recovery.message,
                                       blame=tuple(b.to_journal(10.0) for b in happened.outcome.blame),
                                       checkpoint_step=happened.checkpoint_step, checkpoint=None,
                                       action=recovery.act.decision(), delay=recovery.delay))
            if recovery.act == Act.RESUBMIT:
                self.attempt += 1
                self.restart_in_job = 0
                self.events.append(Submitted(at=1.0, attempt=self.attempt, job_id=str(self.attempt)))
            else:
                self.events.append(RunEnded(kind=EventKind.STOPPED, at=1.0, message=recovery.message))
                self.ended = True
        return recovery


def _recoveries(events: list[RunEvent]) -> int:
    return sum(1 for e in events if isinstance(e, RecoveredInAllocation)
               or isinstance(e, Decided) and e.action == "resubmit")


@settings(max_examples=300, deadline=None)
@given(policies, st.lists(st.tuples(outcomes, steps, places, st.booleans()), min_size=1, max_size=20))
def test_no_sequence_of_events_anywhere_spends_more_than_max_restarts_and_replay_counts_what_was_decided(
        policy, happenings):
    run = Run(policy, [Created(at=0.0, name="toy"), Submitted(at=0.0, attempt=1, job_id="1")])
    for outcome, step, where, hung in happenings:
        if run.ended:
            break
        recovery = run.happen(Happened(outcome, step, where, hung=hung and where is not None))
        replayed = replay(run.events).budget
        # What the journal says is what the judge said it would be once journaled (END_JOB journals nothing).
        assert replayed == recovery.budget
        assert min(replayed.restarts, replayed.program_failures, replayed.without_progress) >= 0
        assert replayed.restarts == _recoveries(run.events) <= policy.max_restarts
        assert replayed.without_progress <= policy.retry_budget or not recovery.act.recovers


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 255), st.lists(st.sampled_from([0, 1, 3, 75, 77, 137]), max_size=4), places, budgets, policies)
def test_a_program_failure_never_blames_a_node(exit_code, codes, where, budget, policy):
    # Any step that ended with every node healthy, whatever its ranks exited with (but exclude-node).
    log = "".join(f"srun: error: {NODES[i % 3]}: task {i}: Exited with exit code {c}\n" for i, c in enumerate(codes))
    outcome = step_outcome(exit_code, [], None, log, ACTIONS)
    assert outcome.blame == ()
    recovery = judge(Happened(outcome, 10, where), budget, policy)
    assert recovery.blame == () and recovery.act != Act.SWAP
    if outcome.kind == OutcomeKind.PROGRAM_FAILURE:
        assert recovery.act in ((Act.END_JOB,) if where is not None else (Act.RESUBMIT, Act.STOP))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(0, 4), st.integers(1, 4))
def test_inside_the_allocation_a_failed_node_is_swapped_exactly_while_a_spare_is_left(needed, spares, failed):
    nodes = tuple(f"n{i}" for i in range(needed + spares))
    failed = min(failed, len(nodes) - 1)
    if failed == 0:
        return
    broken = nodes[1:1 + failed]  # never the batch host (nodes[0])
    outcome = Outcome(OutcomeKind.NODE_FAILURE, "drained", _blame(*broken))
    recovery = judge(Happened(outcome, 20, Allocation(nodes, needed, nodes[0])), RestartBudget(), RestartSection())
    if failed <= spares:
        assert recovery.act == Act.SWAP and [b.node for b in recovery.blame] == list(broken)
        assert len(recovery.nodes) == needed + spares - failed and not set(recovery.nodes) & set(broken)
        assert recovery.budget.restarts == 1
    else:
        # No spare left: the job ends with the node in it; the supervisor resubmits without it.
        assert recovery.act == Act.END_JOB and [b.node for b in recovery.blame] == list(broken)
        assert recovery.budget == RestartBudget()
        then = judge(Happened(outcome, 20), recovery.budget, RestartSection())
        assert then.act == Act.RESUBMIT and [b.node for b in then.blame] == list(broken)


def test_a_failed_batch_host_ends_the_job_even_with_spares_left():
    where = Allocation(NODES[:4], 2, BATCH_HOST)
    recovery = judge(Happened(Outcome(OutcomeKind.NODE_FAILURE, "down", _blame(BATCH_HOST)), 20, where),
                     RestartBudget(), RestartSection())
    assert recovery.act == Act.END_JOB and "batch host node1" in recovery.message


def test_a_whole_step_hang_restarts_in_place_once_per_allocation():
    hang = Outcome(OutcomeKind.RESUBMIT, "every rank stopped at step 40")
    first = judge(Happened(hang, 40, Allocation(NODES[:3], 2, BATCH_HOST), hung=True), RestartBudget(),
                  RestartSection())
    assert first.act == Act.RESTART_IN_PLACE and first.nodes == NODES[:3] and "at once" in first.message
    again = judge(Happened(hang, 40, Allocation(NODES[:3], 2, BATCH_HOST, hang_restarts=1), hung=True),
                  first.budget, RestartSection())
    assert again.act == Act.END_JOB and "hung again" in again.message


def test_one_budget_for_restarts_in_place_swaps_and_resubmissions():
    policy = RestartSection(max_restarts=2)
    where = Allocation(NODES[:4], 2, BATCH_HOST)
    swap = judge(Happened(Outcome(OutcomeKind.NODE_FAILURE, "xid", _blame("node2")), 10, where), RestartBudget(),
                 policy)
    asked = judge(Happened(Outcome(OutcomeKind.RESUBMIT, "the program asked to restart"), 20,
                           Allocation(swap.nodes, 2, BATCH_HOST)), swap.budget, policy)
    assert (swap.act, asked.act, asked.budget.restarts) == (Act.SWAP, Act.RESTART_IN_PLACE, 2)
    # Both used: a third failure inside the job goes to the supervisor, which stops the run.
    node = Outcome(OutcomeKind.NODE_FAILURE, "xid", _blame("node3"))
    third = judge(Happened(node, 30, Allocation(asked.nodes, 2, BATCH_HOST)), asked.budget, policy)
    assert third.act == Act.END_JOB and "restart.max_restarts = 2 reached" in third.message
    last = judge(Happened(node, 30), third.budget, policy)
    assert last.act == Act.STOP and "restart.max_restarts = 2 reached" in last.message


def test_a_restart_in_the_allocation_without_progress_counts_toward_the_retry_budget():
    policy = RestartSection(retry_budget=1)
    asked = Outcome(OutcomeKind.RESUBMIT, "the program asked to restart")
    where = Allocation(NODES[:2], 2, BATCH_HOST)
    first = judge(Happened(asked, 20, where), RestartBudget(best_step=20), policy)
    assert first.act == Act.RESTART_IN_PLACE and first.budget.without_progress == 1
    second = judge(Happened(asked, 20, where), first.budget, policy)
    assert second.act == Act.END_JOB and "restart.retry_budget = 1" in second.message
    progressed = judge(Happened(asked, 30, where), first.budget, policy)
    assert progressed.act == Act.RESTART_IN_PLACE and progressed.budget.without_progress == 0


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([87, 137, 1]), st.lists(st.sampled_from(NODES[1:]), max_size=2, unique=True), budgets,
       policies)
def test_a_failed_resume_restarts_from_the_next_plan_and_counts_against_the_budget_unless_a_node_failed(
        exit_code, failed, budget, policy):
    # srun's exit code is 87 (the rank that could not load its part) or 128 + SIGKILL (the ranks it killed):
    # the nodes' resume-failure records tell a failed resume, and a failed node still comes first.
    said = ["node2 could not load checkpoint 20: no copy of slot 1 verified"]
    outcome = step_outcome(exit_code, list(_blame(*failed)), None, "", ACTIONS, said)
    where = Allocation(NODES[:3], 3, BATCH_HOST)
    recovery = judge(Happened(outcome, 20, where), budget, policy)
    if failed:
        assert outcome.kind == OutcomeKind.NODE_FAILURE
        return
    assert outcome.kind == OutcomeKind.RESUBMIT and outcome.blame == () and said[0] in outcome.message
    assert recovery.act in (Act.RESTART_IN_PLACE, Act.END_JOB)
    if recovery.act == Act.RESTART_IN_PLACE:
        assert recovery.nodes == NODES[:3] and recovery.budget.restarts == budget.restarts + 1
    assert step_outcome(exit_code, [], None, "", ACTIONS).kind == OutcomeKind.PROGRAM_FAILURE  # no records: its own


def _shrinking(min_data_parallel: int | None, *, max_restarts: int = 10, shape: bool = True,
               lost: tuple[str, ...] = ("node3",)):
    """Six nodes on one leaf, a replica a node (tp=8), no spare: `lost` fail."""
    topology = parse_topology_conf("SwitchName=leaf Nodes=node[1-6]")
    where = Allocation(NODES, 6, BATCH_HOST,
                       shape=JobShape(ParallelLayout(tp=8, dp=6), 6, 8, topology) if shape else None)
    outcome = Outcome(OutcomeKind.NODE_FAILURE, "node3 failed", _blame(*lost))
    return judge(Happened(outcome, 40, where), RestartBudget(restarts=1, best_step=30),
                 RestartSection(max_restarts=max_restarts, min_data_parallel=min_data_parallel))


def test_with_no_spare_a_job_allowed_to_shrink_goes_on_with_fewer_replicas_charged_like_a_swap():
    recovery = _shrinking(4)
    assert recovery.act == Act.SHRINK and recovery.act.in_allocation and recovery.act.recovers
    assert recovery.data_parallel == 5 and recovery.nodes == ("node1", "node2", "node4", "node5", "node6")
    assert recovery.give_back == () and [b.node for b in recovery.blame] == ["node3"]
    assert recovery.budget.restarts == 2
    assert recovery.message == ("node3 failed and 5 nodes remain for 6: no spare left: shrinking from 6 to 5 "
                                "data-parallel replicas on 5 nodes")


def test_a_shrink_gives_back_the_survivors_its_smaller_world_does_not_use():
    # A replica is two nodes (tp=8, pp=2): losing one of six leaves room for two replicas on four nodes.
    shape = JobShape(ParallelLayout(tp=8, pp=2, dp=3), 3, 8, parse_topology_conf("SwitchName=leaf Nodes=node[1-6]"))
    outcome = Outcome(OutcomeKind.NODE_FAILURE, "node3 failed", _blame("node3"))
    recovery = judge(Happened(outcome, 40, Allocation(NODES, 6, BATCH_HOST, shape=shape)), RestartBudget(),
                     RestartSection(min_data_parallel=1))
    assert recovery.act == Act.SHRINK and recovery.data_parallel == 2 and len(recovery.nodes) == 4
    assert BATCH_HOST in recovery.nodes and len(recovery.give_back) == 1
    assert set(recovery.nodes) | set(recovery.give_back) == set(NODES) - {"node3"}
    assert f"giving back {recovery.give_back[0]} (unused)" in recovery.message


def test_a_job_whose_spec_forbids_shrinking_ends_for_the_supervisor_as_before():
    for floor in (6, None):  # None: a spec written before shrinking
        recovery = _shrinking(floor)
        assert recovery.act == Act.END_JOB and recovery.budget == RestartBudget(restarts=1, best_step=30)
        assert recovery.message.startswith("node3 failed and 5 nodes remain for 6: no spare left, and the spec "
                                           "does not allow shrinking (restart.min_data_parallel = parallel.dp "
                                           "= 6)")
        assert recovery.message.endswith("ending the job for the supervisor to resubmit")


def test_a_shrink_the_survivors_cannot_hold_or_the_budget_cannot_pay_ends_the_job():
    too_few = _shrinking(5, lost=("node3", "node4"))
    assert too_few.act == Act.END_JOB and too_few.message == (
        "node3, node4 failed and 4 nodes remain for 6: no spare left, and the job cannot shrink: 4 nodes remain, "
        "and the smallest data-parallel size allowed (dp = 5, restart.min_data_parallel = 5) needs 5; ending the "
        "job for the supervisor to resubmit")
    spent = _shrinking(4, max_restarts=1)
    assert spent.act == Act.END_JOB and "restart.max_restarts = 1 reached" in spent.message
    assert [b.node for b in spent.blame] == ["node3"]
    blind = _shrinking(4, shape=False)  # an agent that does not shrink: the message as before shrinking
    assert blind.act == Act.END_JOB and blind.message == ("node3 failed and 5 nodes remain for 6: no spare left; "
                                                          "ending the job for the supervisor to resubmit")
