"""No single node ends a recovery: a standby agent on a spare takes the job over when the batch host
(where the job's agent runs) dies, exactly one agent acts, and the one that lost stands down."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.launcher.job.standby import Standby, StandbyDoors, job_environment
from clusterctl.launcher.pure.takeover import Quiet, takeover
from clusterctl.records.agent_lease import AgentLease, current_lease, read_standby, take_lease
from clusterctl.records.agent_summary import AgentSummary, write_agent_summary
from clusterctl.records.run_journal import RecoveredInAllocation, read_run_journal
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.nodes import NodeState
from tests.unit.test_allocation_agent import Cluster, agent

UP = NodeState("node1", "allocated", (), "", ("gpu",))
DEAD = NodeState("node1", "down*", ("NOT_RESPONDING",), "Not responding", ("gpu",))


# ---- the lease ------------------------------------------------------------------------------------
def test_of_agents_racing_for_one_epoch_exactly_one_takes_it(tmp_path):
    won: list[str] = []

    def race(node: str) -> None:
        if take_lease(tmp_path, AgentLease(2, node, 100, 1.0, why="node1 is gone")):
            won.append(node)

    threads = [threading.Thread(target=race, args=(f"node{i}",)) for i in range(2, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert current_lease(tmp_path) == AgentLease(2, won[0], 100, 1.0, why="node1 is gone")


def test_the_agent_in_charge_is_the_one_holding_the_highest_epoch(tmp_path):
    assert current_lease(tmp_path) is None
    assert take_lease(tmp_path, AgentLease(1, "node1", 10, 1.0))
    assert take_lease(tmp_path, AgentLease(2, "node3", 11, 2.0, why="node1 down"))
    assert not take_lease(tmp_path, AgentLease(1, "node1", 10, 3.0))
    assert current_lease(tmp_path).node == "node3"


def test_a_planted_or_damaged_lease_is_a_clear_error_not_a_new_agent(tmp_path):
    take_lease(tmp_path, AgentLease(1, "node1", 10, 1.0))
    (tmp_path / "agent-lease" / "2.json").symlink_to(tmp_path / "agent-lease" / "1.json")
    with pytest.raises(RecordError, match="2.json"):
        current_lease(tmp_path)
    (tmp_path / "agent-lease" / "2.json").unlink()
    (tmp_path / "agent-lease" / "2.json").write_text('{"kind": "agent-lease", "version": 1, "epoch": 7}')
    with pytest.raises(RecordError, match="2.json"):
        current_lease(tmp_path)


@given(st.integers(1, 10**6), st.sampled_from(["node1", "gpu-a17", "n0001"]), st.integers(1, 2**22),
       st.floats(0, 4e9), st.sampled_from(["active", "standby"]), st.text(max_size=40))
def test_a_lease_reads_back_as_written(epoch, node, pid, at, role, why):
    lease = AgentLease(epoch, node, pid, at, role, why)
    assert AgentLease.from_json(lease.to_json(), "lease") == lease


# ---- when to take over (pure) ---------------------------------------------------------------------
@given(st.floats(0, 30), st.sampled_from([UP, DEAD, None]), st.booleans())
def test_a_standby_never_takes_over_while_the_agent_is_heard(silence, state, in_job):
    quiet = Quiet(summary_at=100.0, watching_since=0.0, interval=2.0)
    if silence <= 3 * 2.0 + 1.0:
        assert takeover("node1", quiet, 100.0 + silence, state, ["node1", "node2"] if in_job else ["node2"]) is None


def test_a_silent_agent_is_taken_over_only_once_slurm_took_its_node_out_of_the_job():
    quiet = Quiet(summary_at=100.0, watching_since=0.0, interval=2.0)
    assert takeover("node1", quiet, 120.0, UP, ["node1", "node2", "node3"]) is None  # a partition, or a slow agent
    assert takeover("node1", quiet, 120.0, None, None) is None  # Slurm could not be asked: no takeover
    # Not responding but still in the job: a step started now would be killed when Slurm removes it.
    assert takeover("node1", quiet, 120.0, DEAD, ["node1", "node2", "node3"]) is None
    taken = takeover("node1", quiet, 120.0, DEAD, ["node2", "node3"])
    assert taken is not None and taken.node == "node1" and taken.left_job
    assert taken.evidence[0].startswith("the agent on node1 silent for 20.0 s")
    assert "left the job" in taken.evidence[1] and "node1 is down*" in taken.evidence[1]


# ---- the standby's loop -----------------------------------------------------------------------------
class World:
    """The run directory as the standby sees it, the active agent writing its summary while alive."""

    def __init__(self, job_dir: Path, dies_at: float | None, node1: NodeState = DEAD) -> None:
        self.job_dir, self.dies_at, self.node1 = job_dir, dies_at, node1
        self.clock, self.asked, self.taken, self.ended = 1000.0, 0, [], []
        take_lease(job_dir, AgentLease(1, "node1", 10, self.clock))

    def sleep(self, seconds: float) -> None:
        self.clock += seconds
        if self.dies_at is None or self.clock < self.dies_at:
            write_agent_summary(self.job_dir, AgentSummary("42", "0", self.clock, 2.0, "watching", 2, 2))
        if self.clock > 1000.0 + 600:
            raise AssertionError("the standby never decided")

    def node_state(self, name: str) -> NodeState:
        self.asked += 1
        return self.node1 if self.dies_at is not None and self.clock >= self.dies_at + 5 else UP

    def job_nodes(self, job_id: str) -> list[str]:
        return ["node2", "node3"] if self.dies_at is not None and self.clock >= self.dies_at + 5 \
            else ["node1", "node2", "node3"]

    def take_over(self, taken, in_use, epoch):
        self.taken.append((taken.node, tuple(in_use), epoch))
        return 0

    def standby(self, stop_after: float | None = None) -> Standby:
        environ = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]", "SLURMD_NODENAME": "node3"}
        doors = StandbyDoors(self.node_state, self.job_nodes, self.take_over, self.ended.append,
                             now=lambda: self.clock, sleep=self.sleep, say=lambda message: None)
        return Standby(self.job_dir.parent, self.job_dir, environ, 2, doors)


def test_a_standby_asks_slurm_nothing_while_the_agent_writes_its_summary(tmp_path):
    world = World(tmp_path, dies_at=None)
    standby = world.standby()
    original_sleep = world.sleep

    def sleep_then_hand_over(seconds):
        original_sleep(seconds)
        if world.clock >= 1300:  # the active agent hands over to someone else: this standby is not needed
            take_lease(tmp_path, AgentLease(2, "node4", 12, world.clock))

    standby.doors.sleep = sleep_then_hand_over
    assert standby.run() == 0
    assert world.asked == 0 and world.taken == []
    assert read_standby(tmp_path).node == "node3"


def test_a_standby_takes_over_once_the_agent_is_silent_and_slurm_says_its_node_is_gone(tmp_path):
    world = World(tmp_path, dies_at=1100.0)
    assert world.standby().run() == 0
    assert world.taken == [("node1", ("node1", "node2", "node3"), 2)]
    assert world.clock - 1100.0 < 15  # silent for 3 heartbeats + 1 s, Slurm agreeing 5 s after the death


def test_a_silent_agent_on_a_node_slurm_keeps_in_the_job_is_not_taken_over(tmp_path):
    world = World(tmp_path, dies_at=1100.0, node1=UP)

    def job_nodes(job_id):
        return ["node1", "node2", "node3"]

    world.job_nodes = job_nodes  # type: ignore[method-assign]
    standby = world.standby()
    standby.doors.job_nodes = job_nodes
    with pytest.raises(AssertionError, match="never decided"):
        standby.run()
    assert world.taken == [] and 0 < world.asked <= 600 / 2.0  # at most once per summary interval


def test_the_standby_gives_its_agent_the_job_environment_not_its_own_steps():
    env = job_environment({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_STEP_ID": "1",
                           "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "clusterctl-standby", "PATH": "/bin"})
    assert env == {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]", "PATH": "/bin"}


# ---- the agent that took over, and the one that lost ----------------------------------------------
def test_an_agent_taking_over_from_a_dead_batch_host_goes_on_on_the_spare_from_the_checkpoint(tmp_path):
    cluster = Cluster(fail=[])
    shell = agent(tmp_path, cluster, batch_host="node3")
    shell.epoch = 2
    take_lease(shell.job_dir, AgentLease(1, "node1", 10, 1.0))
    from clusterctl.launcher.pure.takeover import Takeover
    code = shell.take_over(Takeover("node1", ("the agent on node1 silent for 7.5 s", "Slurm: node1 is down*"), True),
                           ["node1", "node2", "node3"], None)
    assert code == 0
    (step,) = cluster.steps
    assert step.argv[-2:] == ["--resume", str(shell.run_dir / "checkpoints" / "step-00000020")]
    assert step.env["SLURM_JOB_NODELIST"] == "node[2-3]"
    (event,) = [e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                if isinstance(e, RecoveredInAllocation)]
    assert (event.agent, event.took_over_from, [b.node for b in event.blame]) == ("node3", "node1", ["node1"])
    assert "Slurm: node1 is down*" in event.blame[0].evidence
    assert event.given_back == ("node1",) and cluster.shrinks == []  # Slurm took it out of the job already
    assert current_lease(shell.job_dir).node == "node3"


def test_an_agent_whose_job_was_taken_over_stands_down_and_acts_no_more(tmp_path):
    cluster = Cluster(fail=["node2"])
    shell = agent(tmp_path, cluster)
    waited = []

    def taken_over_during_the_step(argv, env):
        step = cluster.start(argv, env)
        take_lease(shell.job_dir, AgentLease(2, "node3", 11, 2.0, why="node1 silent; Slurm: node1 is down*"))
        return step

    shell.doors.start_step = taken_over_during_the_step
    shell.doors.wait_for_end = lambda: waited.append(True)
    assert shell.run(None) == 0
    assert waited == [True]
    assert cluster.shrinks == [] and len(cluster.steps) == 1  # node2 failed, but the new agent deals with it
    assert not [e for e in read_run_journal(shell.run_dir / "journal.jsonl").events
                if isinstance(e, RecoveredInAllocation)]


def test_the_steps_a_new_agent_cancels_are_the_numbered_ones_of_its_job_but_its_own():
    from clusterctl.slurm.commands import Completed, Slurm
    calls = []

    def runner(argv, timeout):
        calls.append(list(argv))
        if argv[0] == "squeue":  # `squeue -h -s -j 1 -o %i` on the testbed, the batch host just died (26.05)
            return Completed(0, "1.0\n1.1\n1.batch\n1.extern\n12.3\n", "")
        return Completed(0, "", "")

    slurm = Slurm(runner)
    steps = [s for s in slurm.job_steps("1") if s != "1.0"]
    slurm.cancel_steps(steps)
    assert steps == ["1.1"] and calls[-1] == ["scancel", "1.1"]
    with pytest.raises(Exception, match="not a step id"):
        slurm.cancel_steps(["1.--help"])


def test_a_step_is_found_by_its_name_and_sigkilled():
    from clusterctl.slurm.commands import Completed, Slurm
    calls = []

    def runner(argv, timeout):
        calls.append(list(argv))
        if argv[0] == "squeue":  # `squeue -h -s -o "%i %j"` on the testbed (22.05): a step of srun's default
            # name (the program's), the standby's, the batch step
            return Completed(0, "2.0 python\n2.1 clusterctl-standby\n2.batch batch\n", "")
        return Completed(0, "", "")

    slurm = Slurm(runner)
    steps = slurm.job_steps("2", "python")
    slurm.cancel_steps(steps, signal="KILL")
    assert steps == ["2.0"] and calls[-1] == ["scancel", "--signal=KILL", "2.0"]
    assert slurm.job_steps("2") == ["2.0", "2.1"] and slurm.job_steps("2", "clusterctl-ranks") == []
    with pytest.raises(Exception, match="not a signal name"):
        slurm.cancel_steps(steps, signal="-9; rm")
