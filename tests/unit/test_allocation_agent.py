"""The in-allocation agent: a failed node is given back and a spare takes its place in a new step,
from the last complete checkpoint, with no queue in between; without a spare, the job ends."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from clusterctl.errors import SlurmCommandError
from clusterctl.launcher.job.agent import Agent, AgentDoors
from clusterctl.launcher.job.step_launch import resized_environment
from clusterctl.launcher.job.steps import plan_for_job
from clusterctl.launcher.pure import placement
from clusterctl.launcher.pure.parallel import ParallelLayout
from clusterctl.launcher.pure.restart_policy import replay
from clusterctl.launcher.shared.runs import create_run
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.records.gpu_evidence import GpuEvidence, GpuReading
from clusterctl.records.resume_failure import BadCopy
from clusterctl.records.run_journal import (
    Decided, DecisionAction, OutcomeKind, RecoveredInAllocation, Resumed, Submitted, append_run_event, read_run_journal,
)
from clusterctl.slurm.nodes import NodeState
from clusterctl.slurm.drains import SlurmDrains
from tests.fakes import FakeNodeTable

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
        self.stopped, self.grace = True, grace
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
    """The agent's Slurm (clusterctl.slurm.commands.AllocationSlurm): no topology; shrinks recorded."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def show_topology(self) -> str:
        return ""

    def shrink_job(self, job_id: str, keep: Sequence[str]) -> None:
        self.cluster.shrinks.append((job_id, tuple(keep)))


