"""The supervisor's side of stragglers: its own straggler watch over a job without an in-allocation
agent (the ranks' progress files on shared storage, read at the agent's pace for that many nodes),
and, for a job with an agent, the saying of what that agent found.

What is done about a straggler is decided by `straggler_verdict` and done by
launcher/shared/straggler_actions.py, as for the agent; without an agent there is nothing to swap with.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from clusterctl.launcher.login.supervisor_doors import Hooks
from clusterctl.launcher.pure.classify import node_read_interval
from clusterctl.launcher.pure.restart_policy import AttemptState
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.pure.straggler_watch import StragglerWatch
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.launcher.shared.straggler_actions import StragglerActions, StragglerDoors
from clusterctl.records.rank_progress import read_progress
from clusterctl.records.run_journal import StragglerFound

PROGRESS_PROBLEMS_SAID = 5  # unreadable rank-progress files named one by one per job; past that only counted


class AttemptStragglers:
    """The stragglers of the supervised attempt: found here (no agent) or said as the agent found them."""

    def __init__(self, run: RunDir, spec: JobSpec, hooks: Hooks) -> None:
        self.run, self.spec, self.hooks = run, spec, hooks
        # The running attempt's straggler watch (jobs without an in-allocation agent): job id, watch,
        # what it acts with, when to read the ranks' progress next.
        self._stragglers: tuple[str, StragglerWatch, StragglerActions] | None = None
        self._stragglers_said: set[tuple[str, str]] = set()  # (job, node) the live output named already
        self._progress_problems_said: set[tuple[str, str]] = set()  # (job, problem) said already
        self._next_progress_read = 0.0

    def watch(self, attempt: AttemptState, nodes: int) -> None:
        """Read the running job's rank progress (at the agent's pace for that many nodes) and act on the
        stragglers found: report, or exclude from the next submission (a swap needs the agent)."""
        assert attempt.job_id is not None
        now = self.hooks.clock()
        if self._stragglers is None or self._stragglers[0] != attempt.job_id:
            job_dir = self.run.path / "jobs" / attempt.job_id
            doors = StragglerDoors(self.hooks.clock, self.hooks.say, self.hooks.gpu_evidence, self.hooks.drain)
            actions = StragglerActions(self.run.path, job_dir, attempt.job_id, self.spec.stragglers.action,
                                       self.spec.restart.blame_hours, doors)
            # A supervisor started again (`clusterctl supervise`) does not journal a node twice.
            actions.seen |= {e.node for e in self.run.events()
                             if isinstance(e, StragglerFound) and e.job_id == attempt.job_id}
            self._stragglers = (attempt.job_id, StragglerWatch.start(self.spec.stragglers, attempt.submitted_at),
                                actions)
            self._next_progress_read = now
        if now < self._next_progress_read:
            return
        self._next_progress_read = now + node_read_interval(nodes)
        job_id, watch, actions = self._stragglers
        records, problems = read_progress(actions.job_dir, now)
        self._say_progress_problems(job_id, problems)
        watch = watch.observe(records)
        self._stragglers = (job_id, watch, actions)
        actions.write_table(watch)
        for found in watch.found:
            # srun attaches to the job by SLURM_JOB_ID; another allocation's SLURM_* (a supervisor
            # started inside salloc) would mislead it.
            env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
            actions.act(found, {**env, "SLURM_JOB_ID": job_id}, room=None)  # no agent: nothing to swap with

    def _say_progress_problems(self, job_id: str, problems: Sequence[str]) -> None:
        """Say each rank-progress file the straggler watch could not read, once per job, and what that
        may cost; past PROGRESS_PROBLEMS_SAID distinct ones only how many more (a forged or damaged
        directory must not flood the live output)."""
        unsaid = [p for p in problems if (job_id, p) not in self._progress_problems_said]
        if not unsaid:
            return
        said = sum(1 for job, _ in self._progress_problems_said if job == job_id)
        room = max(0, PROGRESS_PROBLEMS_SAID - said)
        self._progress_problems_said.update((job_id, p) for p in unsaid)
        for problem in unsaid[:room]:
            self.hooks.say(f"warning: job {job_id}: rank progress not read: {problem}; that rank is left out of "
                           f"the straggler watch (a slow node may be found later, or not at all)")
        if len(unsaid) > room:
            self.hooks.say(f"warning: job {job_id}: {len(unsaid) - room} more rank progress file(s) not read; "
                           f"those ranks are left out of the straggler watch")

    def say_what_the_agent_found(self, attempt: AttemptState) -> None:
        """Say the stragglers the job's agent journaled since the last poll, as if found here."""
        for event in self.run.events():
            if isinstance(event, StragglerFound) and event.job_id == attempt.job_id and \
                    (event.job_id, event.node) not in self._stragglers_said:
                self._stragglers_said.add((event.job_id, event.node))
                hardware = "; ".join(event.hardware) or "nothing explains it"
                self.hooks.say(f"straggler {event.node} (found by the job's agent): {event.ratio:.2f}x the job's "
                               f"compute time; GPUs: {hardware}; {event.action}"
                               + (f"; {event.drain}" if event.drain else ""))
