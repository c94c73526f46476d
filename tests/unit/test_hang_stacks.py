"""A hung step's evidence: each rank's Python stack read on its node, summarised for the journal and report."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from clusterctl.launcher.job.rank_stacks import (
    dump_stacks, find_py_spy, keep_flight_recorder, stacks_main, stacks_srun_argv,
)
from clusterctl.launcher.pure.hang_stacks import (
    COMPARE_NODES, MAX_GROUPS, MAX_STUCK_NODES, nodes_to_dump, stack_groups, summarize_stacks,
)
from clusterctl.records.node_stacks import (
    STACK_STATUSES, Frame, NodeStacks, RankStack, read_node_stacks, stacks_dir, write_node_stacks,
)
from clusterctl.records.rank_progress import RankProgress, write_rank_progress
from clusterctl.records.run_journal import RecoveredInAllocation, event_from_json, event_to_json
from clusterctl.records.versioned import RecordError

STUCK_PROGRAM = """
import sys, time
def wait_in_barrier():
    print("ready", flush=True)
    time.sleep(120)
wait_in_barrier()
"""

COLLECTIVE = (Frame("all_reduce", "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2501),
              Frame("train_step", "/home/u/train.py", 42))
LOADER = (Frame("load_batch", "/home/u/loader.py", 88), Frame("train_step", "/home/u/train.py", 40))


def _record(node: str, ranks: dict[int, tuple[Frame, ...] | str], flight: tuple[str, ...] = ()) -> NodeStacks:
    stacks = tuple(RankStack(r, 1000 + r, "dumped", f, 3) if isinstance(f, tuple) else RankStack(r, 1000 + r, f)
                   for r, f in ranks.items())
    return NodeStacks(node, "77", "1", 1700000000.0, stacks, flight)


def test_a_node_stacks_record_round_trips_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    record = _record("node2", {3: LOADER, 7: "gone"}, ("nccl_trace_rank_3",))
    path = write_node_stacks(tmp_path, record)
    assert path == stacks_dir(tmp_path) / "node2.json"
    assert read_node_stacks(path) == record
    path.write_text(path.read_text().replace('"version": 1', '"version": 2'))
    with pytest.raises(RecordError, match="newer"):
        read_node_stacks(path)


def test_the_stacks_step_runs_once_on_each_chosen_node_beside_the_hung_step() -> None:
    assert stacks_srun_argv("/venv/bin/python", "77", ["node2", "node1", "node3"], Path("/runs/r/job-77/restart-1"),
                            "2") == [
        "srun", "--overlap", "--jobid=77", "--nodelist=node[1-3]", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
        "--kill-on-bad-exit=0", "--quiet", "/venv/bin/python", "-m", "clusterctl.launcher.job", "stacks",
        "--job-dir", "/runs/r/job-77/restart-1", "--launch", "2"]


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed beside this Python")
def test_a_rank_stuck_in_a_function_is_dumped_on_its_node_and_a_gone_one_said_so(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", STUCK_PROGRAM], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        job_dir = tmp_path / "job"
        now = time.time()
        write_rank_progress(job_dir, RankProgress(rank=5, node="node1", step=10, phase="step", at=now, pid=child.pid))
        write_rank_progress(job_dir, RankProgress(rank=4, node="node1", step=10, phase="step", at=now, pid=2**22 + 7))
        write_rank_progress(job_dir, RankProgress(rank=9, node="node2", step=10, phase="step", at=now, pid=child.pid))
        env = {"SLURMD_NODENAME": "node1", "SLURM_JOB_ID": "77", "CLUSTERCTL_NODE_TMP": str(tmp_path / "local")}
        started = time.monotonic()
        assert stacks_main(job_dir, "0", env) == 0
        assert time.monotonic() - started < 10
    finally:
        child.kill()
        child.wait()
    record = read_node_stacks(stacks_dir(job_dir) / "node1.json")
    assert [(r.rank, r.status) for r in record.ranks] == [(4, "gone"), (5, "dumped")]
    assert record.ranks[1].frames[0].function == "wait_in_barrier"
    assert record.notes == ("flight recorder off in the job's environment (TORCH_NCCL_TRACE_BUFFER_SIZE not set)",)
    lines = summarize_stacks([record], ["node1", "node2"])
    assert lines[0].startswith("rank 5 on node1 in wait_in_barrier (<string>:")
    assert "rank 4 on node1: no stack (the process had ended)" in lines
    assert "no stacks from node2 (no answer in time)" in lines


def test_without_py_spy_every_rank_says_so() -> None:
    ranks = [RankProgress(rank=0, node="n1", step=1, phase="step", at=1.0, pid=123)]
    assert dump_stacks(ranks, None) == (RankStack(0, 123, "no-py-spy"),)


def test_flight_recorder_dumps_of_the_nodes_ranks_are_kept(tmp_path: Path) -> None:
    (tmp_path / "fr_3").write_bytes(b"pickle")
    kept, note = keep_flight_recorder({"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_"),
                                       "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}, [3, 4], tmp_path / "kept")
    assert (kept, note) == (("fr_3",), "")
    assert (tmp_path / "kept" / "fr_3").read_bytes() == b"pickle"
    kept, note = keep_flight_recorder({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                                       "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "none_")}, [0], tmp_path / "k2")
    assert kept == () and "no flight-recorder dump" in note


def test_the_summary_names_where_the_ranks_wait_and_which_never_arrived() -> None:
    records = [_record("node1", {r: COLLECTIVE for r in range(4)}),
               _record("node2", {4: COLLECTIVE, 5: COLLECTIVE, 6: COLLECTIVE, 3: COLLECTIVE, 7: LOADER})]
    records[1] = NodeStacks("node2", "77", "1", 1.0, tuple(
        RankStack(r, 1000 + r, "dumped", LOADER if r in (3, 7) else COLLECTIVE, 3) for r in range(3, 8)))
    records[0] = _record("node1", {r: COLLECTIVE for r in range(3)})
    assert summarize_stacks(records, ["node1", "node2"]) == (
        "ranks 0-2,4-6 on node[1-2] in all_reduce (distributed_c10d.py:2501) from train.py:42",
        "ranks 3,7 on node2 in load_batch (loader.py:88)",
        "ranks 3,7 never arrived at all_reduce (distributed_c10d.py:2501) from train.py:42, where 6 other ranks wait",
        "no PyTorch flight-recorder dump on the nodes asked (the job must set TORCH_NCCL_TRACE_BUFFER_SIZE; NCCL only)")


def test_when_every_rank_waits_in_one_place_the_hang_watch_names_the_first_to_stop() -> None:
    lines = summarize_stacks([_record("node1", {0: COLLECTIVE, 1: COLLECTIVE})], ["node1"], first_stopped=[1])
    assert lines[1] == "the hang watch saw rank 1 stop first"


FRAMES = st.sampled_from([COLLECTIVE, LOADER, (Frame("barrier", "/x/site-packages/t.py", 5),),
                          *[(Frame(f"f{i}", "/home/u/a.py", i),) for i in range(8)]])
NODE_RECORDS = st.dictionaries(st.sampled_from(["node1", "node2", "node3", "node4"]),
                               st.dictionaries(st.integers(0, 40), st.one_of(FRAMES, st.sampled_from(STACK_STATUSES[1:]))),
                               max_size=4)


@given(NODE_RECORDS, st.randoms())
def test_every_dumped_rank_is_in_one_group_whatever_the_order_and_the_summary_stays_short(
        nodes: dict[str, dict[int, tuple[Frame, ...] | str]], shuffle: object) -> None:
    records = [_record(node, ranks) for node, ranks in nodes.items()]
    groups = stack_groups(records)
    grouped = [r for g in groups for r in g.ranks]
    dumped = {r.rank for rec in records for r in rec.ranks if r.status == "dumped"}
    assert sorted(grouped) == sorted(dumped)
    assert [len(g.ranks) for g in groups] == sorted((len(g.ranks) for g in groups), reverse=True)
    shuffled = list(records)
    shuffle.shuffle(shuffled)  # type: ignore[attr-defined]
    assert stack_groups(shuffled) == groups
    assert len(summarize_stacks(records, list(nodes))) <= MAX_GROUPS + 6


@given(st.lists(st.sampled_from([f"n{i}" for i in range(30)]), max_size=40),
       st.lists(st.sampled_from([f"n{i}" for i in range(30)]), min_size=1, max_size=30, unique=True))
def test_the_nodes_asked_are_bounded_whatever_the_jobs_size(suspects: list[str], step: list[str]) -> None:
    chosen = nodes_to_dump(suspects, step)
    assert len(chosen) == len(set(chosen)) <= MAX_STUCK_NODES + COMPARE_NODES
    assert set(chosen) <= set(step)
    stuck = [n for n in dict.fromkeys(suspects) if n in step]
    assert chosen[:min(len(stuck), MAX_STUCK_NODES)] == tuple(stuck[:MAX_STUCK_NODES])


def test_the_journal_keeps_the_stacks_with_the_recovery_and_reads_journals_without_them() -> None:
    event = RecoveredInAllocation(at=1.0, job_id="77", restart=1, blame=(), nodes=("node1",), reason="every rank hung",
                                  stacks=("ranks 0-7 on node1 in all_reduce (c10d.py:1)",))
    assert event_from_json(event_to_json(event), "journal:1") == event
    old = event_to_json(RecoveredInAllocation(at=1.0, job_id="77", restart=1, blame=(), nodes=("node1",)))
    assert "stacks" not in old and event_from_json(old, "journal:1").stacks == ()


def test_clusterctl_report_shows_where_the_hung_ranks_were() -> None:
    import io

    from rich.console import Console

    from clusterctl.launcher.login.report import report_renderables, run_report
    from clusterctl.records.run_journal import Created
    lines = ("ranks 0-2,4-6 on node[1-2] in all_reduce (distributed_c10d.py:2501) from train.py:42",
             "ranks 3,7 never arrived at all_reduce (distributed_c10d.py:2501) from train.py:42, where 6 other ranks wait")
    events = [Created(at=0.0, name="r"),
              RecoveredInAllocation(at=100.0, job_id="77", restart=1, blame=(), nodes=("node1", "node2"),
                                    reason="every rank hung", stacks=lines)]
    report = run_report(Path("/runs/r"), events, [], [], 300.0)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(report_renderables(report))
    shown = out.getvalue()
    assert "where the hung ranks were (their Python stacks, read before the step was ended):" in shown
    assert all(line in shown for line in lines)
    assert report.to_json()["in_allocation"][0]["stacks"] == list(lines)