def agent(tmp_path: Path, cluster: Cluster, text: str = SPEC, batch_host: str = "node1") -> Agent:
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec_path = tmp_path / "toy.toml"
    spec_path.write_text(text)
    spec = load_spec(spec_path)
    run = create_run(tmp_path / "run", spec, text)
    checkpoint = run.path / "checkpoints" / "step-00000020"
    checkpoint.mkdir(parents=True)
    (checkpoint / "params.json").write_bytes(b"{}")
    (checkpoint / "manifest.json").write_text(json.dumps({"step": 20, "params_sha256": hashlib.sha256(b"{}").hexdigest()}))
    environ = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]", "SLURMD_NODENAME": batch_host,
               "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_CPUS_PER_NODE": "16(x3)"}
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds

    doors = AgentDoors(FakeSlurm(cluster), lambda name: cluster.states[name], cluster.start,
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


class RendezvousCluster(Cluster):
    """The node of the first step's rank 0 (torchrun's rendezvous host) is drained by healthd."""

    def tick(self, step):
        if len(self.steps) == 1 and self.polls == 2:
            from clusterctl.records.rank_map import read_rank_map
            self.fail = [read_rank_map(Path(step.argv[step.argv.index("--job-dir") + 1])).master_addr]
        super().tick(step)


def test_torchrun_whose_rendezvous_host_fails_goes_on_on_the_spare_with_a_new_rendezvous_host(tmp_path):
    cluster = RendezvousCluster(fail=[])
    shell = agent(tmp_path, cluster, SPEC.replace("[launch]\n", '[launch]\nstyle = "torchrun"\n'),
                  batch_host="node3")
    assert shell.run(None) == 0
    first, second = cluster.steps
    from clusterctl.records.rank_map import read_rank_map
    maps = [read_rank_map(Path(step.argv[step.argv.index("--job-dir") + 1])) for step in (first, second)]
    failed = maps[0].master_addr
    assert failed in maps[0].slots and failed not in maps[1].slots
    assert maps[1].master_addr in maps[1].slots and sorted(maps[1].slots) == sorted({"node1", "node2", "node3"} - {failed})
    # One torchrun per node, placed by the node file (not one task per GPU).
    for step, rank_map in zip((first, second), maps):
        assert step.argv[:7] == ["srun", "--distribution=arbitrary", "--ntasks=2", "--kill-on-bad-exit=1",
                                 "--overlap", "--job-name=clusterctl-ranks", "/venv/bin/python"]
        assert step.argv[9:11] == ["node", "--job-dir"]
        job_dir = Path(step.argv[11])
        assert step.env["SLURM_HOSTFILE"] == str(job_dir / "nodefile")
        assert (job_dir / "nodefile").read_text().split() == list(rank_map.slots)
    assert second.argv[-2:] == ["--resume", str(shell.run_dir / "checkpoints" / "step-00000020")]
    assert [(job, set(kept)) for job, kept in cluster.shrinks] == [("42", set(maps[1].slots))]


def test_with_no_spare_left_the_job_ends_with_the_node_still_in_it_for_the_supervisor(tmp_path):
    cluster = Cluster(fail=["node2", "node3"])
    shell = agent(tmp_path, cluster)
    assert shell.run(None) == 143
    assert len(cluster.steps) == 2 and cluster.shrinks == [("42", ("node1", "node3"))]  # node3 stays: blamed by the supervisor


SHRINKABLE = SPEC.replace("nodes = 2\nspare_nodes = 1", "nodes = 3").replace("pp = 2", "pp = 1\ndp = 3") + """
[restart]
min_data_parallel = 1
"""


def test_with_no_spare_a_job_that_may_shrink_goes_on_with_one_replica_fewer_in_the_same_allocation(tmp_path):
    cluster = Cluster(fail=["node2"])
    shell = agent(tmp_path, cluster, SHRINKABLE)
    assert shell.run(None) == 0
    first, second = cluster.steps
    assert first.argv[2] == "--ntasks=24" and second.argv[2] == "--ntasks=16"
    assert cluster.shrinks == [("42", ("node1", "node3"))]
    assert (second.env["CLUSTERCTL_DP_SIZE"], second.env["CLUSTERCTL_DP_SIZE_ORIGINAL"]) == ("2", "3")
    assert (first.env["CLUSTERCTL_DP_SIZE"], first.env["CLUSTERCTL_DP_SIZE_ORIGINAL"]) == ("3", "3")
    assert second.argv[-2:] == ["--resume", str(shell.run_dir / "checkpoints" / "step-00000020")]
    [event] = [e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
               if isinstance(e, RecoveredInAllocation)]
    assert (event.data_parallel_before, event.data_parallel_after, event.given_back) == (3, 2, ("node2",))
    assert event.shrank and sorted(event.nodes) == ["node1", "node3"]


def test_a_shrink_plans_its_map_once_and_the_step_writes_the_map_a_fresh_plan_gives(tmp_path, monkeypatch):
    topology = tmp_path / "topology.conf"
    topology.write_text("SwitchName=s1 Nodes=node[1-3]\n")
    planned_dp = []
    real_plan = placement.plan

    def counting_plan(layout, *args, **kwargs):
        planned_dp.append(layout.dp)
        return real_plan(layout, *args, **kwargs)

    monkeypatch.setattr(placement, "plan", counting_plan)
    cluster = Cluster(fail=["node2"])
    text = SHRINKABLE.replace("[launch]", "[launch]\nmaster_port = 29511")  # else a random port per map
    shell = agent(tmp_path / "job", cluster, text + f'[placement]\ntopology = "{topology}"\n')
    assert shell.run(None) == 0 and cluster.shrinks == [("42", ("node1", "node3"))]
    assert planned_dp == [3, 2]  # the first step's map; the shrink's, by the judge, taken by the step
    fresh = tmp_path / "fresh"
    plan_for_job(shell.run_dir, fresh, resized_environment(shell.environ, ["node1", "node3"]), FakeSlurm(cluster),
                 layout=ParallelLayout(tp=8, dp=2))
    assert (shell.job_dir / "restart-1" / "rankmap.json").read_bytes() == (fresh / "rankmap.json").read_bytes()


def test_a_shrunk_job_shrinks_again_and_ends_for_the_supervisor_below_its_floor(tmp_path):
    cluster = Cluster(fail=["node2", "node3"])
    shell = agent(tmp_path, cluster, SHRINKABLE.replace("min_data_parallel = 1", "min_data_parallel = 2"))
    assert shell.run(None) == 143  # dp 3 -> 2 after node2; node3 then leaves too few for dp 2
    assert len(cluster.steps) == 2 and cluster.shrinks == [("42", ("node1", "node3"))]
    assert shell.ended is not None and "cannot shrink" in shell.ended[1].message


def test_a_job_whose_spec_does_not_allow_shrinking_ends_for_the_supervisor_as_before(tmp_path):
    cluster = Cluster(fail=["node2"])
    shell = agent(tmp_path, cluster, SHRINKABLE.replace("min_data_parallel = 1", "min_data_parallel = 3"))
    assert shell.run(None) == 143
    assert len(cluster.steps) == 1 and cluster.shrinks == []


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


class FakeInbox:
    """The agent's report inbox: what the nodes' reporters sent, taken as the agent drains it."""

    port = 40000
    drains_cut_short = 0

    def __init__(self):
        self.pending, self.refused = [], {}

    def drain(self, limit=1 << 20):
        taken, self.pending = self.pending, []
        return taken


class ReportingCluster(Cluster):
    """Each node's reporter sends its ranks' step every tick (0.2 s) until told to stop (`stop_at`:
    the tick from which a node's ranks make no progress; `frozen`: ...and their processes are stopped)."""

    def __init__(self, agent_clock, stop_at: dict[str, int], frozen: bool = False):
        super().__init__(fail=[])
        self.clock, self.stop_at, self.launches, self.frozen = agent_clock, stop_at, 0, frozen
        self.inbox, self.seq, self.progress = FakeInbox(), 0, {}

    def send(self, step, node, ranks, process="running", stopped_since=0.0):
        from clusterctl.records.node_report import NodeReport, RankBeat
        self.seq += 1
        beats = tuple(RankBeat(self.progress[r], process, stopped_since) for r in ranks if r in self.progress)
        self.inbox.pending.append(NodeReport("42", step.env["CLUSTERCTL_REPORT_LAUNCH"], node, self.seq,
                                             1795305600.0 + self.clock[0], beats))

    def start(self, argv, env):
        self.launches += 1
        return super().start(argv, env)

    def ranks(self, step):
        """The launched step's job directory and each of its ranks with its node."""
        from clusterctl.records.rank_map import read_rank_map
        self.polls += 1
        job_dir = Path(step.argv[step.argv.index("--job-dir") + 1])
        rank_map = read_rank_map(job_dir)
        return job_dir, [(rank, rank_map.location(rank)[0]) for rank in range(rank_map.world_size)]

    def tick(self, step):
        from clusterctl.records.rank_progress import RankProgress
        job_dir, ranks = self.ranks(step)
        now = 1795305600.0 + self.clock[0]
        by_node = {}
        for rank, node in ranks:
            by_node.setdefault(node, []).append(rank)
            stop = self.launches == 1 and self.polls >= self.stop_at.get(node, 10**9)
            if not stop:  # else this node's ranks stopped (SIGSTOP, a blocking call) in the first step
                self.progress[rank] = RankProgress(rank, node, self.polls, "step", now, 1, alive_at=now)
        for node, node_ranks in by_node.items():
            stopped_at = self.stop_at.get(node, 10**9)
            if self.frozen and self.launches == 1 and self.polls >= stopped_at:
                self.send(step, node, node_ranks, "stopped", now - (self.polls - stopped_at) * 0.2)
            else:
                self.send(step, node, node_ranks)
        if self.launches > 1 and self.polls >= 60 and not step.stopped:
            step.code = 0


def hang_agent(tmp_path, stop_at, frozen=False):
    clock = [0.0]
    cluster = ReportingCluster(clock, stop_at, frozen)
    shell = agent(tmp_path, cluster)
    shell.doors.open_inbox = lambda key: cluster.inbox
    spec = shell.spec
    from dataclasses import replace
    shell.spec = replace(spec, restart=replace(spec.restart, hang_min_step_seconds=5.0, hang_startup_seconds=20.0))

    def sleep(seconds):
        clock[0] += seconds
    shell.doors.sleep, shell.doors.monotonic = sleep, lambda: clock[0]
    shell.doors.now = lambda: 1795305600.0 + clock[0]
    return shell, cluster


def test_ranks_of_one_node_that_stop_first_are_blamed_and_a_spare_takes_their_place(tmp_path):
    shell, cluster = hang_agent(tmp_path, {"node2": 50, "node1": 90})
    assert shell.run(None) == 0
    assert cluster.shrinks == [("42", ("node1", "node3"))]
    event = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                 if isinstance(e, RecoveredInAllocation))
    assert [b.node for b in event.blame] == ["node2"] and "hung ranks" in event.blame[0].reason
    assert "ranks 8-15 on node2 last reported step" in event.blame[0].evidence[0]


def test_every_rank_stopping_at_once_restarts_the_step_on_the_same_nodes_blaming_none(tmp_path):
    shell, cluster = hang_agent(tmp_path, {"node1": 50, "node2": 50})
    assert shell.run(None) == 0
    assert cluster.shrinks == [] and len(cluster.steps) == 2 and cluster.steps[0].stopped
    event = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                 if isinstance(e, RecoveredInAllocation))
    assert event.blame == () and sorted(event.nodes) == ["node1", "node2"] and "at once" in event.reason


def test_a_program_that_never_reports_progress_is_never_judged_hung(tmp_path):
    cluster = Cluster(fail=[])
    shell = agent(tmp_path, cluster)
    assert shell.run(None) == 0 and len(cluster.steps) == 1


class AskingCluster(Cluster):
    """The first step's ranks on node2 exit with `code`, as srun logs it; later steps complete."""

    def __init__(self, code: int, log: Path):
        super().__init__(fail=[])
        self.code, self.log = code, log

    def tick(self, step):
        self.polls += 1
        if len(self.steps) == 1 and self.polls == 5:
            with open(self.log, "a") as out:
                out.write(f"srun: error: node2: task 9: Exited with exit code {self.code}\n"
                          "srun: error: node1: tasks 0-7: Terminated\n")
            step.code = 1
        elif len(self.steps) > 1 and self.polls >= 5:
            step.code = 0


