"""The supervisor: watch a run's attempt, and when a node kills it, resubmit from the last
complete checkpoint with that node excluded; stop when the failure is the program's own.

Everything it decides is appended to the run's journal before it acts, and everything it
knows is replayed from that journal, so a supervisor killed at any point and started again
(`clusterctl supervise RUN`) carries on without a duplicate job or a repeated decision.
Slurm, the clock, sleeping and notifications are passed in.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clusterctl.errors import HostlistError, SlurmCommandError
from clusterctl.files import check_owned
from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.shared.checkpoints import resume_point
from clusterctl.launcher.pure.classify import (
    NODE_FAILURE, PROGRAM_FAILURE, Blame, Outcome, classify, hardware_suspects, node_down, node_read_interval,
    not_responding,
)
from clusterctl.launcher.pure.render import SlurmFacts
from clusterctl.launcher.pure.recovery import Happened, judge
from clusterctl.launcher.pure.restart_policy import AttemptState, RunState, replay
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.launcher.login.shared_reads import SharedReads
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.straggler_actions import (
    GpuEvidenceReader, StragglerActions, StragglerDoors, StragglerDrain,
)
from clusterctl.launcher.pure.straggler_watch import StragglerWatch
from clusterctl.launcher.login.code_version import GitDoor, run_git
from clusterctl.launcher.login.submit import gather_facts, prepare, submit_attempt
from clusterctl.records.job_health import JobHealthRecord, read_job_health
from clusterctl.records.rank_map import read_rank_map
from clusterctl.records.agent_summary import read_agent_summary
from clusterctl.records.rank_progress import read_progress
from clusterctl.records.agent_lease import current_lease, read_standby
from clusterctl.records.run_journal import (
    AgentEnded, Decided, DecisionAction, Ending, EventKind, RunEnded, RunJournal, SlurmTimes, StragglerFound, Submitted, Submitting,
    SubmitLost, Waiting, read_run_journal,
)
from clusterctl.records.versioned import RecordError
from clusterctl.slurm import hostlist
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.jobs import LINE_SOURCE, JobReport
from clusterctl.slurm.names import is_node_name
from clusterctl.slurm.nodes import NodeState, SlurmNode, parse_sinfo_json
from clusterctl.slurm.version import SlurmVersionError

EXIT_DONE, EXIT_STOPPED, EXIT_CANCELLED = 0, 1, 2
JOB_ID_REUSE_SLACK = 60.0  # a report submitted this long before our sbatch is another job with a reused id
MISSING_POLLS = 15  # polls a submitted job may be absent from squeue and sacct before it counts as lost
LOG_TAIL_BYTES = 64 * 1024
SINGLE_NODE_READS = 32  # a job on more nodes reads the (shared) node table once instead of each node alone
AGENT_GRACE_SECONDS = 60.0
PROGRESS_PROBLEMS_SAID = 5  # unreadable rank-progress files named one by one per job; past that only counted
"""With spares, how long a failed node may stay in a running job before the supervisor (not the job's agent) ends it."""
CHANGING_STATES = frozenset({"CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT"})
"""Job states on the way in or out: watched at the fast interval."""


def next_poll_interval(previous: float, changed: bool, fastest: float, slowest: float) -> float:
    """The wait before the next look at a job: `fastest` after anything changed (an attempt starting
    or ending), else twice the last wait, up to `slowest` (a job pending or running steadily)."""
    slowest = max(fastest, slowest)
    return fastest if changed else min(slowest, max(fastest, previous * 2))


WAITING_MAX_SECONDS = 300.0
"""The longest wait between two reads of the node table while a run waits for usable nodes."""


def waiting_interval(previous: float, first: float) -> float:
    """The next wait for usable nodes while nothing changed: doubled from `first` up to
    WAITING_MAX_SECONDS.  Each wait ends in one read of the whole node table (tens of ms of
    controller time at 12,500 nodes), so a run that waits an hour makes ~15 of them, not ~450."""
    return min(WAITING_MAX_SECONDS, max(first, 2 * previous))


def job_nodes(report: JobReport) -> list[str]:
    """The job's nodes as Slurm names them; a name that could not go into an argv (`--exclude=`) is no
    node to blame."""
    return [name for name in (hostlist.expand(report.nodes) if report.nodes else []) if is_node_name(name)]


@dataclass(frozen=True)
class WatchSnapshot:
    """What the supervisor shows of the attempt it watches, each poll (`Hooks.show`)."""

    attempt: int
    job_id: str | None
    state: str
    """Slurm's state of the job, "?" while Slurm does not report it."""
    nodes: str
    blamed: tuple[tuple[str, str], ...]
    """(node, reason) of each node still blamed."""
    checkpoint_step: int | None

    def line(self) -> str:
        """The live line a terminal shows (plain text: the views never read it as markup)."""
        blamed = "; ".join(f"{n}: {r}" for n, r in self.blamed) or "none"
        return (f"attempt {self.attempt} job {self.job_id} {self.state} on {self.nodes or '-'} | "
                f"checkpoint step {self.checkpoint_step} | blamed: {blamed}")


@dataclass
class Hooks:
    """The supervisor's side effects, swappable in tests."""

    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    say: Callable[[str], None] = print
    notify: Callable[[str, dict[str, Any]], None] = lambda event, payload: None
    show: Callable[[WatchSnapshot], None] = lambda snapshot: None
    gpu_evidence: GpuEvidenceReader | None = None
    """What a slow node's GPUs say, asked as a step of the job (None: not asked)."""
    drain: StragglerDrain | None = None
    """The drain door for straggler verdicts (None: never drain; SlurmCommandError when Slurm refuses)."""
    git: GitDoor = run_git
    """Asks git the code version of the launch workdir, for each attempt's experiment record."""


@dataclass
class Supervisor:
    """Supervise one run until it is done, stopped or cancelled.

    `facts`: what `submit` already asked Slurm (version, topology); None makes the supervisor
    ask before its first submission.  `records_dir`: where the epilog writes its per-job
    health records (None: no such evidence).
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
        self._unreadable_records: set[Path] = set()
        self._damaged_lines_said: set[int] = set()
        self._missing = 0
        self._slurm_errors = 0
        self._last_wait_message = ""
        self._wait_interval = 0.0
        self._silent_since: dict[str, float] = {}
        self._suspect_since: dict[str, float] = {}
        self._batch_host_gone_since: float | None = None
        self._agent_endings_said: set[str] = set()
        self._interval = self.spec.restart.poll_seconds
        self._last_seen: tuple[object, ...] | None = None
        # Watching reads go through a cache shared with the other supervisors of this runs
        # directory; checks before an sbatch (live copies, reconciling) ask Slurm directly.
        self.reads = SharedReads(self.slurm, self.run.path.parent, self.spec.restart.poll_seconds, self.hooks.clock)
        # The running attempt's straggler watch (jobs without an in-allocation agent): job id, watch,
        # what it acts with, when to read the ranks' progress next.
        self._stragglers: tuple[str, StragglerWatch, StragglerActions] | None = None
        self._stragglers_said: set[tuple[str, str]] = set()  # (job, node) the live output named already
        self._progress_problems_said: set[tuple[str, str]] = set()  # (job, problem) said already
        self._next_progress_read = 0.0

    # ---- the loop ---------------------------------------------------------------
    def supervise(self) -> int:
        """Run until the run ends; the exit code (0 done, 1 stopped, 2 cancelled)."""
        self.run.check_owned()  # it acts on what the run's files say: only its owner's files count
        lock = self.run.lock()
        try:
            while True:
                journal = self.run.journal()
                self._warn_damaged(journal)
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

    def _warn_damaged(self, journal: RunJournal) -> None:
        """Say each damaged journal line once (the replay skips it: what it held is not acted on)."""
        for damage in journal.damaged:
            if damage.line not in self._damaged_lines_said:
                self._damaged_lines_said.add(damage.line)
                self.hooks.say(f"warning: {self.run.journal_path}: {damage.warning}")

    def _step(self, state: RunState) -> None:
        current = state.current
        if current is None or (current.decided is not None and current.decided.action == DecisionAction.RESUBMIT):
            wait = state.next_submit_at - self.hooks.clock()
            if wait > 0:
                self.hooks.sleep(wait)
            self._submit_next(state, 1 if current is None else current.number + 1)
        elif current.decided is not None:  # decided done/stop but the end event is missing (crash between)
            self._end(EventKind.DONE if current.decided.action == DecisionAction.DONE else EventKind.STOPPED,
                      current.decided.message)
        elif current.job_id is None:
            self._reconcile(current)
        else:
            self._watch(current, state)

    # ---- submitting ---------------------------------------------------------------
    def _nodes(self) -> dict[str, NodeState]:
        return {n.name: n for n in parse_sinfo_json(self.reads.nodes_json())}

    def _job_node_states(self, names: list[str]) -> dict[str, NodeState]:
        """Only the job's own nodes: one single-node query each (a fraction of a millisecond of
        controller time, whatever the cluster's size), or the shared node table for a large job."""
        if len(names) > SINGLE_NODE_READS:
            wanted = set(names)
            return {name: n for name, n in self._nodes().items() if name in wanted}
        release = self.slurm.release()
        states = {}
        for name in names:
            try:
                states[name] = SlurmNode(name, self.slurm.runner, self.slurm.timeout, release=release).state()
            except SlurmVersionError:
                raise
            except SlurmCommandError as exc:
                if exc.returncode != 0:
                    raise
                # sinfo answered but does not list the node (gone from slurm.conf): nothing to hold against it
        return states

    def _poll_wait(self, seen: tuple[object, ...], changing: bool) -> float:
        """The adaptive interval: fast while the attempt starts or ends, slow while it pends or runs."""
        changed = changing or seen != self._last_seen
        self._last_seen = seen
        self._interval = next_poll_interval(self._interval, changed, self.spec.restart.poll_seconds,
                                            self.spec.restart.poll_max_seconds)
        return self._interval

    def _checkpoint(self) -> Checkpoint | None:
        return resume_point(self.spec.checkpoint_dir(str(self.run.path)), self.spec.checkpoint.recognised_by,
                            self.hooks.say)

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

    def _submit_next(self, state: RunState, number: int) -> None:
        now = self.hooks.clock()
        excluded = state.excluded(now)
        needed = self.spec.job.nodes  # spares are wanted, not needed: fewer when fewer nodes are usable
        usable = self._usable_nodes(self._nodes(), excluded)
        if len(usable) < needed:
            message = (f"only {len(usable)} usable nodes ({hostlist.compress(usable) if usable else 'none'}) "
                       f"for {needed}; excluded: {', '.join(excluded) or 'none'}")
            if self.spec.restart.on_too_few_nodes == "stop":
                self._end(EventKind.STOPPED, f"{message}; restart.on_too_few_nodes = stop")
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
            return
        live = self._live_copies()
        if live:  # never two live copies: an earlier attempt is still in Slurm's hands
            self.hooks.say(f"waiting for job {live[0].job_id} ({live[0].state}) to end before resubmitting")
            self.hooks.sleep(self.spec.restart.poll_seconds)
            return
        if self.facts is None:
            self.facts, warnings = gather_facts(self.slurm, self.spec)
            for warning in warnings:
                self.hooks.say(f"warning: {warning}")
        checkpoint = self._checkpoint()
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
            self._end(EventKind.STOPPED, f"Slurm refused attempt {number}: {exc.stderr.strip() or exc}")
            return
        self._missing = 0
        where = f" from {resume_from} (step {checkpoint.step})" if checkpoint else " from the start"
        self.hooks.say(f"attempt {number}: submitted job {job_id}{where}"
                       + (f", excluding {exclude}" if exclude else ""))

    def _reconcile(self, attempt: AttemptState) -> None:
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

    # ---- watching -----------------------------------------------------------------
    def _report(self, attempt: AttemptState) -> JobReport | None:
        assert attempt.job_id is not None
        report = self.slurm.job(attempt.job_id)
        # The one-job line gives local times: an hour's slack keeps a daylight-saving fold from making
        # our own job look like an older one with a reused id.
        slack = JOB_ID_REUSE_SLACK + (3600 if report is not None and report.source == LINE_SOURCE else 0)
        if report is not None and report.submit_time and report.submit_time < attempt.submitted_at - slack:
            report = None  # the controller's job with this id is an older one (ids restart on a fresh cluster)
        if report is None:
            found = self.slurm.accounting([attempt.job_id]).get(attempt.job_id)
            if found is not None and (not found.submit_time
                                      or found.submit_time >= attempt.submitted_at - JOB_ID_REUSE_SLACK):
                report = found
        if report is not None and report.terminal and report.source == LINE_SOURCE and report.exit_code is None:
            report = self.slurm.job_exit(report)  # once per attempt: the one-job query has no exit code
        return report

    def _watch(self, attempt: AttemptState, state: RunState) -> None:
        report = self._report(attempt)
        if self.spec.runs_agent:
            self._say_what_the_agent_found(attempt)
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
        elif report.state == "RUNNING" and not attempt.ended_by_us and self._agent_watching(attempt):
            # The job's agent hears every node of it and writes what it saw once per interval: while
            # that summary is fresh, the supervisor asks Slurm about no node (only whether the batch
            # host, where the agent runs, is still in the job: the one-job query says so).
            suspects = self._agent_gone(attempt, report, {})
            if suspects:
                self._end_attempt(attempt, suspects)
        elif report.state == "RUNNING" and not attempt.ended_by_us:
            nodes = self._job_node_states(job_nodes(report))
            now = self.hooks.clock()
            for name, node in nodes.items():  # how long each node has been silent, as we saw it
                if not_responding(node):
                    self._silent_since.setdefault(name, now)
                else:
                    self._silent_since.pop(name, None)
            silent_for = {name: now - since for name, since in self._silent_since.items()}
            suspects = hardware_suspects(job_nodes(report), nodes, silent_for,
                                         self.spec.restart.unresponsive_seconds)
            if self.spec.recovers_in_allocation:
                suspects = self._left_to_the_agent(suspects, now) + self._agent_gone(attempt, report, nodes)
            if suspects:
                self._end_attempt(attempt, suspects)
            elif not self.spec.runs_agent and self.spec.stragglers.action != "off":
                self._watch_stragglers(attempt, len(nodes))
        self._show(attempt, state, report)
        seen = (attempt.job_id, report.state if report else None, report.nodes if report else None)
        changing = report is None or bool(attempt.ended_by_us) or (report.state in CHANGING_STATES)
        self.hooks.sleep(self._poll_wait(seen, changing))

    def _watch_stragglers(self, attempt: AttemptState, nodes: int) -> None:
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

    def _say_what_the_agent_found(self, attempt: AttemptState) -> None:
        """Say the stragglers the job's agent journaled since the last poll, as if found here."""
        for event in self.run.events():
            if isinstance(event, StragglerFound) and event.job_id == attempt.job_id and \
                    (event.job_id, event.node) not in self._stragglers_said:
                self._stragglers_said.add((event.job_id, event.node))
                hardware = "; ".join(event.hardware) or "nothing explains it"
                self.hooks.say(f"straggler {event.node} (found by the job's agent): {event.ratio:.2f}x the job's "
                               f"compute time; GPUs: {hardware}; {event.action}"
                               + (f"; {event.drain}" if event.drain else ""))

    def _agent_watching(self, attempt: AttemptState) -> bool:
        """The job's in-allocation agent wrote its summary for this job recently (its reports and its
        own Slurm queries then cover every node); False without an agent, before its first summary,
        or once the summary is stale (the agent is gone or stuck: the supervisor looks itself)."""
        if not self.spec.runs_agent or attempt.job_id is None:
            return False
        try:
            summary = read_agent_summary(self.run.path / "jobs" / attempt.job_id)
        except (OSError, RecordError):
            return False
        return summary is not None and summary.job_id == attempt.job_id and not summary.stale(self.hooks.clock())

    def _agent_gone(self, attempt: AttemptState, report: JobReport, nodes: dict[str, NodeState]) -> list[Blame]:
        """The job's batch host (where its agent runs: the allocation's first node) is no longer in the
        running job.  With --no-kill Slurm takes a dead batch host out of the job and keeps the job
        RUNNING on the others, with nobody left to run steps: the attempt must be ended from here."""
        assert attempt.job_id is not None
        try:
            allocated = read_rank_map(self.run.path / "jobs" / attempt.job_id).nodelist
            batch_host = hostlist.expand(allocated)[0]
        except (OSError, RecordError, HostlistError, IndexError):
            return []  # no map yet: the agent has not started its first step
        if batch_host in job_nodes(report):
            self._batch_host_gone_since = None
            return []
        job_dir = self.run.path / "jobs" / attempt.job_id
        try:
            lease, standby = current_lease(job_dir), read_standby(job_dir)
        except (OSError, RecordError) as exc:
            self.hooks.say(f"cannot read job {attempt.job_id}'s agent lease ({exc}); judging without it")
            lease = standby = None
        if lease is not None and lease.node != batch_host:
            return []  # the job's standby took it over: its agent runs elsewhere now
        now = self.hooks.clock()
        if self._batch_host_gone_since is None:
            self._batch_host_gone_since = now
        if standby is not None and now - self._batch_host_gone_since < AGENT_GRACE_SECONDS:
            return []  # the standby takes over once Slurm says the batch host is gone: leave it the time
        state = nodes.get(batch_host)
        seen = f"Slurm: {batch_host} is {state.state} {list(state.flags)}" if state else f"{batch_host} left the job"
        return [Blame(batch_host, "the batch host left the job: its agent is gone",
                      (f"job {attempt.job_id} still runs on {report.nodes} without its batch host {batch_host}", seen))]

    def _left_to_the_agent(self, suspects: list[Blame], now: float) -> list[Blame]:
        """With spares, the job's own agent ends the step and gives a failed node back to Slurm (the
        node then leaves the job's node list); only a node it has not dealt with within
        AGENT_GRACE_SECONDS (the agent is gone or stuck) makes the supervisor end the attempt."""
        seen = {b.node for b in suspects}
        self._suspect_since = {n: t for n, t in self._suspect_since.items() if n in seen}
        for b in suspects:
            self._suspect_since.setdefault(b.node, now)
        return [b for b in suspects if now - self._suspect_since[b.node] >= AGENT_GRACE_SECONDS]

    def _end_attempt(self, attempt: AttemptState, suspects: list[Blame]) -> None:
        """Don't wait for ranks hung in a collective behind a dead node: end the attempt now."""
        assert attempt.job_id is not None
        self.run.record(Ending(at=self.run.now(), attempt=attempt.number, job_id=attempt.job_id,
                               blame=tuple(b.to_journal() for b in suspects)))
        self.hooks.say(f"attempt {attempt.number}: ending job {attempt.job_id} now: "
                       + "; ".join(f"{b.node}: {b.reason}" for b in suspects))
        self.slurm.cancel([attempt.job_id])

    def _evidence(self, attempt: AttemptState, report: JobReport) -> Outcome:
        if report.state == "CANCELLED" and (ended := self._agent_ended(report.job_id)) is not None:
            blame = tuple(Blame.from_journal(b) for b in ended.blame)
            message = f"the job's agent on {ended.agent}, which took it over from its dead batch host, ended it: " \
                      f"{ended.message or ended.outcome}"
            if report.job_id not in self._agent_endings_said:
                self._agent_endings_said.add(report.job_id)
                self.hooks.say(f"job {report.job_id}: {message}")
            return Outcome(ended.outcome, message, blame)
        nodes = self._job_node_states(job_nodes(report))
        records = self._epilog_records(report.job_id, attempt.submitted_at)
        log = self._log_tail(report.job_id)
        ended_by_us = [Blame.from_journal(b) for b in attempt.ended_by_us]
        return classify(report, job_nodes(report), nodes, records, log, ended_by_us, self.spec.restart.exit_actions)

    def _agent_ended(self, job_id: str) -> AgentEnded | None:
        """How the agent that took job `job_id` over ended it (it cancels the job: its batch script is
        gone), None when no agent did."""
        try:
            events = read_run_journal(self.run.path / "journal.jsonl").events
        except (OSError, RecordError):
            return None
        return next((e for e in reversed(events) if isinstance(e, AgentEnded) and e.job_id == job_id), None)

    def _decide(self, attempt: AttemptState, state: RunState, report: JobReport | None,
                outcome: Outcome | None) -> None:
        if outcome is None:
            assert report is not None
            outcome = self._evidence(attempt, report)
            # healthd drains and the epilog writes its record while Slurm already shows the job
            # ended: give the evidence a moment before calling a failure the program's own.
            deadline = self.hooks.clock() + self.evidence_grace
            while outcome.kind == PROGRAM_FAILURE and self.hooks.clock() < deadline:
                self.hooks.sleep(0.5)
                outcome = self._evidence(attempt, report)
        checkpoint = self._checkpoint()
        decision = judge(Happened(outcome, checkpoint.step if checkpoint else None), state.budget, self.spec.restart)
        action = decision.act.decision()
        until = self.hooks.clock() + self.spec.restart.blame_hours * 3600
        blame = tuple(b.to_journal(until) for b in outcome.blame)
        times = SlurmTimes(report.submit_time, report.start_time, report.end_time) if report else None
        self.run.record(Decided(at=self.run.now(), attempt=attempt.number, job_id=attempt.job_id,
                                state=report.state if report else "LOST",
                                exit_code=report.exit_code if report else None, outcome=outcome.kind,
                                message=decision.message, blame=blame,
                                checkpoint_step=checkpoint.step if checkpoint else None,
                                checkpoint=checkpoint.path if checkpoint else None, action=action,
                                delay=decision.delay, times=times))
        self.hooks.say(f"attempt {attempt.number} (job {attempt.job_id}) ended "
                       f"{report.state if report else 'LOST'}: {outcome.kind}: {decision.message}"
                       + (f"; next attempt in {decision.delay:.1f} s" if action == DecisionAction.RESUBMIT
                          else ""))
        for b in outcome.blame:
            self.hooks.say(f"  blamed {b.node} for {self.spec.restart.blame_hours:g} h: {b.reason}")
            for line in b.evidence:
                self.hooks.say(f"    {line}")
        if blame:
            self.hooks.notify("blame", {"run": str(self.run.path), "attempt": attempt.number,
                                        "blame": [b.to_json() for b in blame]})
        if action == DecisionAction.DONE:
            self._end(EventKind.DONE, decision.message)
        elif action == DecisionAction.STOP:
            self._end(EventKind.STOPPED, decision.message)

    def _end(self, kind: EventKind, message: str) -> None:
        self.run.record(RunEnded(kind=kind, at=self.run.now(), message=message))
        self.hooks.notify(kind.value, {"run": str(self.run.path), "message": message})

    def _finish(self, ended: RunEnded) -> int:
        self.hooks.say(f"run {ended.kind}: {ended.message}")
        return {EventKind.DONE: EXIT_DONE, EventKind.STOPPED: EXIT_STOPPED}.get(ended.kind, EXIT_CANCELLED)

    # ---- evidence on disk ------------------------------------------------------------
    def _epilog_records(self, job_id: str, since: float) -> dict[str, JobHealthRecord]:
        if self.records_dir is None:
            return {}
        records = {}
        job_dir = self.records_dir / job_id
        try:
            writer = os.stat(self.records_dir).st_uid  # the epilog writes as the records directory's owner
            # With the sticky bit users may make `<job>/` before the job ends: the epilog then writes
            # nothing there, and nothing found there is its record.
            problem = check_owned(job_dir, uid=writer, kind="directory", root_may_own=True)
        except OSError:
            return {}
        if problem is not None:
            if job_dir not in self._unreadable_records:
                self._unreadable_records.add(job_dir)
                self.hooks.say(f"note: skipping epilog records in a directory the epilog did not make: {job_dir}: "
                               f"{problem}; no evidence from it")
            return {}
        for path in sorted(job_dir.glob("*.json")):
            try:
                info = os.lstat(path)
                # Users can often write to the records directory: a record is evidence against a
                # node only when the epilog's identity (root, or the directory's owner) wrote it.
                problem = check_owned(info, uid=writer, kind="file", root_may_own=True)
                if problem is not None:
                    if path not in self._unreadable_records:
                        self._unreadable_records.add(path)
                        self.hooks.say(f"note: skipping an epilog record not written by the epilog: {path}: {problem}")
                    continue
                if info.st_mtime < since - JOB_ID_REUSE_SLACK:
                    continue  # a record of an older job with the same id
                record = read_job_health(path)
            except OSError:
                continue  # gone between the listing and the read: the epilog of an older job cleaned up
            except RecordError as exc:
                # Evidence we cannot read is no evidence: judge without it, and say so once.
                if path not in self._unreadable_records:
                    self._unreadable_records.add(path)
                    self.hooks.say(f"note: skipping an epilog record: {exc}")
                continue
            if record.job_id != job_id:
                # A record stands for the job it names: one of another job under this job's id is no evidence.
                if path not in self._unreadable_records:
                    self._unreadable_records.add(path)
                    self.hooks.say(f"note: skipping an epilog record of another job: {path} names job "
                                   f"{record.job_id!r}, not {job_id}; no evidence from it")
                continue
            records[record.node] = record
        return records

    def _log_tail(self, job_id: str) -> str:
        try:
            with open(self.run.log_path(job_id), "rb") as log:
                log.seek(0, 2)
                log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _show(self, attempt: AttemptState, state: RunState, report: JobReport | None) -> None:
        now = self.hooks.clock()
        self.hooks.show(WatchSnapshot(attempt.number, attempt.job_id, report.state if report else "?",
                                      report.nodes if report else "",
                                      tuple((n, r) for n, (u, r) in state.blamed.items() if u > now),
                                      state.budget.best_step))
