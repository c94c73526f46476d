"""The recovery benchmark's own logic, without a testbed: the compared job's spec for each way of saving,
when the fault may come, what a job's log says of its resume, and the side-by-side line per case
(bench/recovery_bench.py measures on the testbed; no timing here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from clusterctl.launcher.pure.spec import parse_spec
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy
from tests.conftest import import_testbed

import_testbed()  # the bench drives the testbed; its pure parts are tested here
BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import recovery_bench as bench  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_compared_job_saves_the_way_asked_with_the_state_and_bandwidth_asked() -> None:
    shared = parse_spec(bench.compare_spec(EXAMPLES, "resubmit", "shared", state_mb=1024, shared_mb_per_s=100))
    tiers = parse_spec(bench.compare_spec(EXAMPLES, "in-allocation", "tiers", state_mb=1024, shared_mb_per_s=100,
                                          flush_every_steps=40))
    assert (shared.checkpoint.tiers, shared.checkpoint.validator, shared.restart.recover) == \
        (False, "manifest", "resubmit")
    assert (tiers.checkpoint.tiers, tiers.checkpoint.keep, tiers.checkpoint.flush_every_steps,
            tiers.checkpoint.shared_mb_per_s, tiers.restart.recover) == (True, 2, 40, 100.0, "in-allocation")
    # The same job and state both ways; today's reads and writes its state at shared storage's bandwidth,
    # and every rank waits longer than three such saves of the slowest rank before giving a peer up.
    assert shared.launch.command[:-2] == tiers.launch.command
    assert shared.launch.command[-2:] == ("--shared-mb-per-s", "100")
    assert tiers.launch.command[tiers.launch.command.index("--state-mb") + 1] == "1024"
    assert tiers.launch.command[tiers.launch.command.index("--peer-timeout") + 1] == "41"
    plain = parse_spec(bench.compare_spec(EXAMPLES, "in-allocation", "shared"))
    assert "--state-mb" not in plain.launch.command and plain.launch.command[-1] == "15"


def held(node: str, *copies: tuple[int, str, str]) -> CheckpointHoldings:
    return CheckpointHoldings(node, tuple(HeldCopy(step, of, tier, 0, 2, 1.0, 0.1) for step, of, tier in copies))


def test_the_no_spare_job_may_shrink_one_way_and_may_not_the_other_on_the_same_three_nodes() -> None:
    shrinks = parse_spec(bench.compare_spec(EXAMPLES, "shrink", "shared"))
    queues = parse_spec(bench.compare_spec(EXAMPLES, "no-spare-resubmit", "shared"))
    for spec in (shrinks, queues):
        assert (spec.job.nodes, spec.job.spare_nodes, spec.parallel.dp, spec.restart.recover) == \
            (3, 0, 3, "in-allocation")
    assert (shrinks.restart.min_data_parallel, queues.restart.min_data_parallel) == (2, 3)
    cases = bench.compare_cases(["xid"], ["busy"], ["shared"], ("shrink", "no-spare-resubmit"))
    assert [(label, recover) for label, recover, *_ in cases] == [
        ("no spare, shrink, busy queue", "shrink"), ("no spare, resubmission, busy queue", "no-spare-resubmit")]


def test_the_fault_comes_once_every_node_holds_a_step_and_has_it_on_its_buddy() -> None:
    node1 = held("node1", (30, "node1", "local"), (20, "node1", "local"), (20, "node2", "buddy"),
                 (10, "node1", "shared"))
    node2 = held("node2", (30, "node2", "local"), (20, "node2", "local"), (20, "node1", "buddy"))
    assert bench.replicated_step([node1, node2], ["node1", "node2"]) == 20, "30 is not on the buddies yet"
    assert bench.replicated_step([node1], ["node1", "node2"]) is None
    assert bench.replicated_step([], ["node1"]) is None


def test_the_log_says_where_the_slowest_node_resumed_from_and_how_long_rank_0_read() -> None:
    log = """\
clusterctl.checkpoint: resuming step 20 on node1: slot 0's files from this node's own copy in 0.81 s
clusterctl.checkpoint: resuming step 20 on node3: slot 1's files from node2's copy on node1 in 2.47 s
[node1 rank 0] resumed step 20 from this node's own copy (128 MB of this rank's bulk state with it, in 1.12 s); world size 16
"""
    assert bench.resume_reads(log) == {"staged_s": 2.47, "staged_from": "node2's copy on node1 (on node3)",
                                       "read_s": 1.12}
    shared = "[node1 rank 0] resumed from /run/checkpoints/step-00000020 (128 MB of this rank's bulk state " \
             "with it, in 10.40 s); world size 16\n"
    assert bench.resume_reads(shared) == {"read_s": 10.4}
    assert bench.resume_reads("[node1 rank 0] resumed from /run/checkpoints/step-00000020; world size 16\n") == {}


def test_each_case_runs_both_ways_and_gets_one_line_comparing_them() -> None:
    cases = bench.compare_cases(("xid",), ("idle",), ("shared", "tiers"))
    assert [(label, recover, fault, checkpoint) for label, recover, _, fault, checkpoint in cases] == [
        ("in-allocation, idle queue, shared", "in-allocation", "xid", "shared"),
        ("in-allocation, idle queue, tiers", "in-allocation", "xid", "tiers"),
        ("resubmission, idle queue, shared", "resubmit", "xid", "shared"),
        ("resubmission, idle queue, tiers", "resubmit", "xid", "tiers")]
    assert [c[0] for c in bench.compare_cases(("kill-batch-host",), ("busy",), ("shared",))] == [
        "batch host killed, in-allocation, busy queue", "batch host killed, resubmission, busy queue"]
    assert [c[0] for c in bench.compare_cases(("kill-batch-host",), ("busy",), ("shared",), ("in-allocation",))] == [
        "batch host killed, in-allocation, busy queue"], "--recover keeps one way"
    trials = {"in-allocation, idle queue, shared": [{"node": "node2", "total": 14.0, "read_s": 10.2},
                                                    {"node": "node2", "total": 16.0, "read_s": 10.6},
                                                    {"node": "node2", "total": 15.0, "read_s": 10.4}],
              "in-allocation, idle queue, tiers": [{"node": "node2", "total": 5.0, "staged_s": 2.0},
                                                   {"node": "node2", "total": 4.0}]}
    summary = bench.summarize(trials)
    assert summary["in-allocation, idle queue, shared"]["total"] == {"median": 15.0, "min": 14.0, "max": 16.0}
    assert set(summary["in-allocation, idle queue, tiers"]) == {"total"}, "a figure not every trial had is left out"
    assert bench.side_by_side(summary) == [
        "in-allocation, idle queue: fault → stepping again 15.00 s with shared storage, 4.50 s with tiers (3.3x)"]


@pytest.mark.parametrize("argv", [["--checkpoint", "nvme"], ["--queues", ""], ["--state-mb", "-1"],
                                  ["--faults", "xid,power"], ["--recover", "requeue"]])
def test_a_wrong_option_is_a_usage_error_naming_it(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(argv)
    assert exited.value.code == 2
    assert argv[0] in capsys.readouterr().err
