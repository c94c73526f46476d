"""The supervisor's watch over its attempt in Slurm: the job's report, its nodes' states, and the nodes
that should end a running attempt now.

Each poll asks the one-job query (then accounting for a job gone from the queue); while the job's
agent writes a fresh summary it asks about no node, only whether the batch host is still in the job;
otherwise it asks about the job's own nodes (one single-node query each, or the shared node table for a
large job) and blames a node drained by healthd, DOWN, or silent past `restart.unresponsive_seconds`.
How the attempt ended is judged elsewhere (launcher/login/attempt_evidence.py, then `recovery.judge`).
"""

from __future__ import annotations

from clusterctl.errors import HostlistError, SlurmCommandError
from clusterctl.launcher.login.shared_reads import SharedReads
from clusterctl.launcher.login.supervisor_doors import Hooks
from clusterctl.launcher.pure.classify import NOT_RESPONDING_REASON, Blame, hardware_suspects, not_responding
from clusterctl.launcher.pure.restart_policy import AttemptState
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.records.agent_lease import current_lease, read_standby
from clusterctl.records.agent_summary import read_agent_summary
from clusterctl.records.rank_map import read_rank_map
from clusterctl.records.run_journal import Ending
from clusterctl.records.versioned import RecordError
from clusterctl.slurm import hostlist
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.jobs import LINE_SOURCE, JobReport
from clusterctl.slurm.names import is_node_name
from clusterctl.slurm.nodes import NodeState, SlurmNode, parse_sinfo_json
from clusterctl.slurm.version import SlurmVersionError

JOB_ID_REUSE_SLACK = 60.0  # a report submitted this long before our sbatch is another job with a reused id
SINGLE_NODE_READS = 32  # a job on more nodes reads the (shared) node table once instead of each node alone
AGENT_GRACE_SECONDS = 60.0
"""With spares, how long a failed node may stay in a running job before the supervisor (not the job's agent) ends it."""
CHANGING_STATES = frozenset({"CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT"})
"""Job states on the way in or out: watched at the fast interval."""


def next_poll_interval(previous: float, changed: bool, fastest: float, slowest: float) -> float:
    """The wait before the next look at a job: `fastest` after anything changed (an attempt starting
    or ending), else twice the last wait, up to `slowest` (a job pending or running steadily)."""
    slowest = max(fastest, slowest)
    return fastest if changed else min(slowest, max(fastest, previous * 2))


def job_nodes(report: JobReport) -> list[str]:
    """The job's nodes as Slurm names them; a name that could not go into an argv (`--exclude=`) is no
    node to blame."""
    return [name for name in (hostlist.expand(report.nodes) if report.nodes else []) if is_node_name(name)]


class AttemptWatch:
    """What Slurm says of the supervised attempt, each poll, and when a node should end it."""

    def __init__(self, run: RunDir, spec: JobSpec, slurm: Slurm, reads: SharedReads, hooks: Hooks) -> None:
        self.run, self.spec, self.slurm, self.reads, self.hooks = run, spec, slurm, reads, hooks
        self._silent_since: dict[str, float] = {}
        self._suspect_since: dict[str, float] = {}
        self._batch_host_gone_since: float | None = None
        self._interval = spec.restart.poll_seconds
        self._last_seen: tuple[object, ...] | None = None

    def report(self, attempt: AttemptState) -> JobReport | None:
        """Slurm's report of the attempt's job; None while Slurm reports no job of this attempt."""
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

    def _nodes(self) -> dict[str, NodeState]:
        return {n.name: n for n in parse_sinfo_json(self.reads.nodes_json())}

    def job_node_states(self, names: list[str]) -> dict[str, NodeState]:
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

    def running(self, attempt: AttemptState, report: JobReport) -> tuple[list[Blame], int]:
        """The nodes that should end the running attempt now, and how many of its nodes Slurm was asked
        about (none while the job's agent watches them)."""
        if self._agent_watching(attempt):
            # The job's agent hears every node of it and writes what it saw once per interval: while
            # that summary is fresh, the supervisor asks Slurm about no node (only whether the batch
            # host, where the agent runs, is still in the job: the one-job query says so).
            return self._agent_gone(attempt, report, {}), 0
        nodes = self.job_node_states(job_nodes(report))
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
            suspects = self._left_to_the_agent(self._left_to_the_standby(attempt, suspects), now) \
                + self._agent_gone(attempt, report, nodes)
        return suspects, len(nodes)

    def _left_to_the_standby(self, attempt: AttemptState, suspects: list[Blame]) -> list[Blame]:
        """A batch host that is only not responding is left alone while the job has a standby agent: the
        standby takes the job over once Slurm takes that node out of the job (launcher/pure/takeover.py),
        inside the allocation; ending the attempt here instead (the two disagreeing) would send the job
        back to the queue, and Slurm would end it only after SlurmdTimeout all the same (measured under
        Slurm's default timeouts: resubmitted, the run finished at +459 s; shared/notes/production-timeouts.md)."""
        assert attempt.job_id is not None
        job_dir = self.run.path / "jobs" / attempt.job_id
        try:
            batch_host = hostlist.expand(read_rank_map(job_dir).nodelist)[0]
            lease, standby = current_lease(job_dir), read_standby(job_dir)
        except (OSError, RecordError, HostlistError, IndexError):
            return suspects
        if standby is None or (lease is not None and lease.node != batch_host):
            return suspects
        return [b for b in suspects if b.node != batch_host or not b.reason.startswith(NOT_RESPONDING_REASON)]

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

    def end_attempt(self, attempt: AttemptState, suspects: list[Blame]) -> None:
        """Don't wait for ranks hung in a collective behind a dead node: end the attempt now."""
        assert attempt.job_id is not None
        self.run.record(Ending(at=self.run.now(), attempt=attempt.number, job_id=attempt.job_id,
                               blame=tuple(b.to_journal() for b in suspects)))
        self.hooks.say(f"attempt {attempt.number}: ending job {attempt.job_id} now: "
                       + "; ".join(f"{b.node}: {b.reason}" for b in suspects))
        self.slurm.cancel([attempt.job_id])

    def pace(self, seen: tuple[object, ...], changing: bool) -> float:
        """The adaptive interval: fast while the attempt starts or ends, slow while it pends or runs."""
        changed = changing or seen != self._last_seen
        self._last_seen = seen
        self._interval = next_poll_interval(self._interval, changed, self.spec.restart.poll_seconds,
                                            self.spec.restart.poll_max_seconds)
        return self._interval