def asking_agent(tmp_path, code):
    tmp_path.mkdir()
    log = tmp_path / "run" / "logs" / "42.out"
    cluster = AskingCluster(code, log)
    shell = agent(tmp_path, cluster)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("clusterctl: rank map ...\n")  # before the step: not read as the step's
    from dataclasses import replace
    shell.spec = replace(shell.spec, restart=replace(shell.spec.restart, exit_actions=((75, "restart"),
                                                                                       (76, "exclude-node"),
                                                                                       (77, "stop"))))
    return shell, cluster


def test_exit_codes_the_spec_maps_restart_exclude_or_stop_inside_the_allocation(tmp_path):
    shell, cluster = asking_agent(tmp_path / "a", 76)
    assert shell.run(None) == 0 and cluster.shrinks == [("42", ("node1", "node3"))]
    shell, cluster = asking_agent(tmp_path / "b", 75)
    assert shell.run(None) == 0 and cluster.shrinks == [] and len(cluster.steps) == 2
    shell, cluster = asking_agent(tmp_path / "c", 77)
    assert shell.run(None) == 1 and len(cluster.steps) == 1


def test_a_step_that_fails_with_every_node_healthy_is_left_to_the_supervisor(tmp_path):
    shell, cluster = asking_agent(tmp_path / "a", 3)  # an exit code restart.exit_actions does not map
    assert shell.run(None) == 1 and len(cluster.steps) == 1 and cluster.shrinks == []


def _spend_restarts_by_resubmission(shell: Agent, count: int) -> None:
    """The run's journal as after `count` resubmissions by the supervisor."""
    journal = shell.run_dir / "journal.jsonl"
    for attempt in range(1, count + 1):
        append_run_event(journal, Submitted(at=float(attempt), attempt=attempt, job_id=str(attempt)))
        append_run_event(journal, Decided(at=float(attempt), attempt=attempt, job_id=str(attempt), state="FAILED",
                                          exit_code=1, outcome=OutcomeKind.NODE_FAILURE, message="node", blame=(),
                                          checkpoint_step=attempt * 10, checkpoint=None,
                                          action=DecisionAction.RESUBMIT))


def test_restarts_inside_the_job_and_resubmissions_share_one_budget(tmp_path):
    # max_restarts = 3, two used by resubmissions: one swap is left, the second failure ends the job.
    cluster = Cluster(fail=["node2"])
    shell = agent(tmp_path / "a", cluster)
    from dataclasses import replace
    shell.spec = replace(shell.spec, restart=replace(shell.spec.restart, max_restarts=3))
    _spend_restarts_by_resubmission(shell, 2)
    assert shell.run(None) == 0 and cluster.shrinks == [("42", ("node1", "node3"))]
    assert replay(read_run_journal(shell.run_dir / "journal.jsonl").events).budget.restarts == 3
    # All three used: the failed node stays in the job and the supervisor judges the attempt.
    cluster = Cluster(fail=["node2"])
    shell = agent(tmp_path / "b", cluster)
    shell.spec = replace(shell.spec, restart=replace(shell.spec.restart, max_restarts=3))
    _spend_restarts_by_resubmission(shell, 3)
    assert shell.run(None) == 143 and cluster.shrinks == [] and len(cluster.steps) == 1
    assert not any(isinstance(e, RecoveredInAllocation)
                   for e in read_run_journal(shell.run_dir / "journal.jsonl").events)


def test_a_program_asking_for_restarts_gets_no_more_than_max_restarts_in_the_whole_run(tmp_path):
    shell, cluster = asking_agent(tmp_path / "a", 75)
    from dataclasses import replace
    shell.spec = replace(shell.spec, restart=replace(shell.spec.restart, max_restarts=1))
    _spend_restarts_by_resubmission(shell, 1)
    assert shell.run(None) == 1 and len(cluster.steps) == 1  # the one restart went to the resubmission


def test_a_failed_batch_host_is_never_given_back_the_job_ends_for_the_supervisor(tmp_path):
    cluster = Cluster(fail=["node1"])  # where the agent itself runs
    shell = agent(tmp_path, cluster)
    assert shell.run(None) == 143 and cluster.shrinks == [] and len(cluster.steps) == 1


def test_ranks_hung_on_the_batch_host_restart_the_step_in_place_instead_of_ending_the_job(tmp_path):
    shell, cluster = hang_agent(tmp_path, {"node1": 50, "node2": 90})  # node1: where the agent runs
    assert shell.run(None) == 0
    assert cluster.shrinks == [] and len(cluster.steps) == 2
    event = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                 if isinstance(e, RecoveredInAllocation))
    assert event.blame == () and "batch host node1" in event.reason


class SlowCluster(ReportingCluster):
    """Ranks report their compute time every tick: 0.2 s a step, rank 3 of `slow` 0.5 s from tick 20 on
    (first step only); the first step completes after 400 ticks, later ones after 60."""

    def __init__(self, agent_clock, slow: str):
        super().__init__(agent_clock, {})
        self.slow, self.totals = slow, {}

    def start(self, argv, env):
        self.totals = {}
        return super().start(argv, env)

    def tick(self, step):
        from clusterctl.records.rank_progress import RankProgress
        job_dir, ranks = self.ranks(step)
        by_node = {}
        for rank, node in ranks:
            by_node.setdefault(node, []).append(rank)
            slow = self.launches == 1 and node == self.slow and self.polls >= 20 and rank % 8 == 3
            self.totals[rank] = self.totals.get(rank, 0.0) + (0.5 if slow else 0.2)
            self.progress[rank] = RankProgress(rank, node, self.polls, "step", 1795305600.0 + self.clock[0],
                                               self.launches, round(self.totals[rank], 6), self.polls)
        for node, node_ranks in by_node.items():
            self.send(step, node, node_ranks)
        if self.polls >= (400 if self.launches == 1 else 60) and not step.stopped:
            step.code = 0


THROTTLED = GpuEvidence("node2", 1795305600.0, (GpuReading(3, "GPU-3", 0x60, 792, 1980, 88),))


def straggler_agent(tmp_path, action: str, evidence: GpuEvidence = THROTTLED):
    from dataclasses import replace
    clock = [0.0]
    cluster = SlowCluster(clock, "node2")
    shell = agent(tmp_path, cluster)
    shell.doors.open_inbox = lambda key: cluster.inbox
    shell.spec = replace(shell.spec, stragglers=replace(shell.spec.stragglers, action=action))

    def sleep(seconds):
        clock[0] += seconds
    shell.doors.sleep, shell.doors.monotonic = sleep, lambda: clock[0]
    shell.doors.now = lambda: 1795305600.0 + clock[0]
    asked: list[str] = []
    table = FakeNodeTable(["node1", "node2", "node3"])
    shell.doors.gpu_evidence = lambda node, env: asked.append(node) or evidence
    shell.doors.drain = SlurmDrains(runner=table).drain  # the drain door, on Slurm's node table
    return shell, cluster, asked, table.drains


