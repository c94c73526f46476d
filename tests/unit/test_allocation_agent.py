"""The in-allocation agent: a failed node is given back and a spare takes its place in a new step,
from the last complete checkpoint, with no queue in between; without a spare, the job ends."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from clusterctl.errors import SlurmCommandError
from clusterctl.launcher.allocation_agent import Agent, AgentDoors, after_step, resized_environment
from clusterctl.launcher.classify import Blame
from clusterctl.launcher.restart_policy import replay
from clusterctl.launcher.runs import create_run
from clusterctl.launcher.spec import load_spec
from clusterctl.records.run_journal import RecoveredInAllocation, read_run_journal
from clusterctl.slurm.nodes import NodeState

SPEC = """
[job]
name = "toy"
nodes = 2
spare_nodes = 1
gpus_per_node = 8
[launch]
command = ["python3", "train.py"]
[parallel]
tp = 8
pp = 2
[checkpoint]
dir = "{run_dir}/checkpoints"
validator = "manifest"
resume_args = ["--resume", "{path}"]
"""


class FakeStep:
    def __init__(self, argv, env, script):
        self.argv, self.env, self.script = argv, env, script
        self.code = None
        self.stopped = False

    def exit_code(self):
        self.script.tick(self)
        return self.code

    def stop(self, grace):
        self.stopped = True
        self.code = 143
        return self.code


class Cluster:
    """Slurm and the steps as the agent sees them; `fail_after` polls a node is drained by healthd."""

    def __init__(self, fail: list[str]):
        self.states = {n: NodeState(n, "allocated", (), "", ("gpu",)) for n in ("node1", "node2", "node3")}
        self.fail, self.polls, self.steps, self.shrinks = list(fail), 0, [], []

    def tick(self, step):
        self.polls += 1
        if self.polls == 3 and self.fail:
            bad = self.fail.pop(0)
            self.states[bad] = NodeState(bad, "mixed", ("DRAIN",), "healthd: xid 79 gpu3 (GPU-x) drain-reboot "
                                                                  "2026-11-22T03:00:00Z", ("gpu",))
        if self.polls >= 40 and not step.stopped:
            step.code = 0

    def start(self, argv, env):
        step = FakeStep(argv, env, self)
        self.steps.append(step)
        self.polls = 0
        return step


class FakeSlurm:
    def __init__(self, cluster):
        self.cluster = cluster

    def show_topology(self):
        return ""

    def shrink_job(self, job_id, keep):
        self.cluster.shrinks.append((job_id, tuple(keep)))


def agent(tmp_path: Path, cluster: Cluster) -> Agent:
    spec_path = tmp_path / "toy.toml"
    spec_path.write_text(SPEC)
    spec = load_spec(spec_path)
    run = create_run(tmp_path / "run", spec, SPEC)
    checkpoint = run.path / "checkpoints" / "step-00000020"
    checkpoint.mkdir(parents=True)
    (checkpoint / "params.json").write_bytes(b"{}")
    (checkpoint / "manifest.json").write_text(json.dumps({"step": 20, "params_sha256": hashlib.sha256(b"{}").hexdigest()}))
    environ = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]", "SLURMD_NODENAME": "node1",
               "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_CPUS_PER_NODE": "16(x3)"}
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds

    doors = AgentDoors(FakeSlurm(cluster), lambda name: cluster.states[name], cluster.start,  # type: ignore[arg-type]
                       monotonic=lambda: clock[0], now=lambda: 1795305600.0 + clock[0], sleep=sleep,
                       say=lambda message: None)
    return Agent(run.path, run.path / "jobs" / "42", spec, environ, doors, python="/venv/bin/python")


def test_a_drained_node_is_given_back_and_a_spare_runs_the_next_step_from_the_checkpoint(tmp_path):
    cluster = Cluster(fail=["node2"])
    shell = agent(tmp_path, cluster)
    assert shell.run(None) == 0
    first, second = cluster.steps
    assert first.stopped and not second.stopped
    assert cluster.shrinks == [("42", ("node1", "node3"))]
    assert second.env["SLURM_JOB_NODELIST"] == "node[1,3]" and second.env["SLURM_JOB_CPUS_PER_NODE"] == "16(x2)"
    assert second.argv[-2:] == ["--resume", str(shell.run_dir / "checkpoints" / "step-00000020")]
    events = [e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
              if isinstance(e, RecoveredInAllocation)]
    assert [(e.restart, [b.node for b in e.blame], e.given_back, e.checkpoint_step) for e in events] == \
        [(1, ["node2"], ("node2",), 20)]
    assert sorted(events[0].nodes) == ["node1", "node3"]
    assert "node2" in replay(read_run_journal(shell.run_dir / "journal.jsonl").events).blamed


def test_with_no_spare_left_the_job_ends_with_the_node_still_in_it_for_the_supervisor(tmp_path):
    cluster = Cluster(fail=["node2", "node3"])
    shell = agent(tmp_path, cluster)
    assert shell.run(None) == 143
    assert len(cluster.steps) == 2 and cluster.shrinks == [("42", ("node1", "node3"))]  # node3 stays: blamed by the supervisor


def test_a_step_that_fails_with_every_node_healthy_is_left_to_the_supervisor():
    assert after_step(3, [], ["node1", "node2", "node3"], 2).exit_code == 3
    assert after_step(0, [], ["node1", "node2"], 2).exit_code == 0


@given(st.integers(1, 64), st.integers(0, 8), st.integers(0, 8))
def test_a_restart_happens_exactly_when_enough_nodes_remain(needed, spares, failed):
    nodes = [f"n{i}" for i in range(needed + spares)]
    failed = min(failed, len(nodes))
    suspects = [Blame(n, "drained", ()) for n in nodes[:failed]]
    decision = after_step(143, suspects, nodes, needed)
    if failed == 0:
        assert decision.exit_code == 143
    else:
        assert decision.restart == (failed <= spares)
        if decision.restart:
            assert len(decision.nodes) == needed + spares - failed and not set(decision.nodes) & set(nodes[:failed])


def test_the_resized_environment_names_only_the_nodes_kept():
    env = resized_environment({"SLURM_JOB_NODELIST": "node[1-3]", "SLURM_NNODES": "3",
                               "SLURM_TASKS_PER_NODE": "8(x3)", "OTHER": "x"}, ["node1", "node3"])
    assert (env["SLURM_JOB_NODELIST"], env["SLURM_NNODES"], env["SLURM_TASKS_PER_NODE"], env["OTHER"]) == \
        ("node[1,3]", "2", "8(x2)", "x")


def test_a_node_slurm_cannot_be_asked_about_is_judged_without(tmp_path):
    cluster = Cluster(fail=[])
    shell = agent(tmp_path, cluster)

    def flaky(name):
        if name == "node2":
            raise SlurmCommandError(["sinfo"], 1, "timed out")
        return cluster.states[name]

    shell.doors.node_state = flaky
    assert shell.run(None) == 0 and cluster.shrinks == []
