"""The supervisor's judgement, pure: checkpoints, classification, restart policy, goodput."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.shared.checkpoints import latest_complete
from clusterctl.launcher.pure.classify import (
    COMPLETED, MISPLACED, NODE_FAILURE, PROGRAM_FAILURE, RESUBMIT, STORAGE, USER_CANCELLED, Blame, Outcome, classify,
    hardware_suspects,
)
from clusterctl.launcher.pure.goodput import (
    LOST_QUEUE, LOST_REDONE, LOST_RESTART, AttemptTimes, InAllocationRestart, account, lost_spans, young_daly,
)
from clusterctl.launcher.pure.recovery import Happened, RestartBudget, judge
from clusterctl.launcher.pure.restart_policy import RunState, replay
from clusterctl.launcher.pure.spec import RestartSection
from clusterctl.records.actions import Action
from clusterctl.records.job_health import HealthFinding, JobHealthRecord
from clusterctl.records.run_journal import (
    Created, Decided, DecisionAction, EventKind, RunEnded, RunEvent, Submitted, Submitting, SubmitLost,
)
from clusterctl.slurm.jobs import JobReport
from clusterctl.slurm.nodes import parse_sinfo_json
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "examples"))
import toy_trainer  # noqa: E402 - the example's own checkpoint writer is the protocol under test

NODES = {n.name: n for n in parse_sinfo_json((REPO / "tests/data/slurm/sinfo-json-healthd-drain.json").read_text())}
HEALTHY = {name: replace(n, flags=(), reason="") for name, n in NODES.items()}


def _report(state: str, exit_code: int | None = 1, nodes: str = "node[1-3]") -> JobReport:
    return JobReport("42", "job", state, "", nodes, exit_code, None, 100.0, 110.0, 200.0)


# ---- checkpoints ------------------------------------------------------------------
def _state(step: int) -> dict:
    return {**toy_trainer.initial_state(7), "step": step}


def test_the_newest_complete_checkpoint_wins_and_torn_ones_are_skipped_with_a_reason(tmp_path):
    for step in (10, 20, 30):
        toy_trainer.write_checkpoint(tmp_path, _state(step))
    (tmp_path / "step-00000030" / "manifest.json").unlink()             # torn: marker missing
    corrupt = toy_trainer.write_checkpoint(tmp_path, _state(40))
    (corrupt / "params.json").write_text('{"params": [0]}')               # payload changed after the manifest
    (tmp_path / ".tmp-step-00000050-99").mkdir()                          # a writer died before the rename
    best, skipped = latest_complete(tmp_path, "manifest")
    assert best is not None and (best.step, Path(best.path).name, best.validator) == (20, "step-00000020", "manifest")
    assert best.save_seconds is not None and best.written_at is not None
    assert [(Path(s.path).name, s.why) for s in skipped] == [
        ("step-00000030", "no manifest.json (written last): incomplete"),
        ("step-00000040", "params.json does not match the manifest's checksum")]


def test_a_dcp_checkpoint_is_complete_once_its_metadata_is_written(tmp_path):
    dcp = tmp_path / "dcp"
    for step, complete in ((100, True), (200, False)):
        (dcp / f"step_{step}").mkdir(parents=True)
        (dcp / f"step_{step}" / "__0_0.distcp").write_bytes(b"x")
        if complete:
            (dcp / f"step_{step}" / ".metadata").write_bytes(b"meta")
    best, skipped = latest_complete(dcp, "auto")
    assert best.step == 100 and best.validator == "dcp" and "no .metadata" in skipped[0].why


def test_a_megatron_checkpoint_is_the_one_its_tracker_file_names(tmp_path):
    mega = tmp_path / "mega"
    (mega / "iter_0000300").mkdir(parents=True)
    (mega / "latest_checkpointed_iteration.txt").write_text("300\n")
    assert latest_complete(mega, "megatron")[0].path == str(mega / "iter_0000300")
    (mega / "latest_checkpointed_iteration.txt").write_text("400\n")
    best, skipped = latest_complete(mega, "megatron")
    assert best is None and "missing" in skipped[0].why


def test_a_missing_checkpoint_directory_has_no_checkpoint(tmp_path):
    assert latest_complete(tmp_path / "nothing-here") == (None, [])


# ---- classification ------------------------------------------------------------------
def _epilog_record(node: str, action: Action) -> JobHealthRecord:
    finding = HealthFinding(kind="xid", action=action, reason="GPU fell off the bus", source="healthd", xid=79, gpu=3)
    return JobHealthRecord(job_id="42", node=node, window_start="2026-11-22T02:00:00Z",
                           window_end="2026-11-22T03:00:00Z", written_at="2026-11-22T03:00:01Z", findings=(finding,))


def test_a_healthd_drain_and_an_epilog_record_blame_the_node_with_their_evidence():
    record = _epilog_record("node3", Action.DRAIN_REBOOT)
    outcome = classify(_report("FAILED", 143), ["node1", "node3", "node4"], NODES, {"node3": record}, "")
    assert outcome.kind == NODE_FAILURE and [b.node for b in outcome.blame] == ["node3"]
    assert outcome.blame[0].reason.startswith("healthd: xid 79 gpu3")
    assert outcome.blame[0].evidence == ("job 42 ended FAILED (exit 143)",
                                         "drained by healthd: healthd: xid 79 gpu3 (GPU-abc) 2026-11-22T03:00:00Z",
                                         "epilog record: drain-reboot (xid 79 gpu3 drain-reboot)")


def test_an_epilog_record_alone_blames_its_node():
    records = {"node4": _epilog_record("node4", Action.DRAIN_RESET)}
    outcome = classify(_report("FAILED", 1), ["node1", "node4"], HEALTHY, records, "")
    assert outcome.kind == NODE_FAILURE
    assert [(b.node, b.reason) for b in outcome.blame] == [("node4", "epilog: drain-reset")]


def test_an_epilog_record_of_the_programs_own_fault_blames_no_node():
    record = _epilog_record("node4", Action.APP_FAULT)
    assert classify(_report("FAILED", 1), ["node1", "node4"], HEALTHY, {"node4": record}, "").kind == PROGRAM_FAILURE


def test_node_fail_blames_the_node_that_stopped_responding():
    outcome = classify(_report("NODE_FAIL", 0), ["node1", "node2"], NODES, {}, "")
    assert outcome.kind == NODE_FAILURE and [b.node for b in outcome.blame] == ["node2"]
    assert outcome.blame[0].evidence[1] == "Slurm: job NODE_FAIL and node2 is not responding"


def test_node_fail_on_a_silent_node_an_admin_had_drained_keeps_the_admins_reason_as_evidence():
    reason = "GPU gone [/dev/nvidia3] [maint]"
    drained = {**HEALTHY, "node2": replace(NODES["node2"], state="mixed", flags=("DRAIN", "NOT_RESPONDING"),
                                           reason=reason)}
    outcome = classify(_report("NODE_FAIL", 0), ["node1", "node2"], drained, {}, "")
    assert [b.node for b in outcome.blame] == ["node2"]
    assert outcome.blame[0].evidence[1] == f"Slurm: job NODE_FAIL and node2 is not responding (reason {reason!r})"


def test_node_fail_blames_a_node_slurm_marked_down():
    down = {**HEALTHY, "node2": replace(HEALTHY["node2"], state="down", flags=("NOT_RESPONDING",),
                                        reason="Not responding")}
    assert classify(_report("NODE_FAIL", 0), ["node1", "node2"], down, {}, "").blame[0].reason == "node down"


def test_node_fail_with_every_node_healthy_now_resubmits_without_blame():
    lost = classify(_report("NODE_FAIL", 0), ["node1"], HEALTHY, {}, "")
    assert lost.kind == NODE_FAILURE and lost.blame == ()


@pytest.mark.parametrize(("state", "log", "kind"), [
    ("COMPLETED", "", COMPLETED),
    ("CANCELLED", "", USER_CANCELLED),
    ("TIMEOUT", "", RESUBMIT),
    ("PREEMPTED", "", RESUBMIT),
    ("FAILED", "OSError: [Errno 28] No space left on device: '/ckpt/step-9'", STORAGE),
    ("FAILED", "clusterctl: preflight failed: rank 0 runs on node1 but ...", MISPLACED),
    ("FAILED", "Traceback: ZeroDivisionError", PROGRAM_FAILURE),
    ("OUT_OF_MEMORY", "", PROGRAM_FAILURE),
])
def test_every_way_an_attempt_ends_has_one_meaning(state, log, kind):
    assert classify(_report(state), ["node1", "node4"], HEALTHY, {}, log).kind == kind


ADMIN_DRAIN = {**HEALTHY, "node4": replace(HEALTHY["node4"], flags=("DRAIN",), reason="maintenance")}


def test_an_admin_drain_never_ends_a_running_attempt():
    assert hardware_suspects(["node1", "node4"], ADMIN_DRAIN) == []


def test_a_straggler_drain_never_ends_a_running_attempt_but_a_failure_drain_does():
    slow = {**HEALTHY, "node4": replace(HEALTHY["node4"], flags=("DRAIN",),
                                        reason="healthd: straggler drain-reset 2026-11-23T05:27:48Z")}
    assert hardware_suspects(["node1", "node4"], slow) == []  # slow, not failed: excluded next time
    failed = {**HEALTHY, "node4": replace(HEALTHY["node4"], flags=("DRAIN",),
                                          reason="healthd: xid 79 gpu3 (GPU-x) drain-reboot")}
    assert [b.node for b in hardware_suspects(["node1", "node4"], failed)] == ["node4"]


def test_a_job_failing_by_itself_on_a_node_drained_as_a_straggler_is_the_programs_failure():
    slow = {**HEALTHY, "node4": replace(HEALTHY["node4"], flags=("DRAIN",),
                                        reason="healthd: straggler drain-reset 2026-11-23T05:27:48Z")}
    outcome = classify(_report("FAILED"), ["node1", "node4"], slow, {}, "Traceback: ZeroDivisionError")
    assert outcome.kind == PROGRAM_FAILURE and outcome.blame == ()


def test_an_admin_drain_is_the_weakest_evidence_after_a_failure():
    outcome = classify(_report("FAILED"), ["node1", "node4"], ADMIN_DRAIN, {}, "")
    assert outcome.kind == NODE_FAILURE and outcome.blame[0].reason == "drained: maintenance"


def test_a_healthd_drain_ends_a_running_attempt_at_once():
    assert [b.node for b in hardware_suspects(["node2", "node3"], NODES)] == ["node3"]


def test_a_missed_ping_ends_a_running_attempt_only_after_the_grace():
    assert [b.node for b in hardware_suspects(["node1", "node2", "node3"], NODES, {"node2": 29.0}, 30.0)] == ["node3"]
    assert [b.node for b in hardware_suspects(["node1", "node2", "node3"], NODES, {"node2": 31.0}, 30.0)] == [
        "node3", "node2"]


def test_an_attempt_ended_by_the_supervisor_keeps_the_blame_it_was_ended_for():
    ended = [Blame("node3", "healthd: xid 79", ("drained by healthd: healthd: xid 79",))]
    outcome = classify(_report("CANCELLED", 0), ["node3"], NODES, {}, "", ended)
    assert outcome.kind == NODE_FAILURE and outcome.blame[0].node == "node3"


# ---- restart policy ------------------------------------------------------------------
POLICY = RestartSection(max_restarts=5, max_program_failures=1, retry_budget=2, backoff_seconds=2.0,
                        backoff_max_seconds=5.0)
NODE = Outcome(NODE_FAILURE, "node", (Blame("node3", "xid", ()),))
PROGRAM = Outcome(PROGRAM_FAILURE, "exit 1")


def _journal(outcomes: list[tuple[Outcome, int | None]]) -> list[RunEvent]:
    """A journal as the supervisor writes it, deciding each outcome in turn."""
    events: list[RunEvent] = [Created(at=0.0, name="toy")]
    for number, (outcome, step) in enumerate(outcomes, 1):
        events.append(Submitted(at=float(number), attempt=number, job_id=str(number)))
        decision = judge(Happened(outcome, step), replay(events).budget, POLICY)
        action = decision.act.decision()
        events.append(Decided(at=float(number), attempt=number, job_id=str(number), state="FAILED", exit_code=1,
                              outcome=outcome.kind, message=decision.message,
                              blame=tuple(b.to_journal(1000.0) for b in outcome.blame), checkpoint_step=step,
                              checkpoint=None, action=action, delay=decision.delay))
        if action != DecisionAction.RESUBMIT:
            kind = EventKind.DONE if action == DecisionAction.DONE else EventKind.STOPPED
            events.append(RunEnded(kind=kind, at=float(number), message=decision.message))
            break
    return events


def _decided(events: list[RunEvent]) -> list[Decided]:
    return [e for e in events if isinstance(e, Decided)]


def test_progress_resubmits_at_once_and_stalls_back_off_then_stop():
    events = _journal([(NODE, 10), (NODE, 20), (NODE, 20), (NODE, 20), (NODE, 20)])
    assert [(d.action, d.delay) for d in _decided(events)] == [("resubmit", 0.0), ("resubmit", 0.0),
                                                               ("resubmit", 2.0), ("resubmit", 4.0), ("stop", 0.0)]
    assert "retry_budget = 2" in _decided(events)[-1].message


def test_a_blamed_node_stays_excluded_until_its_blame_expires():
    state = replay(_journal([(NODE, 10), (NODE, 20)]))
    assert state.excluded(999.0) == ["node3"] and state.excluded(1000.0) == []


def test_the_programs_own_failures_stop_after_the_allowed_retries_without_blame():
    events = _journal([(PROGRAM, None), (PROGRAM, None)])
    assert [d.action for d in _decided(events)] == ["resubmit", "stop"]
    ended = replay(events).ended
    assert ended is not None and ended.kind == EventKind.STOPPED and "no node blamed" in ended.message
    assert replay(events).blamed == {}


def test_max_restarts_is_a_hard_limit_even_with_progress():
    events = _journal([(NODE, step) for step in range(10, 100, 10)])
    assert sum(1 for d in _decided(events) if d.action == DecisionAction.RESUBMIT) == POLICY.max_restarts
    assert "max_restarts = 5 reached" in _decided(events)[-1].message


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([NODE, PROGRAM, Outcome(RESUBMIT, "timeout")]),
                          st.one_of(st.none(), st.integers(0, 50))), min_size=1, max_size=15))
def test_no_sequence_of_failures_loops_forever_or_outlives_its_limits(outcomes):
    events = _journal(outcomes)
    decided = _decided(events)
    resubmits = sum(1 for d in decided if d.action == DecisionAction.RESUBMIT)
    assert resubmits <= POLICY.max_restarts
    assert sum(1 for d in decided if d.outcome == PROGRAM_FAILURE and d.action == DecisionAction.RESUBMIT) \
        <= POLICY.max_program_failures
    assert all(0 <= d.delay <= POLICY.backoff_max_seconds for d in decided)
    # Replaying any prefix of the journal never yields more attempts than were submitted.
    for cut in range(len(events) + 1):
        assert len(replay(events[:cut]).attempts) <= sum(1 for e in events[:cut] if isinstance(e, Submitted))
    if len(decided) < len(outcomes):
        assert isinstance(events[-1], RunEnded)


def test_a_submission_cut_short_by_a_crash_is_forgotten_so_it_can_be_made_again():
    events: list[RunEvent] = [Submitting(at=1.0, attempt=1, comment="c1"), SubmitLost(at=2.0, attempt=1, comment="c1")]
    assert replay(events[:1]).current.job_id is None and replay(events) == RunState()


# ---- goodput -------------------------------------------------------------------------
def test_goodput_accounts_redone_work_queue_and_restart_overhead():
    checkpoints = [Checkpoint(f"/c/{s}", s, "manifest", written_at=t, save_seconds=2.0)
                   for s, t in ((10, 150.0), (20, 250.0), (30, 450.0))]
    attempts = [AttemptTimes(1, 100.0, 110.0, 300.0, failed=True, node_failure=True),  # last checkpoint at 250
                AttemptTimes(2, 310.0, 320.0, 500.0, failed=False, node_failure=False)]
    g = account(attempts, checkpoints, now=1000.0)
    assert (g.wall_seconds, g.queue_seconds, g.redone_seconds, g.restart_overhead_seconds) == (400.0, 20.0, 50.0, 10.0)
    assert g.productive_seconds == 190.0 + 180.0 - 50.0 and math.isclose(g.goodput, 320.0 / 400.0)
    assert g.node_failures == 1 and g.mtbf_seconds == 370.0 and g.checkpoint_interval_seconds == 150.0
    assert math.isclose(g.advised_interval_seconds, math.sqrt(2 * 2.0 * 370.0))
    assert young_daly(30.0, 3600.0 * 24) == pytest.approx(2276.8, rel=1e-3)


def test_the_lost_time_is_placed_span_by_span_where_goodput_counts_it():
    checkpoints = [Checkpoint(f"/c/{s}", s, "manifest", written_at=t) for s, t in ((10, 150.0), (20, 250.0))]
    attempts = [AttemptTimes(1, 100.0, 110.0, 300.0, failed=True, node_failure=True),
                AttemptTimes(2, 310.0, 320.0, 500.0, failed=False, node_failure=False)]
    restart_in_place = InAllocationRestart(at=420.0, restart_seconds=20.0)  # failed at 400: redone since 250

    spans = lost_spans(attempts, checkpoints, 1000.0, [restart_in_place])

    assert [(s.cause, s.start, s.end) for s in spans] == [
        (LOST_RESTART, 400.0, 420.0), (LOST_REDONE, 250.0, 400.0),
        (LOST_QUEUE, 100.0, 110.0), (LOST_REDONE, 250.0, 300.0),
        (LOST_RESTART, 300.0, 310.0), (LOST_QUEUE, 310.0, 320.0)]
    g = account(attempts, checkpoints, 1000.0, [restart_in_place])
    assert (g.queue_seconds, g.redone_seconds, g.restart_overhead_seconds) == (20.0, 200.0, 30.0)


def test_a_job_that_shrank_loses_capacity_as_its_own_cause_until_it_grows_or_ends():
    attempts = [AttemptTimes(1, 100.0, 110.0, 1110.0, failed=False, node_failure=False)]
    # At 410 the job went on at 2 of 3 replicas (a 10 s restart), at 710 at 1 of 3 (another node, 10 s).
    shrinks = [InAllocationRestart(at=410.0, restart_seconds=10.0, data_parallel=2, original_data_parallel=3),
               InAllocationRestart(at=710.0, restart_seconds=10.0, data_parallel=1, original_data_parallel=3)]

    g = account(attempts, [], now=2000.0, in_allocation=shrinks)
    full = account(attempts, [], now=2000.0, in_allocation=[InAllocationRestart(410.0, 10.0),
                                                            InAllocationRestart(710.0, 10.0)])

    assert g.reduced_capacity_seconds == pytest.approx(290.0 / 3 + 400.0 * 2 / 3)
    assert g.productive_seconds == pytest.approx(full.productive_seconds - g.reduced_capacity_seconds)
    assert (g.restart_overhead_seconds, g.node_failures) == (full.restart_overhead_seconds, 2)
    assert full.reduced_capacity_seconds == 0.0


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 50), st.floats(0, 500), st.booleans()), min_size=1,
                max_size=6),
       st.lists(st.floats(0, 3000), max_size=8))
def test_every_lost_span_lies_inside_the_run(gaps, stamps):
    attempts, t = [], 1000.0
    for number, (before, queued, ran, failed) in enumerate(gaps, 1):
        submit = t + before
        attempts.append(AttemptTimes(number, submit, submit + queued, submit + queued + ran, failed, failed))
        t = submit + queued + ran
    checkpoints = [Checkpoint(f"/c/{i}", i, "manifest", written_at=1000.0 + s) for i, s in enumerate(stamps)]

    spans = lost_spans(attempts, checkpoints, now=t + 100.0)

    assert all(attempts[0].submit <= s.start < s.end <= attempts[-1].end for s in spans)


def test_the_example_trainer_records_its_checkpoint_cost(tmp_path):
    path = toy_trainer.write_checkpoint(tmp_path, _state(10))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["save_seconds"] >= 0
    assert hashlib.sha256((path / "params.json").read_bytes()).hexdigest() == manifest["params_sha256"]


def test_a_job_cancelled_because_the_prolog_refused_a_node_is_a_node_failure():
    # Slurm 22.05 with --no-requeue: "Prolog launch failure" → the job is killed (CANCELLED),
    # and the prolog has drained the node with healthd's reason.
    outcome = classify(_report("CANCELLED", 0), ["node1", "node3"], NODES, {}, "")
    assert outcome.kind == NODE_FAILURE and [b.node for b in outcome.blame] == ["node3"]


def test_most_of_a_jobs_nodes_going_quiet_at_once_blames_none_of_them():
    # Seen on the 2-core testbed under load: slurmctld flags every node of a job not responding
    # for a ping or two.  That is the controller's trouble, not three hardware faults.
    quiet = {name: replace(n, flags=("NOT_RESPONDING",), reason="") for name, n in HEALTHY.items()}
    assert hardware_suspects(["node1", "node2", "node3"], quiet, {"node1": 60, "node2": 60, "node3": 60}, 30) == []
    assert classify(_report("NODE_FAIL", 0), ["node1", "node2", "node3"], quiet, {}, "").blame == ()
    assert classify(_report("FAILED", 1), ["node1", "node2", "node3"], quiet, {}, "").kind == PROGRAM_FAILURE


# ---- what a program asks for with its exit code (restart.exit_actions) -------------------------
SRUN_LOG = ("srun: error: node2: task 11: Exited with exit code 76\n"
            "srun: error: node2: tasks 8-10,12-15: Terminated\n"
            "srun: error: node1: tasks 0-7: Terminated\n")
ACTIONS = ((75, "restart"), (76, "exclude-node"), (77, "stop"))


def test_a_program_asking_to_exclude_its_node_gets_that_node_blamed():
    from clusterctl.launcher.pure.classify import classify
    outcome = classify(_report("FAILED", 143), ["node1", "node2", "node3"], {}, {}, SRUN_LOG, (), ACTIONS)
    assert outcome.kind == "node-failure" and [b.node for b in outcome.blame] == ["node2"]
    assert "the program asked to exclude-node (exit 76 on node2" in outcome.message


def test_a_program_asking_to_stop_is_not_restarted_and_one_asking_to_restart_is_not_counted_a_failure():
    from clusterctl.launcher.pure.classify import classify
    stop = classify(_report("FAILED", 143), ["node1"], {}, {}, "srun: error: node1: task 0: Exited with exit code 77\n",
                    (), ACTIONS)
    assert stop.kind == "program-asked-stop"
    assert judge(Happened(stop, 20), RestartBudget(), RestartSection()).act == "stop"
    again = classify(_report("FAILED", 75), ["node1"], {}, {}, "srun: error: node1: task 0: Exited with exit code 75\n",
                     (), ACTIONS)
    assert again.kind == "resubmit" and judge(Happened(again, 20), RestartBudget(),
                                              RestartSection(max_program_failures=0)).act == "resubmit"
    unmapped = classify(_report("FAILED", 3), ["node1"], {}, {}, "srun: error: node1: task 0: Exited with exit code 3\n",
                        (), ACTIONS)
    assert unmapped.kind == "program-failure"