def _stragglers(shell):
    from clusterctl.records.run_journal import StragglerFound
    return [e for e in read_run_journal(shell.run_dir / "journal.jsonl").events if isinstance(e, StragglerFound)]


def test_a_straggler_is_swapped_for_the_spare_and_drained_when_its_gpus_agree(tmp_path):
    shell, cluster, asked, drained = straggler_agent(tmp_path, "swap")
    assert shell.run(None) == 0
    assert asked == ["node2"] and cluster.shrinks == [("42", ("node1", "node3"))]
    [event] = _stragglers(shell)
    assert (event.node, event.action, event.ranks, event.hardware) == \
        ("node2", "swapped", (11,), ("GPU 3: clock event reasons SW thermal slowdown, HW thermal slowdown (0x60); "
                                     "SM clock 792/1980 MHz (40%); 88 °C",))
    assert event.ratio == 2.5 and event.steps >= 30 and \
        event.drain.startswith("drained: clusterctl straggler: slow-gpus drain-reset")
    assert [(node, reason.split(" ")[:4]) for node, reason in drained] == [
        ("node2", ["clusterctl", "straggler:", "slow-gpus", "drain-reset"])]
    recovered = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                     if isinstance(e, RecoveredInAllocation))
    assert [b.node for b in recovered.blame] == ["node2"] and "straggler" in recovered.blame[0].reason


def test_a_straggler_whose_gpus_say_nothing_is_avoided_by_this_run_but_never_drained(tmp_path):
    cool = GpuEvidence("node2", 1795305600.0, (GpuReading(3, "GPU-3", 0x0, 1980, 1980, 40),))
    shell, cluster, asked, drained = straggler_agent(tmp_path, "exclude", cool)
    assert shell.run(None) == 0
    assert cluster.shrinks == [] and drained == [] and len(cluster.steps) == 1  # the job carries on
    [event] = _stragglers(shell)
    assert event.action == "excluded" and event.hardware == () and "avoided by this run only" in event.drain
    assert "node2" in replay(read_run_journal(shell.run_dir / "journal.jsonl").events).blamed  # next resubmission


def test_a_reported_straggler_is_journaled_once_and_shown_with_every_nodes_step_time(tmp_path):
    from clusterctl.records.node_step_times import read_node_step_times
    shell, cluster, asked, drained = straggler_agent(tmp_path, "report")
    assert shell.run(None) == 0
    assert cluster.shrinks == [] and drained == [] and len(_stragglers(shell)) == 1
    table = read_node_step_times(shell.job_dir)
    assert {n.node: n.state for n in table.nodes} == {"node1": "ok", "node2": "straggler"}
    assert table.reference == 0.2 and table.lost_s > 0


def test_a_node_whose_reporter_sees_its_ranks_stopped_is_swapped_out_within_seconds(tmp_path):
    shell, cluster = hang_agent(tmp_path, {"node2": 50}, frozen=True)
    stopped_at = []
    tick = cluster.tick

    def watching_tick(step):
        tick(step)
        if cluster.launches == 1 and cluster.polls == 50:
            stopped_at.append(cluster.clock[0])
    cluster.tick = watching_tick
    assert shell.run(None) == 0
    assert cluster.shrinks == [("42", ("node1", "node3"))]
    event = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                 if isinstance(e, RecoveredInAllocation))
    assert [b.node for b in event.blame] == ["node2"] and "hung ranks" in event.blame[0].reason
    assert "ranks 8-15 on node2 stopped stepping and also stopped running" in event.blame[0].evidence[0]
    ended_after = dict(event.phases)["end_step"]
    assert event.at - 1795305600.0 - ended_after - stopped_at[0] <= 2.0  # not the 5 s hang timeout


def test_a_suspended_job_every_node_stopped_at_once_blames_no_node(tmp_path):
    shell, cluster = hang_agent(tmp_path, {"node1": 50, "node2": 50}, frozen=True)
    assert shell.run(None) == 0
    assert cluster.shrinks == []
    event = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                 if isinstance(e, RecoveredInAllocation))
    assert event.blame == ()


class OperatorCluster(Cluster):
    """An operator drains `drained` (one node per step, at its third poll); ranks keep running."""

    def tick(self, step):
        self.polls += 1
        if self.polls == 3 and self.fail:
            name = self.fail.pop(0)
            self.states[name] = NodeState(name, "mixed", ("DRAIN",), "swap PSU (ticket 1234)", ("gpu",))
        if self.polls >= 40 and not step.stopped:
            step.code = 0


def test_a_node_an_operator_drains_is_swapped_for_the_spare_while_one_is_left(tmp_path):
    cluster = OperatorCluster(fail=["node2", "node3"])
    shell = agent(tmp_path, cluster)
    assert shell.run(None) == 0
    # node2 went to the spare; node3's drain found no spare left: the job finished on it, as Slurm means a drain.
    assert cluster.shrinks == [("42", ("node1", "node3"))] and len(cluster.steps) == 2
    event = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                 if isinstance(e, RecoveredInAllocation))
    assert [(b.node, b.reason) for b in event.blame] == [("node2", "drained by an operator")]
    assert "swap PSU (ticket 1234)" in event.blame[0].evidence[0]


def test_an_agent_that_cannot_open_its_report_inbox_still_recovers_through_slurm(tmp_path):
    cluster = Cluster(fail=["node2"])
    shell = agent(tmp_path, cluster)
    said: list[str] = []

    def no_port(key):
        raise OSError(98, "Address already in use")
    shell.doors.open_inbox, shell.doors.say = no_port, said.append
    assert shell.run(None) == 0 and cluster.shrinks == [("42", ("node1", "node3"))]
    assert any("cannot open the report inbox (Address already in use)" in line for line in said)
    assert "CLUSTERCTL_REPORT_ADDR" not in cluster.steps[0].env


def test_the_agent_summary_says_the_job_ended_when_the_agent_is_done(tmp_path):
    from clusterctl.records.agent_summary import read_agent_summary
    shell, cluster, asked, drained = straggler_agent(tmp_path, "off")  # one step that completes
    assert shell.run(None) == 0
    summary = read_agent_summary(shell.job_dir)
    assert summary is not None and summary.state == "ended" and summary.nodes == 2 and summary.reporting == 2
    assert summary.max_step is not None and summary.max_step > 0


# ---- training metrics: from the nodes' reports to the agent's summary and `clusterctl status` ----------

H100 = "NVIDIA H100 80GB HBM3"


