"""The standby agent: one step on a spare node of the job, ready to take the job over when the node
running its agent (the batch host) dies.

Started by the active agent (`python -m clusterctl.launcher.job standby`, one `srun --overlap` task on
a node outside the training step).  While all is well it reads one small file a second on its own
view of the run directory (the agent's summary) and asks Slurm nothing.  When the summary stops
changing for three of its intervals, it asks Slurm about the active agent's node (one single-node
query and one single-job query, at most once per interval); when Slurm says that node is gone
(`clusterctl.launcher.pure.takeover` decides), it takes the next epoch of the job's lease and
becomes the job's agent (`Agent.take_over`): it cancels the steps the dead agent left, judges the
loss like any node failure and goes on on the survivors and a spare from the last complete
checkpoint.  The batch script died with its node, so the job cannot end by itself: when the new
agent is done it journals how (`agent-ended`, read by the supervisor) and cancels the job.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.errors import HostlistError, SlurmCommandError
from clusterctl.launcher.pure.classify import Outcome
from clusterctl.launcher.pure.recovery import Recovery
from clusterctl.launcher.pure.takeover import Quiet, Takeover, takeover
from clusterctl.records.agent_lease import AgentLease, current_lease, register_standby
from clusterctl.records.agent_summary import read_agent_summary
from clusterctl.records.run_journal import AgentEnded, BlamedNode, OutcomeKind, append_run_event
from clusterctl.records.versioned import RecordError
from clusterctl.slurm import hostlist
from clusterctl.slurm.nodes import NodeState

LOOK_SECONDS = 1.0
"""How often the standby looks at the active agent's summary (one stat and read on its node's view)."""
DEFAULT_INTERVAL = 2.0
"""The summary interval assumed before the active agent wrote one (agent_outputs.SUMMARY_MIN_SECONDS)."""


@dataclass
class StandbyDoors:
    """Side effects, passed in so tests can swap them."""

    node_state: Callable[[str], NodeState]
    job_nodes: Callable[[str], Sequence[str] | None]
    """The running job's nodes (None: Slurm no longer holds the job)."""
    take_over: Callable[[Takeover, Sequence[str], int], int | None]
    """Become the job's agent at an epoch; its exit code (None: another agent took that epoch)."""
    end_job: Callable[[str], None]
    now: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    say: Callable[[str], None] = field(default=lambda message: print(f"clusterctl standby: {message}",
                                                                       file=sys.stderr, flush=True))


class Standby:
    """Watches the active agent of one job from another node of its allocation."""

    def __init__(self, run_dir: Path, job_dir: Path, environ: Mapping[str, str], epoch: int,
                 doors: StandbyDoors) -> None:
        self.run_dir, self.job_dir, self.epoch, self.doors = run_dir, job_dir, epoch, doors
        self.job_id = environ["SLURM_JOB_ID"]
        self.node = environ.get("SLURMD_NODENAME", "")
        self.allocated = tuple(hostlist.expand(environ["SLURM_JOB_NODELIST"]))

    def run(self) -> int:
        """Stand by until this standby takes the job over (then its exit code) or another agent holds a
        later epoch (0)."""
        doors = self.doors
        register_standby(self.job_dir, AgentLease(self.epoch, self.node, os.getpid(), doors.now(), role="standby"))
        doors.say(f"standing by on {self.node} for job {self.job_id} (epoch {self.epoch})")
        started = doors.now()
        summary_value: float | None = None
        summary_seen: float | None = None
        next_ask = 0.0
        while True:
            doors.sleep(LOOK_SECONDS)
            now = doors.now()
            try:
                lease = current_lease(self.job_dir)
            except (OSError, RecordError) as exc:
                doors.say(f"cannot read the job's lease ({exc}); looking again")
                continue
            if lease is None:
                continue
            if lease.epoch >= self.epoch:
                doors.say(f"the agent on {lease.node} holds epoch {lease.epoch}: this standby is not needed")
                return 0
            interval = DEFAULT_INTERVAL
            try:
                summary = read_agent_summary(self.job_dir)
            except (OSError, RecordError):
                summary = None
            if summary is not None and summary.job_id == self.job_id:
                interval = summary.interval
                if summary.at != summary_value:  # seen changing on this node's clock: no clock skew matters
                    summary_value, summary_seen = summary.at, now
            quiet = Quiet(summary_seen, started, interval)
            if not quiet.silent(now) or now < next_ask:
                continue
            next_ask = now + max(LOOK_SECONDS, interval)
            taken = self._ask_slurm(lease, quiet, now)
            if taken is not None:
                return self._take_over(taken)

    def _ask_slurm(self, lease: AgentLease, quiet: Quiet, now: float) -> Takeover | None:
        state: NodeState | None = None
        nodes: Sequence[str] | None = None
        try:
            state = self.doors.node_state(lease.node)
        except SlurmCommandError as exc:
            self.doors.say(f"cannot read {lease.node} from Slurm ({exc})")
        try:
            nodes = self.doors.job_nodes(self.job_id)
        except (SlurmCommandError, HostlistError) as exc:
            self.doors.say(f"cannot read job {self.job_id} from Slurm ({exc})")
        return takeover(lease.node, quiet, now, state, nodes)

    def _take_over(self, taken: Takeover) -> int:
        nodes = self.doors.job_nodes(self.job_id) or ()
        # The dead agent's last allocation: the job's nodes (allocation order) and the dead one.
        in_use = [n for n in self.allocated if n in nodes or n == taken.node]
        code = self.doors.take_over(taken, in_use, self.epoch)
        if code is None:
            return 0
        return code


