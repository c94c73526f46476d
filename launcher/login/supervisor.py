"""The supervisor: watch a run's attempt, and when a node kills it, resubmit from the last
complete checkpoint with that node excluded; stop when the failure is the program's own.

Everything it decides is appended to the run's journal before it acts, and everything it
knows is replayed from that journal, so a supervisor killed at any point and started again
(`clusterctl supervise RUN`) carries on without a duplicate job or a repeated decision.
Slurm, the clock, sleeping and notifications are passed in (`Hooks`, launcher/login/supervisor_doors.py).

This module is the drive loop: replay the journal, then submit, reconcile or watch, and when the
attempt ended ask `recovery.judge` (the function the in-allocation agent asks too).  Its parts, one
job each: the watch over the attempt in Slurm (attempt_watch.py), the evidence of how it ended
(attempt_evidence.py), the straggler watch of a job without an agent (attempt_stragglers.py), the
submissions (resubmission.py), and what it says, shows and notifies (supervisor_outputs.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.errors import SlurmCommandError
from clusterctl.launcher.login.attempt_evidence import AttemptEvidence
from clusterctl.launcher.login.attempt_stragglers import AttemptStragglers
from clusterctl.launcher.login.attempt_watch import CHANGING_STATES, AttemptWatch, job_nodes, next_poll_interval
from clusterctl.launcher.login.resubmission import Resubmission, last_checkpoint
from clusterctl.launcher.login.shared_reads import SharedReads
from clusterctl.launcher.login.supervisor_doors import Hooks, WatchSnapshot
from clusterctl.launcher.login.supervisor_outputs import SupervisorOutputs
from clusterctl.launcher.pure.classify import NODE_FAILURE, Outcome
from clusterctl.launcher.pure.recovery import Happened, judge
from clusterctl.launcher.pure.render import SlurmFacts
from clusterctl.launcher.pure.restart_policy import AttemptState, RunState, replay
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.records.run_journal import Decided, DecisionAction, EventKind, RunEnded, SlurmTimes
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.jobs import JobReport
from clusterctl.slurm.version import SlurmVersionError

__all__ = ["EXIT_CANCELLED", "EXIT_DONE", "EXIT_STOPPED", "Hooks", "Supervisor", "WatchSnapshot", "job_nodes",
           "next_poll_interval"]

EXIT_DONE, EXIT_STOPPED, EXIT_CANCELLED = 0, 1, 2
MISSING_POLLS = 15  # polls a submitted job may be absent from squeue and sacct before it counts as lost


@dataclass
class Supervisor:
    """Supervise one run until it is done, stopped or cancelled.

    `facts`: what `submit` already asked Slurm (version, topology); None makes the supervisor
    ask before its first submission.  `records_dir`: where the epilog writes its per-job
    health records (None: no such evidence).  Of its ~16 attributes, eight are what it is started
    with; the rest are its five parts and two counters of the loop's own.
    """

    run: RunDir
    slurm: Slurm
    python: str
    records_dir: Path | None = None
    hooks: Hooks = field(default_factory=Hooks)
    evidence_grace: float = 3.0
    facts: SlurmFacts | None = None
    uid: int = field(default_factory=os.getuid)
    """The user whose jobs are this run's (jobs of other users with our comment are not)."""

    def __post_init__(self) -> None:
        self.run = RunDir(self.run.path, clock=self.hooks.clock)  # the journal keeps the supervisor's time
        self.spec: JobSpec = self.run.spec()
        self._missing = 0
        self._slurm_errors = 0
        # Watching reads go through a cache shared with the other supervisors of this runs
        # directory; checks before an sbatch (live copies, reconciling) ask Slurm directly.
        reads = SharedReads(self.slurm, self.run.path.parent, self.spec.restart.poll_seconds, self.hooks.clock)
        self.outputs = SupervisorOutputs(self.run, self.spec, self.hooks)
        self.watch = AttemptWatch(self.run, self.spec, self.slurm, reads, self.hooks)
        self.evidence = AttemptEvidence(self.run, self.spec, self.records_dir, self.hooks, self.evidence_grace,
                                        self.watch.job_node_states)
        self.stragglers = AttemptStragglers(self.run, self.spec, self.hooks)
        self.resubmission = Resubmission(self.run, self.spec, self.slurm, reads, self.hooks, self.outputs,
                                         python=self.python, uid=self.uid, facts=self.facts)

    # ---- the loop ---------------------------------------------------------------
    def supervise(self) -> int:
        """Run until the run ends; the exit code (0 done, 1 stopped, 2 cancelled)."""
        self.run.check_owned()  # it acts on what the run's files say: only its owner's files count
        lock = self.run.lock()
        try:
            while True:
                journal = self.run.journal()
                self.outputs.warn_damaged(journal)
                state = replay(journal.events)
                if state.ended is not None:
                    return self._finish(state.ended)
                try:
                    self._step(state)
                    self._slurm_errors = 0
                except SlurmVersionError:
                    raise  # an answer this clusterctl cannot read stays unreadable: stop, clearly (exit 8)
                except SlurmCommandError as exc:
                    # slurmctld restarting or briefly unreachable: back off, never give up on the run.
                    self._slurm_errors += 1
                    delay = min(30.0, self.spec.restart.poll_seconds * 2 ** min(self._slurm_errors, 5))
                    self.hooks.say(f"Slurm did not answer ({exc}); retrying in {delay:.0f} s")
                    self.hooks.sleep(delay)
        finally:
            os.close(lock)

    def _step(self, state: RunState) -> None:
        current = state.current
        if current is None or (current.decided is not None and current.decided.action == DecisionAction.RESUBMIT):
            wait = state.next_submit_at - self.hooks.clock()
            if wait > 0:
                self.hooks.sleep(wait)
            if self.resubmission.submit_next(state, 1 if current is None else current.number + 1):
                self._missing = 0
        elif current.decided is not None:  # decided done/stop but the end event is missing (crash between)
            self.outputs.end(EventKind.DONE if current.decided.action == DecisionAction.DONE else EventKind.STOPPED,
                             current.decided.message)
        elif current.job_id is None:
            self.resubmission.reconcile(current)
        else:
            self._watch(current, state)

    def _watch(self, attempt: AttemptState, state: RunState) -> None:
        report = self.watch.report(attempt)
        if self.spec.runs_agent:
            self.stragglers.say_what_the_agent_found(attempt)
        if report is None:
            self._missing += 1
            if self._missing >= MISSING_POLLS:
                self._decide(attempt, state, None, Outcome(NODE_FAILURE, f"job {attempt.job_id} vanished from "
                                                                         "Slurm; resubmitting"))
                return
        elif report.terminal:
            self._missing = 0
            self._decide(attempt, state, report, None)
            return
        elif report.state == "RUNNING" and not attempt.ended_by_us:
            suspects, nodes = self.watch.running(attempt, report)
            if suspects:
                self.watch.end_attempt(attempt, suspects)
            elif not self.spec.runs_agent and self.spec.stragglers.action != "off":
                self.stragglers.watch(attempt, nodes)
        self.outputs.show(attempt, state, report)
        seen = (attempt.job_id, report.state if report else None, report.nodes if report else None)
        changing = report is None or bool(attempt.ended_by_us) or (report.state in CHANGING_STATES)
        self.hooks.sleep(self.watch.pace(seen, changing))

    def _decide(self, attempt: AttemptState, state: RunState, report: JobReport | None,
                outcome: Outcome | None) -> None:
        if outcome is None:
            assert report is not None
            outcome = self.evidence.outcome(attempt, report)
        checkpoint = last_checkpoint(self.run, self.spec, self.hooks)
        decision = judge(Happened(outcome, checkpoint.step if checkpoint else None), state.budget, self.spec.restart)
        action = decision.act.decision()
        until = self.hooks.clock() + self.spec.restart.blame_hours * 3600
        blame = tuple(b.to_journal(until) for b in outcome.blame)
        times = SlurmTimes(report.submit_time, report.start_time, report.end_time) if report else None
        decided = Decided(at=self.run.now(), attempt=attempt.number, job_id=attempt.job_id,
                          state=report.state if report else "LOST",
                          exit_code=report.exit_code if report else None, outcome=outcome.kind,
                          message=decision.message, blame=blame,
                          checkpoint_step=checkpoint.step if checkpoint else None,
                          checkpoint=checkpoint.path if checkpoint else None, action=action,
                          delay=decision.delay, times=times)
        self.run.record(decided)
        self.outputs.decided(decided, outcome)
        if action == DecisionAction.DONE:
            self.outputs.end(EventKind.DONE, decision.message)
        elif action == DecisionAction.STOP:
            self.outputs.end(EventKind.STOPPED, decision.message)

    def _finish(self, ended: RunEnded) -> int:
        self.hooks.say(f"run {ended.kind}: {ended.message}")
        return {EventKind.DONE: EXIT_DONE, EventKind.STOPPED: EXIT_STOPPED}.get(ended.kind, EXIT_CANCELLED)