class TrainingCluster(ReportingCluster):
    """Both nodes' ranks train at 5 steps a second of the agent's clock, each rank 4096 tokens a step of a
    100M-parameter model (6 x 1e8 FLOPs a token); rank 0's loss is 10 / step; the step completes after 40 s.
    Each report carries its node's metrics as its reporter sums them (`gpu`: NVML's name there)."""

    def __init__(self, agent_clock, gpu: str = H100):
        super().__init__(agent_clock, {})
        self.gpu = gpu

    def tick(self, step):
        from clusterctl.records.node_report import NodeMetrics, NodeReport, RankBeat
        from clusterctl.records.rank_progress import RankProgress
        job_dir, ranks = self.ranks(step)
        t = self.clock[0]
        now, steps = 1795305600.0 + t, int(t * 5)
        by_node: dict[str, list[int]] = {}
        for rank, node in ranks:
            by_node.setdefault(node, []).append(rank)
        for node, node_ranks in by_node.items():
            tokens = 4096.0 * 5 * len(node_ranks) * t
            first = min(node_ranks)
            told = NodeMetrics(now, len(node_ranks), 1, steps, 1795305600.0 + steps / 5, tokens, 6e8 * tokens,
                               10.0 / max(1, steps) if first == 0 else 1.0, steps, first, gpu=self.gpu)
            beats = tuple(RankBeat(RankProgress(r, node, steps, "step", now, 1, alive_at=now)) for r in node_ranks)
            self.seq += 1
            self.inbox.pending.append(NodeReport("42", step.env["CLUSTERCTL_REPORT_LAUNCH"], node, self.seq, now,
                                                 beats, metrics=told))
        if t >= 40 and not step.stopped:
            step.code = 0


def training_agent(tmp_path, spec_text=SPEC, gpu=H100):
    clock = [0.0]
    cluster = TrainingCluster(clock, gpu)
    shell = agent(tmp_path, cluster, spec_text)
    shell.doors.open_inbox = lambda key: cluster.inbox

    def sleep(seconds):
        clock[0] += seconds
    shell.doors.sleep, shell.doors.monotonic = sleep, lambda: clock[0]
    shell.doors.now = lambda: 1795305600.0 + clock[0]
    return shell


def test_the_programs_tokens_flops_and_loss_reach_the_agents_summary_and_clusterctl_status(tmp_path):
    from clusterctl.launcher.login.status import run_status, status_renderables
    from clusterctl.records.agent_summary import read_agent_summary
    from clusterctl.slurm.jobs import JobReport
    from tests.unit.test_terminal_text import rendered
    shell = training_agent(tmp_path, SPEC.replace("gpus_per_node = 8\n", "gpus_per_node = 8\ngpu_peak_tflops = 100\n"))
    assert shell.run(None) == 0
    summary = read_agent_summary(shell.job_dir)
    assert summary is not None and summary.training is not None
    training = summary.training
    # 2 nodes x 8 ranks x 4096 tokens x 5 steps a second; 6e8 FLOPs a token over 16 GPUs of 100 TFLOP/s.
    assert training.tokens_per_s == pytest.approx(2 * 8 * 4096 * 5)
    assert training.steps_per_s == pytest.approx(5.0)
    assert training.mfu == pytest.approx(6e8 * 2 * 8 * 4096 * 5 / (16 * 100e12))
    assert (training.peak_tflops, training.peak_from, training.gpu, training.gpus) == (100.0, "spec", H100, 16)
    assert (training.loss_rank, training.loss_step, training.loss) == (0, 200, 10 / 200)
    # What `clusterctl status` shows of the running job, and its --json.
    events = [Submitted(at=100.0, attempt=1, job_id="42")]
    queue = {"42": JobReport("42", "toy", "RUNNING", "None", "node[1-3]", None, None, 100.0, 110.0, 0.0)}
    status = run_status(shell.run_dir, events, {}, queue, {}, None, summary)
    assert ("job 42 training (last 30 s): step 200, 5 steps/s, 327,680 tokens/s, MFU 12.3% (peak 100 TFLOP/s per "
            "GPU from the spec), loss 0.05 at step 200") in rendered(status_renderables(status))
    shown = json.loads(json.dumps(status.to_json()))["agent"]["training"]
    assert shown["tokens_per_s"] == pytest.approx(327_680) and shown["mfu"] == pytest.approx(0.12288)


def test_without_a_spec_peak_the_mfu_is_against_the_gpu_nvml_names_or_says_why_there_is_none(tmp_path):
    from clusterctl.records.agent_summary import read_agent_summary
    shell = training_agent(tmp_path / "h100")
    assert shell.run(None) == 0
    training = read_agent_summary(shell.job_dir).training
    assert (training.peak_tflops, training.peak_from) == (989.0, "nvml")
    assert training.mfu == pytest.approx(6e8 * 2 * 163_840 / (16 * 989e12))
    shell = training_agent(tmp_path / "unknown", gpu="NVIDIA L40S")
    assert shell.run(None) == 0
    training = read_agent_summary(shell.job_dir).training
    assert training.mfu is None and training.flops_per_s == pytest.approx(6e8 * 2 * 163_840)
    assert training.mfu_missing == "clusterctl does not know the peak of 'NVIDIA L40S': set [job] gpu_peak_tflops in the spec"


def test_a_program_that_reports_no_training_metrics_has_none_in_the_summary_and_no_line_in_status(tmp_path):
    from clusterctl.launcher.login.status import run_status, status_renderables
    from clusterctl.records.agent_summary import read_agent_summary
    from clusterctl.slurm.jobs import JobReport
    from tests.unit.test_terminal_text import rendered
    shell, cluster, asked, drained = straggler_agent(tmp_path, "off")  # steps and compute time, nothing else
    assert shell.run(None) == 0
    summary = read_agent_summary(shell.job_dir)
    assert summary is not None and summary.training is None
    queue = {"42": JobReport("42", "toy", "RUNNING", "None", "node[1-3]", None, None, 100.0, 110.0, 0.0)}
    text = rendered(status_renderables(run_status(shell.run_dir, [Submitted(at=100.0, attempt=1, job_id="42")], {},
                                                  queue, {}, None, summary)))
    assert "job 42 agent" in text and "training" not in text


def test_the_agent_keeps_the_training_over_time_a_line_each_10_s_that_the_step_moved_and_one_at_the_end(tmp_path):
    from clusterctl.records.agent_summary import read_agent_summary
    from clusterctl.records.training_series import TrainingSeriesReader, series_path
    shell = training_agent(tmp_path, SPEC.replace("gpus_per_node = 8\n", "gpus_per_node = 8\ngpu_peak_tflops = 100\n"))
    assert shell.run(None) == 0
    points = list(TrainingSeriesReader(shell.job_dir))
    # A summary every 2 s for the step's 40 s, the ranks 5 steps a second: a point each 10 s, and the last summary's.
    assert 4 <= len(points) <= 6 and [p.step for p in points] == sorted({p.step for p in points})
    assert all(b.at - a.at >= 10 for a, b in zip(points, points[1:-1]))
    assert points[0].tokens_per_s is None and points[0].loss == 10.0  # no rate before two reports: absent, not 0
    summary = read_agent_summary(shell.job_dir)
    last = points[-1]
    assert (last.at, last.step, last.tokens_per_s, last.mfu, last.loss) == (
        summary.at, summary.max_step, summary.training.tokens_per_s, summary.training.mfu, summary.training.loss)
    assert last.tokens_per_s == pytest.approx(2 * 8 * 4096 * 5)
    assert series_path(shell.job_dir).stat().st_size / len(points) < 400  # a few hundred bytes a line