def end_taken_over_job(run_dir: Path, job_id: str, node: str, epoch: int, code: int,
                       ended: tuple[Outcome, Recovery] | None, end_job: Callable[[str], None],
                       say: Callable[[str], None]) -> None:
    """Journal how the job ended (`agent-ended`, for the supervisor) and cancel it: its batch script
    died with the old agent's node, so nothing else ends it."""
    outcome_kind = OutcomeKind.COMPLETED if code == 0 else OutcomeKind.NODE_FAILURE
    message = ""
    blame: tuple[BlamedNode, ...] = ()
    if ended is not None:
        outcome, decision = ended
        outcome_kind, message = OutcomeKind(outcome.kind), decision.message
        blame = tuple(b.to_journal(None) for b in outcome.blame)
    append_run_event(run_dir / "journal.jsonl", AgentEnded(
        at=time.time(), job_id=job_id, agent=node, epoch=epoch, exit_code=code, outcome=outcome_kind,
        message=message, blame=blame))
    say(f"job {job_id} ends ({outcome_kind}: {message or code}); cancelling it: its batch script died with "
        "the old agent's node")
    try:
        end_job(job_id)
    except SlurmCommandError as exc:
        say(f"could not cancel job {job_id} ({exc}); cancel it yourself: scancel {job_id}")


STEP_ONLY = ("SLURM_STEP_", "SLURM_SRUN_COMM_", "SLURM_CPU_BIND", "SLURM_LAUNCH_NODE_IPADDR", "SLURM_PROCID",
             "SLURM_LOCALID", "SLURM_NODEID", "SLURM_TASK_PID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_DISTRIBUTION",
             "SLURM_GTIDS", "SLURM_JOB_NAME", "SLURM_KILL_BAD_EXIT", "SLURM_OVERLAP", "SLURM_TASKS_PER_NODE")
"""What srun sets for the standby's own one-task step, and would take as options for the next steps."""


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The standby's environment without its own step's variables: the batch script's, for an agent."""
    return {k: v for k, v in environ.items() if not k.startswith(STEP_ONLY)}


def main(run_dir: Path, job_dir: Path, resume_from: str | None, epoch: int, environ: Mapping[str, str]) -> int:
    """`python -m clusterctl.launcher.job standby`: the real doors."""
    from clusterctl.launcher.job.agent import Agent
    from clusterctl.launcher.job.agent_doors import collect_garbage_rarely, default_doors
    from clusterctl.launcher.shared.runs import RunDir
    from clusterctl.slurm.commands import Slurm
    from clusterctl.slurm.nodes import SlurmNode

    slurm = Slurm()

    def job_nodes(job_id: str) -> Sequence[str] | None:
        report = slurm.job(job_id)
        if report is None or report.terminal:
            return None
        return hostlist.expand(report.nodes) if report.nodes else []

    def become_agent(taken: Takeover, in_use: Sequence[str], at_epoch: int) -> int | None:
        collect_garbage_rarely()
        # This step's srun died with the old batch host: what the new agent and its steps print goes to
        # the job's log, as the batch script's did.
        log = os.open(run_dir / "logs" / f"{environ['SLURM_JOB_ID']}.out", os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        agent = Agent(run_dir, job_dir, RunDir(run_dir).spec(), job_environment(environ), default_doors(),
                      epoch=at_epoch)
        code = agent.take_over(taken, in_use, resume_from)
        if code is not None:
            end_taken_over_job(run_dir, agent.job_id, agent.batch_host, at_epoch, code, agent.ended,
                               lambda job: slurm.cancel([job]), doors.say)
        return code

    doors = StandbyDoors(node_state=lambda name: SlurmNode(name, slurm.runner, slurm.timeout).state(),
                         job_nodes=job_nodes, take_over=become_agent, end_job=lambda job: slurm.cancel([job]))
    return Standby(run_dir, job_dir, environ, epoch, doors).run()
