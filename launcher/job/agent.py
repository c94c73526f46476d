"""The in-job agent: runs a job's ranks as srun steps, hears its nodes, and recovers inside the allocation.

`python -m clusterctl.launcher.job agent` (sbatch_templates/srun.sbatch and torchrun.sbatch: every job
with a built-in template; one with spares is submitted with --no-kill) plans the rank map over the
allocation's healthy nodes, runs every rank as one srun step (torchrun style: one torchrun per node,
static rendezvous on the map's first node), and hears each node's reporter (see
docs/architecture.md, "In-job signals"): frozen ranks, healthd's drains, hangs and stragglers, and
asks Slurm only about a node a report points at (clusterctl.launcher.classify.hardware_suspects:
drained by healthd, DOWN, silent past restart.unresponsive_seconds) plus a budgeted sweep.
When a node fails it ends the step at once (ranks of the other nodes may hang in a collective
behind the dead one).  With a spare it gives the failed node back to Slurm (`scontrol update
JobId= NodeList=`: the admins see it drained, not held by a job), plans again over the remaining
nodes (a spare takes the failed node's place where the map costs least; tensor-parallel groups
stay inside a node) and starts a new step from the last complete checkpoint, without going
through the queue.  Each such restart is a `recovered-in-allocation` event in the run's journal,
with its evidence and timings.

What follows a step is not decided here: the agent gathers what happened (the step's exit code,
the nodes that failed under it, hung ranks, what the program asked for with its exit code, the last
checkpoint, the run's restart budget replayed from the journal) and asks `recovery.judge`, the
function the supervisor asks too.  It exits with the step's exit code when the judge leaves the
attempt to the supervisor: the program's own failure, no spare left (the failed node stays in the
job, so the supervisor blames it and resubmits without it), a failed batch host (the agent runs
there: losing it ends the job, and the supervisor's resubmission is the fallback), or the run's
restart budget spent.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from clusterctl.errors import SlurmCommandError
from clusterctl.launcher.job.agent_doors import AgentDoors
from clusterctl.launcher.job.agent_outputs import AgentOutputs, MetricsExport
from clusterctl.launcher.job.checkpoint_plan import TierPlanner
from clusterctl.launcher.job.leadership import Leadership, StoodDown
from clusterctl.launcher.job.rank_stacks import keep_hang_stacks
from clusterctl.launcher.job.step_launch import Launched, StepLauncher, open_report_inbox
from clusterctl.launcher.job.step_watch import StepWatch
from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.pure.classify import NODE_FAILURE, Blame, Outcome, step_outcome
from clusterctl.launcher.pure.parallel import ParallelLayout, with_data_parallel
from clusterctl.launcher.pure.recovery import Act, Allocation, Happened, Recovery, RestartBudget, judge
from clusterctl.launcher.pure.restart_policy import replay
from clusterctl.launcher.pure.shrink import JobShape, nodes_for
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.pure.takeover import Takeover
from clusterctl.launcher.shared.checkpoints import resume_point
from clusterctl.launcher.shared.straggler_actions import StragglerActions, StragglerDoors
from clusterctl.records.run_journal import OutcomeKind, RecoveredInAllocation, append_run_event, read_run_journal
from clusterctl.records.versioned import RecordError
from clusterctl.slurm import hostlist

STOP_GRACE_SECONDS = 15.0
"""How long an interrupted step may take to end before srun is killed, when its ranks could not be
SIGKILLed through Slurm."""
NODE_FAILED_STOP_SECONDS = 0.5
"""The same once the ranks were SIGKILLed through Slurm: the live nodes' end within a second, and srun
itself waits for a dead node's, which may never answer (until Slurm declares that node DOWN:
SlurmdTimeout, 300 s by default), so srun is killed after this; the next step does not wait for what
of the old one Slurm still lists (--overlap)."""


class Agent:
    """One job's in-allocation agent: its drive loop (a step, what the judge says of how it ended, the
    restart inside the allocation), with the step's watch (launcher/job/step_watch.py), its outputs
    (launcher/job/agent_outputs.py) and its hold on the job's lease (launcher/job/leadership.py) as parts."""

    def __init__(self, run_dir: Path, job_dir: Path, spec: JobSpec, environ: Mapping[str, str], doors: AgentDoors,
                 *, python: str = sys.executable, epoch: int = 1) -> None:
        self.run_dir, self.job_dir, self.spec, self.environ, self.doors = run_dir, job_dir, spec, environ, doors
        self.python = python
        self.job_id = environ["SLURM_JOB_ID"]
        self.allocated = tuple(hostlist.expand(environ["SLURM_JOB_NODELIST"]))
        # Slurm runs the batch script (this agent) on the allocation's first node; an agent that took
        # over runs on its standby's node.  Either way, the node this agent runs on: never given back.
        self.batch_host = environ.get("SLURMD_NODENAME") or self.allocated[0]
        self.lease = Leadership(run_dir, job_dir, doors, python=python, epoch=epoch, batch_host=self.batch_host)
        self.ended: tuple[Outcome, Recovery] | None = None
        self.layout: ParallelLayout = spec.parallel
        """The layout the job's steps run at: the spec's until the job shrinks (restart.min_data_parallel)."""
        """How the last step ended and what the judge said (for an agent that must end the job itself)."""

    @property
    def epoch(self) -> int:
        """The epoch of the job's lease this agent takes (1: the batch script's agent; a standby's: the next)."""
        return self.lease.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.lease.epoch = epoch

    def _prepare(self) -> RestartBudget:
        """What every agent needs before its first step: straggler doors, budget, report key and inbox, the
        metrics file, the checkpoint tiers, and the parts that use them; the run's restart budget."""
        doors = self.doors
        straggler_actions = StragglerActions(
            self.run_dir, self.job_dir, self.job_id, self.spec.stragglers.action, self.spec.restart.blame_hours,
            StragglerDoors(doors.now, doors.say, doors.gpu_evidence, doors.drain))
        budget = self._budget(RestartBudget())
        report_key, inbox = open_report_inbox(doors, len(self.allocated))
        metrics = MetricsExport(self.environ, doors, self.job_id, self.spec.job.name)
        metrics.choose()
        self.tiers: TierPlanner | None = None
        if self.spec.checkpoint.tiers:
            self.tiers = TierPlanner(self.run_dir, self.job_dir, self.spec, self.environ, doors.say, doors.monotonic)
            self.tiers.load_previous()
        self.steps = StepLauncher(self.run_dir, self.spec, self.environ, doors, python=self.python,
                                  job_id=self.job_id, batch_host=self.batch_host, tiers=self.tiers,
                                  report_key=report_key, inbox=inbox)
        self.outputs = AgentOutputs(self.run_dir, self.job_dir, self.job_id, self.spec, doors, self.tiers, metrics)
        self.watch = StepWatch(self.spec, self.environ, doors, batch_host=self.batch_host,
                               log_path=self.steps.log_path, tiers=self.tiers, straggler_actions=straggler_actions,
                               outputs=self.outputs, lease=self.lease)
        return budget

    def run(self, resume_from: str | None) -> int:
        """Steps until one completes, fails on its own, or the judge sends the job back to the supervisor
        (no spare left, the batch host failed, the restart budget spent); the job's exit code."""
        budget = self._prepare()
        try:
            self.lease.lead()
            if self.tiers is not None:
                first = self._checkpoint(present=self.allocated)
                resume_from = first.path if first else None
            launched = self.steps.launch(self.job_dir, self.allocated, resume_from)
            self._keep_standby(launched, self.allocated, resume_from)
            return self._drive(launched, self.allocated, resume_from, 0, budget)
        except StoodDown as exc:
            self.outputs.metrics.withdraw()  # the agent in charge writes its own, on its node
            self.doors.say(f"standing down: {exc}; waiting for the job to end")
            self.doors.wait_for_end()
            return 0
        finally:
            self.outputs.metrics.withdraw()

    def take_over(self, taken: Takeover, in_use: Sequence[str], resume_from: str | None) -> int | None:
        """Carry on the job whose agent (on its batch host, `taken.node`) is gone: take the next epoch of
        the lease, cancel the steps the old agent left, and recover as from any node failure (`in_use`:
        the nodes of its last step and the job's spares, the dead host among them).  The job's exit
        code; None when another agent took this epoch first (this one then does nothing)."""
        budget = self._prepare()
        try:
            return self._carry_on(taken, in_use, resume_from, budget)
        finally:
            self.outputs.metrics.withdraw()

    def _carry_on(self, taken: Takeover, in_use: Sequence[str], resume_from: str | None,
                  budget: RestartBudget) -> int | None:
        self.lease.took_over_from = taken.node
        self.lease.out_of_job = frozenset({taken.node}) if taken.left_job else frozenset()
        try:
            self.lease.lead(why="; ".join(taken.evidence))
        except StoodDown as exc:
            self.doors.say(f"not taking over: {exc}")
            return None
        seen = self.doors.monotonic()
        self.doors.say(f"taking the job over from {taken.node} (epoch {self.lease.epoch}): {'; '.join(taken.evidence)}")
        if self.doors.cancel_other_steps is not None:
            try:
                stray = self.doors.cancel_other_steps(self.job_id)
                if stray:
                    self.doors.say(f"cancelled the old agent's steps {' '.join(stray)}")
            except SlurmCommandError as exc:
                self.doors.say(f"could not cancel the old agent's steps ({exc}); starting the next one all the same")
        ended = self.doors.monotonic()
        blame = Blame(taken.node, "the batch host died with the job's agent", taken.evidence)
        outcome = Outcome(NODE_FAILURE, f"the batch host {taken.node} died", (blame,))
        checkpoint = self._checkpoint([n for n in in_use if n != taken.node])
        budget = self._budget(budget)
        restart = self._next_restart()  # and the layout the old agent's steps ran at, before judging
        decision = judge(Happened(outcome, checkpoint.step if checkpoint else None,
                                  Allocation(tuple(in_use), self._needed(in_use), self.batch_host,
                                             shape=self._shape(in_use))),
                         budget, self.spec.restart)
        self.ended = (outcome, decision)
        self.doors.say(decision.message)
        if not decision.act.in_allocation:
            return 1
        try:
            launched = self._restart(decision, restart, checkpoint, resume_from, seen, ended)
            resume_from = checkpoint.path if checkpoint else resume_from
            self._keep_standby(launched, decision.nodes, resume_from)
            return self._drive(launched, decision.nodes, resume_from, restart, decision.budget)
        except StoodDown as exc:
            self.doors.say(f"standing down: {exc}")
            return None

    def _next_restart(self) -> int:
        """The number of the next restart inside this job (after the old agent's, which the journal holds); the
        layout the old agent's last step ran at (a shrink it journaled) becomes this agent's."""
        try:
            done = [e for e in read_run_journal(self.run_dir / "journal.jsonl").events
                    if isinstance(e, RecoveredInAllocation) and e.job_id == self.job_id]
        except (OSError, RecordError):
            done = []
        if done and done[-1].data_parallel_after is not None:
            self.layout = with_data_parallel(self.spec.parallel, done[-1].data_parallel_after)
        restart = max((e.restart for e in done), default=0) + 1
        while (self.job_dir / f"restart-{restart}").exists():
            restart += 1
        return restart

    def _keep_standby(self, launched: Launched, in_use: Sequence[str], resume_from: str | None) -> None:
        """Keep a standby agent on a spare of the job (launcher/job/leadership.py)."""
        self.lease.keep_standby(launched, in_use, resume_from, self.environ,
                                recovers_in_allocation=self.spec.recovers_in_allocation)

    def _drive(self, launched: Launched, in_use: Sequence[str], resume_from: str | None, restart: int,
               budget: RestartBudget) -> int:
        """Watch `launched` and what follows it, step after step, until the judge leaves the job to the
        supervisor or the run completes; the job's exit code."""
        hang_restarts = 0
        in_use = tuple(in_use)
        while True:
            stacks: tuple[str, ...] = ()
            watched = self.watch.watch(launched, len(in_use) - self._needed(in_use))
            code, suspects, seen = watched.exit_code, watched.suspects, watched.seen
            if code is None:
                why = "; ".join(watched.hang.evidence) if watched.hang else \
                    "; ".join(f"{b.node}: {b.reason}" for b in suspects) if suspects else "?"
                self.doors.say(f"ending the step now: {why}")
                if watched.hang is not None:  # keep why before the ranks are gone (bounded: rank_stacks.py)
                    stacks = keep_hang_stacks(self.doors.dump_stacks, launched.job_dir, launched.launch,
                                              launched.slots, watched.hang, self.environ)
                    for line in stacks:
                        self.doors.say(f"stacks: {line}")
                code = self._end_step(launched)
            elif code != 0:
                suspects = self.watch.evidence_after(launched.slots)
                seen = self.doors.monotonic()
            ended = self.doors.monotonic()
            log = ""
            if code != 0 and not suspects and watched.hang is None and self.spec.restart.exit_actions:
                lines, _ = self.doors.read_log(self.steps.log_path, launched.log_offset)
                log = "\n".join(lines) + "\n"
            failed_resume: list[str] = []
            if self.tiers is not None:
                if launched.signals is not None:  # the holdings the nodes reported last, before planning
                    launched.signals.poll()
                    self.tiers.observe(launched.signals.holdings())
                self.outputs.journal_resume(launched.signals.holdings() if launched.signals is not None else {},
                                            step_ended=True)
                if code != 0 and not suspects and watched.hang is None:
                    failed_resume = self.tiers.resume_failed(launched.job_dir)
            outcome = step_outcome(code, suspects, watched.hang.evidence if watched.hang else None, log,
                                   self.spec.restart.exit_actions, failed_resume)
            blamed = {b.node for b in outcome.blame}
            checkpoint = self._checkpoint([n for n in in_use if n not in blamed]) \
                if outcome.kind != OutcomeKind.COMPLETED else None
            budget = self._budget(budget)
            decision = judge(Happened(outcome, checkpoint.step if checkpoint else None,
                                      Allocation(in_use, self._needed(in_use), self.batch_host, hang_restarts,
                                                 self._shape(in_use)),
                                      hung=watched.hang is not None), budget, self.spec.restart)
            self.ended = (outcome, decision)
            self.doors.say(decision.message)
            if launched.signals is not None:
                self.outputs.summarize(launched, launched.signals, launched.signals.poll(),
                                       "recovering" if decision.act.in_allocation else "ended")
                self.lease.check_in_charge()
            if not decision.act.in_allocation:
                if self.tiers is not None:
                    self.tiers.record_pending()  # the run's next job plans from it
                return 0 if decision.act == Act.DONE else code or 1
            if decision.act == Act.RESTART_IN_PLACE and watched.hang is not None:
                hang_restarts += 1
            restart += 1
            launched = self._restart(decision, restart, checkpoint, resume_from, seen, ended, stacks)
            resume_from = checkpoint.path if checkpoint else resume_from
            budget = decision.budget
            in_use = decision.nodes
            self._keep_standby(launched, in_use, resume_from)

    def _end_step(self, launched: Launched) -> int:
        """End the step now: its ranks are SIGKILLed through Slurm at once (nothing they could still do is
        of use: a hung collective, or peers behind a dead node; a hang's stacks are kept before this), so
        neither Slurm's KillWait (30 s by default) nor a program that traps SIGTERM holds the next step up;
        meanwhile srun is interrupted and killed after NODE_FAILED_STOP_SECONDS (it waits for a dead node's
        tasks until Slurm declares that node DOWN).  Without the door (a test's agent): srun's own cancel, with
        STOP_GRACE_SECONDS for the ranks to end."""
        if self.doors.kill_ranks is None:
            return launched.step.stop(STOP_GRACE_SECONDS)
        # scancel answers only once slurmctld has tried every node of the step, a dead one for MessageTimeout
        # (10 s by default; measured: 12 s): it runs beside srun's end, and nothing waits for it.  It kills the
        # step by the id it finds now, so a late one never reaches the next step.
        killing = threading.Thread(target=self._kill_ranks, name="kill ranks", daemon=True)
        killing.start()
        code = launched.step.stop(NODE_FAILED_STOP_SECONDS)
        killing.join(0.0)
        return code

    def _kill_ranks(self) -> None:
        assert self.doors.kill_ranks is not None
        try:
            self.doors.kill_ranks(self.job_id)
        except SlurmCommandError as exc:
            self.doors.say(f"could not SIGKILL the step's ranks through Slurm ({exc}); Slurm ends them after "
                           "KillWait")

    def _needed(self, in_use: Sequence[str]) -> int:
        """Nodes the job needs of `in_use`: all of them unless it recovers inside the allocation (a job
        without spares that may not shrink, or one whose spec asks for recovery by resubmission, swaps
        nothing); after a shrink, the nodes its smaller layout fills."""
        if self.layout != self.spec.parallel:
            return nodes_for(self.layout, self.spec.job.gpus_per_node, self.layout.dp)
        return self.spec.job.nodes if self.spec.recovers_in_allocation or self._may_shrink else len(in_use)

    @property
    def _may_shrink(self) -> bool:
        floor = self.spec.restart.min_data_parallel
        return self.spec.restart.recover == "in-allocation" and floor is not None and floor < self.spec.parallel.dp

    def _shape(self, in_use: Sequence[str]) -> JobShape | None:
        """What the judge re-plans a shrink with (None: the job may not shrink, or Slurm's topology cannot be
        read now, said; the judge then ends the job for the supervisor as without a shrink)."""
        if not self._may_shrink:
            return None
        from clusterctl.launcher.job.steps import job_topology
        try:
            topology, _ = job_topology(self.spec.placement.topology, self.doors.slurm, in_use)
        except (SlurmCommandError, OSError, ValueError) as exc:
            self.doors.say(f"cannot read the topology to plan a smaller job ({exc}); not shrinking")
            return None
        return JobShape(self.layout, self.spec.parallel.dp, self.spec.job.gpus_per_node, topology,
                        tuple(self.spec.placement.weight_map().items()))

    def _budget(self, counted: RestartBudget) -> RestartBudget:
        """The run's restart budget as its journal says (`counted`, what this agent last knew, when the
        journal cannot be read): the supervisor's resubmissions and every restart inside this job."""
        try:
            return replay(read_run_journal(self.run_dir / "journal.jsonl").events).budget
        except (OSError, RecordError) as exc:
            self.doors.say(f"cannot read the run's journal ({exc}); judging with the restarts counted here")
            return counted

    def _restart(self, decision: Recovery, restart: int, checkpoint: Checkpoint | None, resume_from: str | None,
                 seen: float, ended: float, stacks: tuple[str, ...] = ()) -> Launched:
        """Act on a restart inside the allocation: give the blamed nodes back, start step `restart` on
        `decision.nodes` from `checkpoint`, and journal it (one restart of the run's budget)."""
        self.lease.check_in_charge()
        blamed = [b.node for b in decision.blame] + list(decision.give_back)
        given_back: tuple[str, ...] = tuple(n for n in blamed if n in self.lease.out_of_job)
        if blamed and len(given_back) < len(blamed):
            # The batch host stays in the job even when a shrink's map leaves it without ranks: the agent runs there.
            keep = (*decision.nodes, *(() if self.batch_host in decision.nodes else (self.batch_host,)))
            try:
                # scontrol writes slurm_job_<id>_resize.{sh,csh} into its working directory: ours, not the user's.
                with contextlib.chdir(self.job_dir):
                    self.doors.slurm.shrink_job(self.job_id, keep)
                given_back = tuple(blamed)
            except SlurmCommandError as exc:  # recover all the same; the node stays in the job until it ends
                self.doors.say(f"could not give {', '.join(blamed)} back to Slurm: {exc}")
        before = self.layout
        if decision.data_parallel is not None:
            self.layout = with_data_parallel(self.layout, decision.data_parallel)
        shrunk = self.doors.monotonic()
        job_dir = self.job_dir / f"restart-{restart}"
        resume_from = checkpoint.path if checkpoint else resume_from
        slots: tuple[str, ...] = ()
        try:
            launched = self.steps.launch(job_dir, decision.nodes, resume_from, restart, self.layout,
                                         decision.planned)
            slots = launched.slots
        finally:  # the blame is journaled even when the new step cannot start: a resubmission avoids it
            done = self.doors.monotonic()
            until = self.doors.now() + self.spec.restart.blame_hours * 3600
            append_run_event(self.run_dir / "journal.jsonl", RecoveredInAllocation(
                at=self.doors.now(), job_id=self.job_id, restart=restart,
                blame=tuple(b.to_journal(until) for b in decision.blame), nodes=slots, given_back=given_back,
                checkpoint_step=checkpoint.step if checkpoint else None,
                # Never a folder the checkpoint is not in: one the nodes' tiers give is named by its step.
                checkpoint=checkpoint.path if checkpoint and not checkpoint.from_tiers else None,
                phases=(("end_step", round(ended - seen, 3)), ("give_back", round(shrunk - ended, 3)),
                        ("plan_and_launch", round(done - shrunk, 3))),
                reason=decision.message if not decision.blame else "", agent=self.batch_host,
                took_over_from=self.lease.took_over_from, stacks=stacks,
                **({} if before == self.layout == self.spec.parallel else
                   {"data_parallel_before": before.dp, "data_parallel_after": self.layout.dp})))
            self.lease.took_over_from = ""
            if self.tiers is not None:  # the step has started (or could not): off the recovery's critical path
                self.tiers.record_pending()
        # With tiers a step without a checkpoint starts afresh (StepLauncher.launch hands it no earlier path).
        began = checkpoint.where if checkpoint else "the start" if self.tiers is not None else resume_from or "the start"
        smaller = (f" with {self.layout.dp} of {self.spec.parallel.dp} data-parallel replicas"
                   if self.layout != self.spec.parallel else "")
        self.doors.say(f"restart {restart}: a new step on {' '.join(slots)}{smaller} from {began} (no queue wait)")
        return launched

    def _checkpoint(self, present: Sequence[str] = ()) -> Checkpoint | None:
        """The checkpoint the next step resumes from; with tiers, the newest complete across the tiers of
        the nodes `present` (every other node's fast tier counts as gone)."""
        if self.tiers is not None:
            return self.tiers.resume_point(present)
        return resume_point(self.spec.checkpoint_dir(str(self.run_dir)), self.spec.checkpoint.validator, self.doors.say)