def test_a_training_series_that_cannot_be_written_is_said_once_and_the_job_goes_on(tmp_path):
    from clusterctl.records.agent_summary import read_agent_summary
    from clusterctl.records.training_series import series_path
    shell = training_agent(tmp_path)
    series_path(shell.job_dir).mkdir(parents=True)  # something in its place
    said: list[str] = []
    shell.doors.say = said.append
    assert shell.run(None) == 0
    failed = [line for line in said if "training series" in line]
    assert failed == [f"cannot append the job's training series to {series_path(shell.job_dir)} (Is a directory): "
                      "`report --html` will draw its curves with gaps; watching on"]
    assert read_agent_summary(shell.job_dir).training is not None  # the summary carried on


# ---- multi-level checkpoints: the spare resumes from the lost node's buddy -------------------------------

TIERS_SPEC = SPEC.replace('validator = "manifest"\n', "tiers = true\n")


class TiersCluster(ReportingCluster):
    """The first step saves checkpoint 20 (each node its own part, a copy of its buddy's, flushed too when
    `flushed`) as the tier index the agent wrote tells it, and the nodes report their holdings; then
    healthd drains node2.  Later steps complete, unless `fail_resume`: the second step's node in node2's
    old slot cannot load its part (a resume-failure record, its rank exits 87, srun 137)."""

    def __init__(self, agent_clock, *, flushed: bool = False, fail_resume: bool = False, saved_again: bool = False,
                 lost_again: bool = False):
        super().__init__(agent_clock, {})
        self.flushed, self.fail_resume, self.saved_again, self.lost_again = flushed, fail_resume, saved_again, lost_again
        self.held: dict[str, tuple] = {}
        self.indexes: list[list] = []
        self.inventories: list[tuple[str, set[int]]] = []
        """(when, the checkpoint steps the job's inventory lists) at each step's start and first tick."""

    def inventory(self, step, when):
        from clusterctl.launcher.shared.checkpoint_inventory import INVENTORY_NAME, read_inventory
        job_dir = Path(step.argv[step.argv.index("--job-dir") + 1])
        path = next(p for p in (job_dir, *job_dir.parents) if (p / INVENTORY_NAME).is_file()) / INVENTORY_NAME
        self.inventories.append((when, {c.step for held in read_inventory(path).values() for c in held.copies}))

    def start(self, argv, env):
        from clusterctl.records.checkpoint_settings import CheckpointSettings
        from clusterctl.records.tier_index import read_tier_slot
        settings = CheckpointSettings.from_env(env)
        index = Path(settings.tier_index)
        self.indexes.append([read_tier_slot(index, s)[2] for s in range(read_tier_slot(index, 0)[1])])
        step = super().start(argv, env)
        if self.saved_again and self.launches > 1:
            self.inventory(step, f"step {self.launches} starting")
        return step

    def tick(self, step):
        from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy, LastResume
        from clusterctl.records.node_report import NodeReport
        from clusterctl.records.resume_failure import ResumeFailure, write_resume_failure
        self.polls += 1
        now = 1795305600.0 + self.clock[0]
        lines = self.indexes[-1]
        if self.launches == 1 and self.polls == 2:  # checkpoint 20, saved, pushed (and flushed)
            slot_of = {line.node: s for s, line in enumerate(lines)}
            for s, line in enumerate(lines):
                kept = next(other.node for other in lines if other.buddy == line.node)
                self.held[line.node] = (HeldCopy(20, line.node, "local", s, len(lines), now, 1.0),
                                        HeldCopy(20, kept, "buddy", slot_of[kept], len(lines), now, 1.0)) + (
                    (HeldCopy(20, line.node, "shared", s, len(lines), now, 1.0),) if self.flushed else ())
        if self.saved_again and self.launches == 1 and self.polls == 28:  # checkpoint 30, saved but not pushed yet
            for s, line in enumerate(lines):
                self.held[line.node] = (HeldCopy(30, line.node, "local", s, len(lines), now, 1.0),) + self.held[line.node]
        if self.saved_again and self.launches > 1 and self.polls == 1:
            self.inventory(step, f"step {self.launches}, first look")
        if self.lost_again and self.launches == 2 and self.polls == 28:  # checkpoint 40, saved, then node3 is lost
            for s, line in enumerate(lines):
                self.held[line.node] = (HeldCopy(40, line.node, "local", s, len(lines), now, 1.0),) + \
                    self.held.get(line.node, ())
        for line in lines:
            self.seq += 1
            held = self.held.get(line.node)
            resumed = None
            if line.tier != "-" and self.polls >= 3 and not (self.fail_resume and self.launches == 2 and line.of_node == "node2"):
                # The node's stager read its slot's part (its own copy in 0.5 s, a buddy's over the network in 4 s).
                resumed = LastResume(20, line.tier, line.of_node, "" if line.tier == "shared" else line.held_on,
                                     0.5 if line.tier == "local" else 4.0, now)
            self.inbox.pending.append(NodeReport(
                "42", step.env["CLUSTERCTL_REPORT_LAUNCH"], line.node, self.seq, now,
                checkpoints=CheckpointHoldings(line.node, held or (), now, resumed) if held or resumed else None))
        if self.lost_again and self.launches == 2 and self.polls == 30:
            self.states["node3"] = NodeState("node3", "mixed", ("DRAIN",), "healthd: xid 79 gpu1 (GPU-y) "
                                             "drain-reboot 2026-11-22T03:05:00Z", ("gpu",))
        if self.launches == 1 and self.polls == 30:
            self.states["node2"] = NodeState("node2", "mixed", ("DRAIN",), "healthd: xid 79 gpu3 (GPU-x) "
                                             "drain-reboot 2026-11-22T03:00:00Z", ("gpu",))
        if self.launches == 2 and self.fail_resume and self.polls == 10:
            spare = next(line for line in lines if line.of_node == "node2")
            job_dir = Path(step.argv[step.argv.index("--job-dir") + 1])
            write_resume_failure(job_dir, ResumeFailure(spare.node, 20, "no copy of slot 1 verified", (
                BadCopy(20, "node2", spare.tier, spare.held_on, "fails its checksum (shard rank-9.json)"),)))
            step.code = 137
        elif self.launches > 1 and self.polls >= 60 and not step.stopped:
            step.code = 0


def tiers_agent(tmp_path, cluster_class=None, **story):
    clock = [0.0]
    cluster = (cluster_class or TiersCluster)(clock, **story)
    shell = agent(tmp_path, cluster, TIERS_SPEC)
    shell.doors.open_inbox = lambda key: cluster.inbox
    said: list[str] = []

    def sleep(seconds):
        clock[0] += seconds
    shell.doors.sleep, shell.doors.monotonic, shell.doors.say = sleep, lambda: clock[0], said.append
    shell.doors.now = lambda: 1795305600.0 + clock[0]
    return shell, cluster, said


