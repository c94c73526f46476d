"""Jobs without spares (no in-allocation agent) get the straggler watch from their supervisor: it reads
the ranks' progress from the run directory, asks the slow node's GPUs, journals the straggler, drains
it when the GPUs agree, and the next submission avoids it (`exclude`); `report` only tells."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterctl.launcher.shared.runs import RunDir, create_run
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.login.supervisor import EXIT_DONE, Hooks, Supervisor
from clusterctl.records.gpu_evidence import GpuEvidence, GpuReading
from clusterctl.records.node_step_times import read_node_step_times
from clusterctl.records.rank_progress import RankProgress, write_rank_progress
from clusterctl.records.run_journal import StragglerFound, append_run_event
from clusterctl.slurm import hostlist
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.drains import SlurmDrains
from tests.fakes import FakeNodeTable
from tests.conftest import REPO
from tests.unit.test_supervisor_loop import Clock, ScriptedSlurm

THROTTLED = GpuEvidence("node2", 1e9, (GpuReading(3, "GPU-3", 0x60, 792, 1980, 88),))
STEP_SECONDS = {"node1": 0.05, "node2": 0.15, "node3": 0.05}  # node2's ranks compute 3x slower


def _run(tmp_path, action: str, journaled_before: bool = False, damaged_ranks: tuple[int, ...] = ()):
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    # A template of its own: a job with no in-job agent, whose straggler watch is the supervisor's.
    template = tmp_path / "mine.sbatch"
    template.write_text("#!/bin/bash\n{{header}}\nsrun {{command}}\n")
    spec = replace(spec, stragglers=replace(spec.stragglers, action=action),
                   launch=replace(spec.launch, template=str(template)))
    run = create_run(tmp_path / "run", spec, "")
    if journaled_before:  # what a supervisor that died meanwhile had found in job 1
        append_run_event(run.path / "journal.jsonl", StragglerFound(
            at=1e9, job_id="1", node="node2", ranks=tuple(range(8, 16)), ratio=3.0, seconds=0.15, reference=0.05,
            steps=30, since_step=11, lost_s=3.5, evidence=("found before",)))
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    slurm.nodes["node5"] = {"state": "idle", "flags": [], "reason": ""}  # enough left without node2 and node3
    said: list[str] = []
    asked: list[tuple[str, str | None]] = []
    table = FakeNodeTable(["node1", "node2", "node3", "node5"])
    drained = table.drains
    hooks = Hooks(clock=clock.time, sleep=clock.sleep, say=said.append,
                  gpu_evidence=lambda node, env: asked.append((node, env.get("SLURM_JOB_ID"))) or THROTTLED,
                  drain=SlurmDrains(runner=table).drain)
    steps = [0]

    def script() -> None:
        job = slurm.jobs.get("1")
        if job is None or job["job_state"] != "RUNNING":
            if "2" in slurm.jobs:
                slurm.end("2", "COMPLETED")
            return
        # Job 1's 24 ranks (8 per node) step on: 5 steps per poll, node2's slower.
        steps[0] += 5
        for rank in range(24):
            node = f"node{rank // 8 + 1}"
            write_rank_progress(run.path / "jobs" / "1", RankProgress(
                rank, node, steps[0], "step", clock.now, 100 + rank, round(steps[0] * STEP_SECONDS[node], 6),
                steps[0]))
        for rank in damaged_ranks:  # a rank whose file is damaged (or planted) at every poll
            (run.path / "jobs" / "1" / "progress" / f"{rank}.json").write_text("{not json")
        if steps[0] >= 120:  # then a node of the job fails: the next attempt shows what was excluded
            slurm.nodes["node3"].update(flags=["DRAIN"], reason="healthd: xid 79 gpu3 (GPU-x) drain-reboot")
    slurm.on_poll = script
    supervisor = Supervisor(RunDir(run.path), Slurm(slurm), "/py", None, hooks, evidence_grace=0.0)
    assert supervisor.supervise() == EXIT_DONE
    stragglers = [e for e in run.events() if e.event == "straggler"]
    return run, slurm, said, asked, drained, stragglers


def _excluded(slurm: ScriptedSlurm) -> list[str]:
    """The nodes the second submission excluded."""
    return hostlist.expand(next(a for a in slurm.sbatch_calls[1] if a.startswith("--exclude=")).split("=", 1)[1])


def test_exclude_a_straggler_found_by_the_supervisor_is_drained_with_its_gpus_evidence_and_avoided_next_time(
        tmp_path):
    run, slurm, said, asked, drained, stragglers = _run(tmp_path, "exclude")
    [event] = stragglers
    assert (event.node, event.action, event.job_id, event.ranks) == ("node2", "excluded", "1", tuple(range(8, 16)))
    assert event.ratio == pytest.approx(3.0, rel=0.05)
    assert asked == [("node2", "1")]  # asked as a step of job 1
    assert [n for n, _ in drained] == ["node2"] and drained[0][1].startswith("clusterctl straggler: slow-gpus ")
    assert _excluded(slurm) == ["node2", "node3"]
    table = read_node_step_times(run.path / "jobs" / "1")
    assert table is not None and {line.node: line.state for line in table.nodes}["node2"] == "straggler"
    assert any(line.startswith("straggler node2:") for line in said)


def test_report_a_straggler_found_by_the_supervisor_is_journaled_but_neither_drained_nor_avoided(tmp_path):
    run, slurm, said, asked, drained, stragglers = _run(tmp_path, "report")
    [event] = stragglers
    assert (event.node, event.action, event.blame) == ("node2", "reported", ())
    assert drained == []
    assert _excluded(slurm) == ["node3"]


def test_a_supervisor_started_again_neither_journals_nor_drains_a_straggler_twice(tmp_path):
    run, slurm, said, asked, drained, stragglers = _run(tmp_path, "report", journaled_before=True)
    assert [e.evidence for e in stragglers] == [("found before",)]
    assert asked == [] and drained == []


def test_unreadable_rank_progress_files_are_said_once_each_with_what_they_cost_and_the_rest_still_judged(tmp_path):
    run, slurm, said, asked, drained, stragglers = _run(tmp_path, "report", damaged_ranks=tuple(range(9)))
    warnings = [line for line in said if "rank progress" in line]
    # Five named (once each, not at every poll), the other four counted, and what it costs.
    assert len(warnings) == 6
    assert all(line.startswith("warning: job 1: ") for line in warnings)
    assert sum("0.json" in line for line in warnings) == 1
    assert "left out of the straggler watch" in warnings[0]
    assert warnings[-1] == ("warning: job 1: 4 more rank progress file(s) not read; those ranks are left out of "
                            "the straggler watch")
    # The readable ranks are still judged: node2 is found from ranks 9-15.
    assert [e.node for e in stragglers] == ["node2"]
