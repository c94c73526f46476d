"""What the supervisor knows of how an attempt ended: Slurm's report and its nodes' states, the epilog's
per-job health records, the tail of the job's log, and how an agent that took the job over ended it;
`classify` makes an `Outcome` of them, which the supervisor gives `recovery.judge`.

Evidence that cannot be trusted is no evidence: an epilog record not written by the epilog's
identity, of another job, or too old for this job is skipped (and said once).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from clusterctl.files import check_owned
from clusterctl.launcher.login.attempt_watch import JOB_ID_REUSE_SLACK, job_nodes
from clusterctl.launcher.login.supervisor_doors import Hooks
from clusterctl.launcher.pure.classify import PROGRAM_FAILURE, Blame, Outcome, classify
from clusterctl.launcher.pure.restart_policy import AttemptState
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.records.job_health import JobHealthRecord, read_job_health
from clusterctl.records.run_journal import AgentEnded, read_run_journal
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.jobs import JobReport
from clusterctl.slurm.nodes import NodeState

LOG_TAIL_BYTES = 64 * 1024


class AttemptEvidence:
    """Gathers the evidence of how an attempt's job ended, and classifies it.

    `node_states` asks Slurm about the job's own nodes; `records_dir` is where the epilog writes its
    per-job health records (None: no such evidence); `grace` is how long a failure that looks like the
    program's own waits for a drain or a record that may still come.
    """

    def __init__(self, run: RunDir, spec: JobSpec, records_dir: Path | None, hooks: Hooks, grace: float,
                 node_states: Callable[[list[str]], dict[str, NodeState]]) -> None:
        self.run, self.spec, self.records_dir, self.hooks, self.grace = run, spec, records_dir, hooks, grace
        self.node_states = node_states
        self._unreadable_records: set[Path] = set()
        self._agent_endings_said: set[str] = set()

    def outcome(self, attempt: AttemptState, report: JobReport) -> Outcome:
        """How the attempt's job ended, once the evidence settled."""
        outcome = self._evidence(attempt, report)
        # healthd drains and the epilog writes its record while Slurm already shows the job
        # ended: give the evidence a moment before calling a failure the program's own.
        deadline = self.hooks.clock() + self.grace
        while outcome.kind == PROGRAM_FAILURE and self.hooks.clock() < deadline:
            self.hooks.sleep(0.5)
            outcome = self._evidence(attempt, report)
        return outcome

    def _evidence(self, attempt: AttemptState, report: JobReport) -> Outcome:
        if report.state == "CANCELLED" and (ended := self._agent_ended(report.job_id)) is not None:
            blame = tuple(Blame.from_journal(b) for b in ended.blame)
            message = f"the job's agent on {ended.agent}, which took it over from its dead batch host, ended it: " \
                      f"{ended.message or ended.outcome}"
            if report.job_id not in self._agent_endings_said:
                self._agent_endings_said.add(report.job_id)
                self.hooks.say(f"job {report.job_id}: {message}")
            return Outcome(ended.outcome, message, blame)
        nodes = self.node_states(job_nodes(report))
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