def test_an_agent_with_tiers_resumes_the_swapped_in_spare_from_the_lost_nodes_buddy(tmp_path):
    shell, cluster, said = tiers_agent(tmp_path)
    assert shell.run(None) == 0
    assert cluster.shrinks == [("42", ("node1", "node3"))]
    first, second = cluster.indexes
    assert {line.tier for line in first} == {"-"}  # a fresh start: nothing saved yet
    spare = next(line for line in second if line.node == "node3")
    assert (spare.tier, spare.of_node, spare.held_on) == ("buddy", "node2", "node1")
    assert "resuming from step 20: 1 node(s) from their own copies, 1 node(s) from a buddy's copy " \
           "(node2's on node1)" in said
    step = cluster.steps[1]
    assert "--resume" not in step.argv and "CLUSTERCTL_RESUME_FROM" not in step.env  # the program asks the tiers
    assert "CLUSTERCTL_CHECKPOINT" in step.env
    event = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                 if isinstance(e, RecoveredInAllocation))
    assert event.checkpoint_step == 20 and [b.node for b in event.blame] == ["node2"]
    # Checkpoint 20 was never flushed: the restart names its step and the nodes' tiers, never a folder it is not in.
    assert event.checkpoint is None
    assert "restart 1: a new step on node1 node3 from step 20 (in the nodes' tiers: 1 own copy, 1 buddy copy) " \
           "(no queue wait)" in said
    assert not any("tiers/step-" in line for line in said)
    assert (shell.job_dir / "checkpoint-inventory.json").is_file()
    # Once both nodes said their resume, one journal line: where the parts came from, the slowest read.
    [resumed] = [e for e in read_run_journal(shell.run_dir / "journal.jsonl").events if isinstance(e, Resumed)]
    assert (resumed.restart, resumed.step, resumed.nodes, resumed.reported) == (1, 20, 2, 2)
    assert dict(resumed.tiers) == {"local": 1, "buddy": 1} and resumed.buddy_copies == ("node2's on node1",)
    assert (resumed.read_seconds, resumed.slowest_node) == (4.0, "node3")
    assert "resumed step 20: 1 node(s) from their own copies, 1 node(s) from a buddy's copy (node2's on node1); " \
           "read in 4.00 s (slowest: node3)" in said


def test_the_job_s_inventory_is_written_once_the_new_step_started_not_between_the_failure_and_the_step(tmp_path):
    # Checkpoint 30 reaches the agent a moment before node2 is drained (within INVENTORY_EVERY of the
    # inventory's last write, so not written yet); the plan takes checkpoint 20 (30 is not complete without
    # node2's part) and the inventory, ~10 MB at 12,500 nodes, is written only after the new step started.
    shell, cluster, said = tiers_agent(tmp_path, saved_again=True)
    assert shell.run(None) == 0
    assert "resuming from step 20: 1 node(s) from their own copies, 1 node(s) from a buddy's copy " \
           "(node2's on node1)" in said
    assert cluster.inventories == [("step 2 starting", {20}), ("step 2, first look", {20, 30})]


def test_an_agent_that_leaves_the_job_to_the_supervisor_writes_the_inventory_the_next_job_plans_from(tmp_path):
    # Checkpoint 40 reaches the agent within INVENTORY_EVERY of the inventory's last write, then node3 is lost
    # with no spare left: the job ends, and the inventory it leaves lists checkpoint 40.
    from clusterctl.launcher.shared.checkpoint_inventory import INVENTORY_NAME, read_inventory
    shell, cluster, said = tiers_agent(tmp_path, lost_again=True)
    assert shell.run(None) != 0 and len(cluster.steps) == 2
    held = read_inventory(shell.job_dir / INVENTORY_NAME)
    assert {c.step for c in held["node1"].copies} == {20, 40}


def test_a_resume_that_fails_on_the_spare_starts_the_step_again_from_the_next_tier_and_uses_a_restart(tmp_path):
    shell, cluster, said = tiers_agent(tmp_path, flushed=True, fail_resume=True)
    assert shell.run(None) == 0
    assert len(cluster.steps) == 3 and cluster.shrinks == [("42", ("node1", "node3"))]  # in place: no node blamed
    spare = next(line for line in cluster.indexes[2] if line.node == "node3")
    assert (spare.tier, spare.of_node, spare.held_on) == ("shared", "node2", "-")
    events = [e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
              if isinstance(e, RecoveredInAllocation)]
    assert [(e.restart, [b.node for b in e.blame]) for e in events] == [(1, ["node2"]), (2, [])]
    shared = shell.run_dir / "checkpoints" / "tiers" / "step-000000000020"
    assert f"restart 2: a new step on node1 node3 from step 20 (in the nodes' tiers: 1 own copy; 1 part on shared " \
           f"storage: {shared}) (no queue wait)" in said
    assert "resuming failed (the step exited 137): node3 could not load checkpoint 20" in events[1].reason
    assert replay(read_run_journal(shell.run_dir / "journal.jsonl").events).budget.restarts == 2
    assert (shell.run_dir / "checkpoints" / "tiers" / "step-000000000020" / "complete.json").is_file()
    # The failed resume's line is written at the step's end with what the nodes said (node1 read its own
    # copy; the spare never said: counted as planned); the next one's once both said.
    failed, again = [e for e in read_run_journal(shell.run_dir / "journal.jsonl").events if isinstance(e, Resumed)]
    assert (failed.restart, failed.reported, failed.read_seconds, failed.slowest_node) == (1, 1, 0.5, "node1")
    assert dict(failed.tiers) == {"local": 1, "buddy": 1}
    assert (again.restart, again.reported, dict(again.tiers)) == (2, 2, {"local": 1, "shared": 1})


class ResubmittedTiersCluster(TiersCluster):
    """A resubmitted job's single step: it loads what its tier index says, then completes."""

    def tick(self, step):
        self.polls += 1
        if self.polls >= 3:
            step.code = 0


def test_a_resubmitted_job_keeps_the_node_holding_the_copies_in_its_map_not_as_its_spare(tmp_path):
    from clusterctl.launcher.job.checkpoint_plan import TierPlanner
    from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy
    shell, cluster, said = tiers_agent(tmp_path, ResubmittedTiersCluster)
    # The run's previous job (41) ran on node3 and node9; node9 was lost. node3 holds its own part and node9's.
    previous = TierPlanner(shell.run_dir, shell.run_dir / "jobs" / "41", shell.spec, {}, said.append)
    previous.observe({"node3": CheckpointHoldings("node3", (
        HeldCopy(20, "node3", "local", 0, 2, 1795305000.0, 1.0), HeldCopy(20, "node9", "buddy", 1, 2, 1795305000.0, 1.0)),
        1795305000.0)})
    previous.record_pending()
    assert shell.run(None) == 0
    # Without a topology the map takes Slurm's order, node1 node2, and node3 would stay spare, its copies out of reach.
    [index] = cluster.indexes
    assert [(line.node, line.tier, line.held_on) for line in index] == [("node1", "buddy", "node3"),
                                                                      ("node3", "buddy", "node3")]
    assert "the map keeps node3 (they hold the copies the resume reads); spare: node2" in said
    assert "resuming from step 20: 1 node(s) from their own copies, 1 node(s) from a buddy's copy (node9's on node3)" in said


