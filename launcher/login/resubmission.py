"""The supervisor's submissions: the next attempt (from the last complete checkpoint, without the nodes
still blamed, never while an earlier copy is alive, waiting while too few nodes are usable), and the
reconciling of a `submitting` whose `submitted` a restart lost (found in Slurm by the attempt's comment).

Each sbatch is journaled (`submitting`, with its unique comment) before it is made, so a supervisor
killed in between finds the job again instead of submitting a second copy.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from clusterctl.errors import SlurmCommandError
from clusterctl.launcher.login.shared_reads import SharedReads
from clusterctl.launcher.login.submit import gather_facts, prepare, submit_attempt
from clusterctl.launcher.login.supervisor_doors import Hooks
from clusterctl.launcher.login.supervisor_outputs import SupervisorOutputs
from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.pure.classify import node_down, not_responding
from clusterctl.launcher.pure.render import SlurmFacts
from clusterctl.launcher.pure.restart_policy import AttemptState, RunState
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.checkpoints import resume_point
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.records.run_journal import EventKind, Submitted, Submitting, SubmitLost, Waiting
from clusterctl.slurm import hostlist
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.jobs import JobReport
from clusterctl.slurm.nodes import NodeState, parse_sinfo_json

WAITING_MAX_SECONDS = 300.0
"""The longest wait between two reads of the node table while a run waits for usable nodes."""


def waiting_interval(previous: float, first: float) -> float:
    """The next wait for usable nodes while nothing changed: doubled from `first` up to
    WAITING_MAX_SECONDS.  Each wait ends in one read of the whole node table (tens of ms of
    controller time at 12,500 nodes), so a run that waits an hour makes ~15 of them, not ~450."""
    return min(WAITING_MAX_SECONDS, max(first, 2 * previous))


def last_checkpoint(run: RunDir, spec: JobSpec, hooks: Hooks) -> Checkpoint | None:
    """The run's last complete checkpoint: where the next attempt resumes, and what the judge is told."""
    return resume_point(spec.checkpoint_dir(str(run.path)), spec.checkpoint.recognised_by, hooks.say)