def test_a_map_kept_for_the_holders_still_records_the_whole_allocation_and_its_batch_host(tmp_path):
    from clusterctl.launcher.job.checkpoint_plan import TierPlanner
    from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy
    from clusterctl.records.rank_map import read_rank_map
    shell, cluster, said = tiers_agent(tmp_path, ResubmittedTiersCluster)
    # The previous job ran on node2 and node3; this one got node1 (its batch host) too.
    previous = TierPlanner(shell.run_dir, shell.run_dir / "jobs" / "41", shell.spec, {}, said.append)
    previous.observe({
        "node2": CheckpointHoldings("node2", (HeldCopy(20, "node2", "local", 0, 2, 1795305000.0, 1.0),), 1795305000.0),
        "node3": CheckpointHoldings("node3", (HeldCopy(20, "node3", "local", 1, 2, 1795305000.0, 1.0),), 1795305000.0)})
    previous.record_pending()
    assert shell.run(None) == 0
    kept = read_rank_map(shell.job_dir)
    assert kept.slots == ("node2", "node3")
    # The supervisor finds the batch host as the allocation's first node: the map must not hide node1.
    assert kept.nodelist == "node[1-3]" and kept.unused_nodes == ("node1",)


def test_a_hung_steps_stacks_are_read_on_its_nodes_before_it_is_ended_and_journaled_with_the_restart(tmp_path):
    from clusterctl.records.node_stacks import Frame, NodeStacks, RankStack, write_node_stacks
    shell, cluster = hang_agent(tmp_path, {"node1": 50, "node2": 90})
    asked = []

    def dump_stacks(nodes, job_dir, launch, env):  # what the stacks step writes on each node
        asked.append((tuple(nodes), len(cluster.steps)))
        for node in nodes:
            frame = Frame("wait", "/home/u/train.py", 9 if node == "node1" else 42)
            rank = 0 if node == "node1" else 8
            write_node_stacks(job_dir, NodeStacks(node, "42", launch, 1.0, (RankStack(rank, 5, "dumped", (frame,), 1),)))
        return ""
    shell.doors.dump_stacks = dump_stacks
    assert shell.run(None) == 0
    assert asked == [(("node1", "node2"), 1)]  # the stuck node first, then the step's others; once, before the restart
    event = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                 if isinstance(e, RecoveredInAllocation))
    assert event.stacks[:3] == ("rank 8 on node2 in wait (train.py:42)", "rank 0 on node1 in wait (train.py:9)",
                                "the hang watch saw ranks 0-7 stop first")


class CutCluster(ReportingCluster):
    """node2 goes silent at the 50th tick of the first step (its link cut: Slurm still says allocated);
    from then on node1's reporter names it among its silent neighbours."""

    def send(self, step, node, ranks, process="running", stopped_since=0.0):
        from dataclasses import replace as changed

        from clusterctl.records.node_report import SilentPeer
        cut = self.launches == 1 and self.polls >= 50
        if cut and node == "node2":
            return
        super().send(step, node, ranks, process, stopped_since)
        if cut and node == "node1":
            silent_s = max(0.0, (self.polls - 50) * 0.2)
            if silent_s >= 2.5:
                report = self.inbox.pending[-1]
                self.inbox.pending[-1] = changed(report, silent_peers=(SilentPeer("node2", silent_s),))


def cut_agent(tmp_path, answers: bool):
    clock = [0.0]
    cluster = CutCluster(clock, {})
    shell = agent(tmp_path, cluster)
    shell.doors.open_inbox = lambda key: cluster.inbox
    probed = []

    def probe(node, port):
        probed.append((node, port))
        return (True, "port 6818 refused: the node is up") if answers else (False, "no answer within 1 s")
    shell.doors.probe, shell.doors.slurmd_port = probe, lambda: 6818

    def sleep(seconds):
        clock[0] += seconds
        time.sleep(0.001)  # the probe's thread gets its turn
    shell.doors.sleep, shell.doors.monotonic = sleep, lambda: clock[0]
    shell.doors.now = lambda: 1795305600.0 + clock[0]
    return shell, cluster, probed


def test_a_node_its_neighbour_and_the_agent_both_lose_is_given_back_without_waiting_for_slurm(tmp_path):
    shell, cluster, probed = cut_agent(tmp_path, answers=False)
    assert shell.run(None) == 0
    assert cluster.shrinks == [("42", ("node1", "node3"))] and cluster.steps[0].stopped
    event = next(e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                 if isinstance(e, RecoveredInAllocation))
    assert [b.node for b in event.blame] == ["node2"] and event.blame[0].reason.startswith("unreachable")
    assert "its neighbour node1 has not heard its beats" in event.blame[0].evidence[0]
    assert "probes of it went unanswered" in event.blame[0].evidence[1]
    assert {node for node, _ in probed} == {"node2"} and {port for _, port in probed} == {6818}


def test_a_node_the_agent_still_reaches_is_not_blamed_for_its_silent_reporter(tmp_path):
    shell, cluster, probed = cut_agent(tmp_path, answers=True)
    tick = cluster.tick

    def ending_tick(step):  # the first step runs on 120 ticks after the cut, then completes
        tick(step)
        if cluster.launches == 1 and cluster.polls >= 170 and not step.stopped:
            step.code = 0
    cluster.tick = ending_tick
    assert shell.run(None) == 0
    assert cluster.shrinks == [] and len(cluster.steps) == 1 and probed
    assert not [e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                if isinstance(e, RecoveredInAllocation)]


def test_a_step_ended_for_a_failed_node_has_its_ranks_sigkilled_through_slurm_not_after_killwait(tmp_path):
    cluster = Cluster(fail=["node2"])
    shell = agent(tmp_path, cluster)
    killed = []
    shell.doors.kill_ranks = lambda job_id: killed.append(job_id) or [f"{job_id}.0"]
    assert shell.run(None) == 0
    first, _ = cluster.steps
    for _ in range(100):
        if killed:
            break
        time.sleep(0.01)
    assert killed == ["42"] and first.grace == 0.5  # srun itself killed half a second later, not 15


def test_ranks_slurm_will_not_signal_are_said_and_left_to_killwait(tmp_path):
    from clusterctl.errors import SlurmCommandError
    cluster = Cluster(fail=["node2"])
    shell = agent(tmp_path, cluster)
    said = []

    def refused(job_id):
        raise SlurmCommandError(["scancel"], 1, "Access/permission denied")
    shell.doors.kill_ranks, shell.doors.say = refused, said.append
    assert shell.run(None) == 0
    for _ in range(100):
        if any("could not SIGKILL the step's ranks" in line for line in said):
            break
        time.sleep(0.01)
    assert cluster.steps[0].grace == 0.5 and any("could not SIGKILL the step's ranks" in line for line in said)