class Resubmission:
    """Submits the run's next attempt, or finds the one a restart lost.

    `facts`: what `submit` already asked Slurm (version, topology); None: asked before the first sbatch.
    `uid`: the user whose jobs are this run's.
    """

    def __init__(self, run: RunDir, spec: JobSpec, slurm: Slurm, reads: SharedReads, hooks: Hooks,
                 outputs: SupervisorOutputs, *, python: str, uid: int, facts: SlurmFacts | None) -> None:
        self.run, self.spec, self.slurm, self.reads, self.hooks = run, spec, slurm, reads, hooks
        self.outputs, self.python, self.uid, self.facts = outputs, python, uid, facts
        self._last_wait_message = ""
        self._wait_interval = 0.0

    def _usable_nodes(self, nodes: dict[str, NodeState], excluded: list[str]) -> list[str]:
        partition = self.spec.job.partition
        permanent = set(hostlist.expand(self.spec.job.exclude)) if self.spec.job.exclude else set()
        return [n.name for n in nodes.values()
                if (partition is None or partition in n.partitions) and not n.draining and not node_down(n)
                and not not_responding(n)
                and n.name not in excluded and n.name not in permanent]

    def _ours(self, job: JobReport) -> bool:
        # Anyone can submit a job with our comment (squeue shows it to all): only our own user's jobs count.
        return job.user_id is None or job.user_id == self.uid

    def _live_copies(self) -> list[JobReport]:
        prefix = f"clusterctl:{self.run.path.name}:"
        return [j for j in self.slurm.queue().values()
                if j.comment.startswith(prefix) and not j.terminal and self._ours(j)]

    def submit_next(self, state: RunState, number: int) -> bool:
        """Submit attempt `number`; False when it was not (waiting for nodes or a live copy, or the run stopped)."""
        now = self.hooks.clock()
        excluded = state.excluded(now)
        needed = self.spec.job.nodes  # spares are wanted, not needed: fewer when fewer nodes are usable
        usable = self._usable_nodes({n.name: n for n in parse_sinfo_json(self.reads.nodes_json())}, excluded)
        if len(usable) < needed:
            message = (f"only {len(usable)} usable nodes ({hostlist.compress(usable) if usable else 'none'}) "
                       f"for {needed}; excluded: {', '.join(excluded) or 'none'}")
            if self.spec.restart.on_too_few_nodes == "stop":
                self.outputs.end(EventKind.STOPPED, f"{message}; restart.on_too_few_nodes = stop")
            else:
                first = max(self.spec.restart.poll_max_seconds, self.spec.restart.poll_seconds, 5.0)
                if message != self._last_wait_message:
                    self.run.record(Waiting(at=self.run.now(), message=message))
                    self.hooks.say(f"waiting: {message}")
                    self._last_wait_message = message
                    self._wait_interval = first
                else:
                    self._wait_interval = waiting_interval(self._wait_interval, first)
                self.hooks.sleep(self._wait_interval)
            return False
        live = self._live_copies()
        if live:  # never two live copies: an earlier attempt is still in Slurm's hands
            self.hooks.say(f"waiting for job {live[0].job_id} ({live[0].state}) to end before resubmitting")
            self.hooks.sleep(self.spec.restart.poll_seconds)
            return False
        if self.facts is None:
            self.facts, warnings = gather_facts(self.slurm, self.spec)
            for warning in warnings:
                self.hooks.say(f"warning: {warning}")
        checkpoint = last_checkpoint(self.run, self.spec, self.hooks)
        resume_from = checkpoint.path if checkpoint else None
        exclude = hostlist.compress(excluded) if excluded else None
        comment = f"clusterctl:{self.run.path.name}:{number}:{secrets.token_hex(4)}"
        self.run.record(Submitting(at=self.run.now(), attempt=number, comment=comment))
        spec = self.spec
        spares = min(spec.job.spare_nodes, len(usable) - needed)
        if spares < spec.job.spare_nodes:
            self.hooks.say(f"attempt {number}: {len(usable)} usable nodes: asking for {spares} of "
                           f"{spec.job.spare_nodes} spare nodes")
            spec = replace(spec, job=replace(spec.job, spare_nodes=spares))
        request = prepare(spec, self.facts, run_dir=str(self.run.path), python=self.python, attempt=number,
                          resume_from=resume_from, exclude=exclude, no_requeue=True, comment=comment)
        try:
            job_id = submit_attempt(self.run, spec, request, self.slurm, number, exclude, self.hooks.git)
        except SlurmCommandError as exc:
            if exc.returncode is None or "Unable to contact" in exc.stderr or "Socket timed out" in exc.stderr:
                raise  # the controller is away: retried by the loop, reconciled by comment
            self.outputs.end(EventKind.STOPPED, f"Slurm refused attempt {number}: {exc.stderr.strip() or exc}")
            return False
        where = f" from {resume_from} (step {checkpoint.step})" if checkpoint else " from the start"
        self.hooks.say(f"attempt {number}: submitted job {job_id}{where}"
                       + (f", excluding {exclude}" if exclude else ""))
        return True

    def reconcile(self, attempt: AttemptState) -> None:
        """A `submitting` with no `submitted`: did sbatch get through before we died?"""
        for job in self.slurm.queue().values():
            if job.comment == attempt.comment and self._ours(job):
                self.run.record(Submitted(at=self.run.now(), attempt=attempt.number, job_id=job.job_id,
                                          reconciled=True))
                self.hooks.say(f"attempt {attempt.number}: found job {job.job_id} submitted before a restart")
                return
        # Not in Slurm: forget it; the loop submits this attempt number again.
        self.run.record(SubmitLost(at=self.run.now(), attempt=attempt.number, comment=attempt.comment))
        self.hooks.say(f"attempt {attempt.number}: sbatch did not get through before a restart; submitting again")
