"""`clusterctl status RUN --watch`: the run's status, redrawn as it changes, until the run ends.

One place builds what is shown (`gather_status` → `RunStatus`, as `status` does); this module decides
when to read again and what is new, and the views only render.  The loop (`watch_run`) takes its
reads, its clock and its view as Protocols, so a test drives it with a fake clock and fake files.

Cost per watcher per interval: one stat of the journal, the agent's summary and the step-time table, and
of what tells a new checkpoint (`checkpoints.markers`: the checkpoint directory, its candidates newer than
the newest complete one, Megatron's tracker; with tiers `tiers/` and the job's inventory); the journal's
new bytes only (read from the last offset); the status model rebuilt only when a stat changed, and in it
the checkpoints, the spec and the earlier jobs' step-time tables read again only when theirs changed
(`status_reads.Looks`); Slurm (squeue, and sacct for jobs the controller has forgotten) at most once per
`SLURM_EVERY_S`, never more often than `clusterctl status` itself asks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from clusterctl.launcher.login.status import (
    RunStatus, checkpoint_text, eta_text, goodput_text, resume_where, training_line,
)
from clusterctl.launcher.login.status_reads import Looks
from clusterctl.launcher.login.use_cases import JobQueries, gather_status
from clusterctl.launcher.pure.checkpoint_tiers import resumed_text
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.records.agent_summary import summary_path
from clusterctl.records.node_step_times import step_times_path
from clusterctl.records.run_journal import (
    END_KINDS, RecoveredInAllocation, Resumed, RunEnded, RunEvent, StragglerFound, Submitted, event_from_json,
)
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.jobs import TERMINAL_STATES, JobReport
from clusterctl.text import printable

INTERVAL_S = 2.0
"""Seconds between two looks (--interval), bounded by MIN_INTERVAL_S and MAX_INTERVAL_S."""
MIN_INTERVAL_S = 0.5
MAX_INTERVAL_S = 60.0
SLURM_EVERY_S = 30.0
"""Seconds between two questions to Slurm, whatever the interval."""
END_STATES = frozenset(str(kind) for kind in END_KINDS)
"""The run states that say its journal has its end (done, stopped, cancelled)."""
RECENT_EVENTS = 8
"""Journal events the live view keeps below the status (the plain and JSON views print each once)."""
WATCH_FAILED_EXIT = 1
"""The run ended otherwise than done (stopped, cancelled, its last job not COMPLETED)."""


class WatchReads(Protocol):
    """Where the watch loop's facts come from (the run's files and Slurm, or a test's fakes)."""

    def status(self, ask_slurm: bool) -> RunStatus | None:
        """The run's status when something changed since the last call (or `ask_slurm`), else None.
        RecordError when a record cannot be read."""

    def new_events(self) -> Sequence[RunEvent]:
        """The journal's events appended since the last call, oldest first."""


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class WatchView(Protocol):
    """Shows what the loop found; `at` is the clock's time of the look."""

    def status(self, at: float, status: RunStatus) -> None: ...

    def event(self, at: float, line: str) -> None: ...

    def problem(self, at: float, line: str) -> None: ...


def event_line(event: RunEvent) -> str | None:
    """One line for a journal event worth seeing as it happens (faults, recoveries, resumes, new
    attempts, the end); None for the rest."""
    if isinstance(event, RecoveredInAllocation):
        why = ", ".join(f"{b.node} ({b.reason})" for b in event.blame) or event.reason or "no node blamed"
        step = event.checkpoint_step if event.checkpoint_step is not None else "the start"
        return f"job {event.job_id}: restarted inside the allocation ({event.restart}): {why}; from step {step}"
    if isinstance(event, Resumed):
        return f"resumed ({resume_where(event)}): {resumed_text(event)}"
    if isinstance(event, StragglerFound):
        return (f"job {event.job_id}: straggler {event.node}: {event.ratio:.2f}x the job's compute time, "
                f"{event.lost_s:.1f} s lost; {event.action}")
    if isinstance(event, Submitted):
        return f"attempt {event.attempt}: submitted job {event.job_id}"
    if isinstance(event, RunEnded):
        return f"run {event.kind}" + (f": {event.message}" if event.message else "")
    return None


def slowest_node(status: RunStatus) -> str | None:
    """"slowest node n3 at 1.40x the job" from the step-time table; None without one."""
    table = status.step_times
    rated = [n for n in table.nodes if n.ratio is not None] if table is not None else []
    if not rated:
        return None
    slow = max(rated, key=lambda n: n.ratio or 0.0)
    return f"slowest node {slow.node} at {slow.ratio:.2f}x the job"


def status_line(status: RunStatus, now: float | None = None) -> str:
    """The status in one line (the plain view's): state, training figures, the slowest node, the newest
    checkpoint (its age counted to `now`; None: without its age), the goodput so far, the ETA."""
    parts = [f"{status.name} {status.state}"]
    if status.attempts:
        parts.append(f"attempt {status.attempts[-1].attempt} (job {status.attempts[-1].job_id})")
    if status.agent is not None and (training := training_line(status.agent)) is not None:
        parts.append(training)
    if (slow := slowest_node(status)) is not None:
        parts.append(slow)
    if status.checkpoint is not None:
        parts.append(checkpoint_text(status.checkpoint, now, short=True))
    if status.goodput is not None:
        parts.append(goodput_text(status.goodput, so_far=status.live, short=True))
    parts.append(eta_text(status.eta))
    return printable("; ".join(parts))


def run_ended(status: RunStatus) -> int | None:
    """The exit code when the run is over (0 done, WATCH_FAILED_EXIT otherwise), None while it goes on.

    Over means the journal says the run ended, or, for a run without a supervisor, its last job is
    finished; a supervised run's failed job is followed by RunEnded or by the next attempt."""
    if status.state in END_STATES:
        return 0 if status.state == "done" else WATCH_FAILED_EXIT
    return None


def watch_run(reads: WatchReads, view: WatchView, clock: Clock, interval: float,
              supervised: Callable[[], bool] = lambda: True) -> int:
    """Look every `interval` s, show what changed, and return the run's exit code once it ends.

    `supervised()` says whether something will journal the run's end; when not, the last job's
    terminal Slurm state ends the watch."""
    last_slurm = float("-inf")
    while True:
        at = clock.now()
        ask = at - last_slurm >= SLURM_EVERY_S
        if ask:
            last_slurm = at
        for event in reads.new_events():
            if (line := event_line(event)) is not None:
                view.event(at, line)
        try:
            status = reads.status(ask)
        except RecordError as exc:
            view.problem(at, f"cannot read the run's records: {exc}; still watching")
            status = None
        if status is not None:
            view.status(at, status)
            code = run_ended(status)
            if code is None and status.attempts and not supervised():
                last = status.attempts[-1]
                if last.state in TERMINAL_STATES:
                    code = 0 if last.state == "COMPLETED" else WATCH_FAILED_EXIT
            if code is not None:
                return code
        clock.sleep(interval)


# ---- the run's files and Slurm -----------------------------------------------------------------------


@dataclass
class AnswersOnce:
    """Slurm's answers, asked only when `fresh` is set (by the loop, at most once per SLURM_EVERY_S) or
    when a job appears that was never asked about; the last answers otherwise."""

    slurm: JobQueries
    fresh: bool = True
    queued: dict[str, JobReport] = field(default_factory=dict)
    accounted: dict[str, JobReport] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)

    def queue(self, job_ids: Sequence[str] = ()) -> dict[str, JobReport]:
        if self.fresh or not set(job_ids) <= self.asked:
            self.queued = self.slurm.queue(job_ids)
            self.asked = set(job_ids)
        return {k: v for k, v in self.queued.items() if k in job_ids}

    def accounting(self, job_ids: list[str]) -> dict[str, JobReport]:
        if self.fresh or not set(job_ids) <= set(self.accounted):
            self.accounted = self.slurm.accounting(job_ids)
        return {k: v for k, v in self.accounted.items() if k in job_ids}


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


@dataclass
class RunFiles:
    """WatchReads over a run directory: stat before reading, the journal from its last offset, the rest of
    what status reads (checkpoints, spec, earlier step-time tables) kept in `looks` while unchanged."""

    run: RunDir
    slurm: JobQueries
    say: Callable[[str], None]
    now: Callable[[], float] = time.time
    offset: int = 0
    stamps: tuple[object, ...] = ()
    latest: RunStatus | None = None

    def __post_init__(self) -> None:
        self.answers = AnswersOnce(self.slurm)
        self.looks: dict[Path, Looks] = {}

    def _files(self) -> list[Path]:
        files = [self.run.journal_path]
        if self.latest is not None and self.latest.attempts:
            job_dir = self.run.path / "jobs" / self.latest.attempts[-1].job_id
            files += [summary_path(job_dir), step_times_path(job_dir)]
        return files

    def status(self, ask_slurm: bool) -> RunStatus | None:
        stamps = tuple(_stamp(p) for p in self._files())
        looks = self.looks.get(self.run.path)
        if not ask_slurm and stamps == self.stamps and (looks is None or not looks.changed()):
            return None
        self.answers.fresh = ask_slurm
        self.latest = gather_status([self.run], self.answers, self.say, looks=self.looks, now=self.now())[0]
        self.stamps = tuple(_stamp(p) for p in self._files())
        return self.latest

    def new_events(self) -> Sequence[RunEvent]:
        try:
            with open(self.run.journal_path, "rb") as journal:
                journal.seek(self.offset)
                data = journal.read()
        except OSError:
            return ()
        complete = data[:data.rfind(b"\n") + 1]  # a line still being written is read next time
        where = f"{self.run.journal_path}@{self.offset}"
        self.offset += len(complete)
        events = []
        for raw in complete.splitlines():
            try:
                events.append(event_from_json(json.loads(raw.decode("utf-8")), where))
            except (ValueError, UnicodeDecodeError, RecordError):
                continue  # status warns of damaged lines when it reads the journal
        return events


def skip_history(reads: RunFiles) -> None:
    """Start the event stream at the journal's end: what happened before the watch is status's to show."""
    stamp = _stamp(reads.run.journal_path)
    reads.offset = stamp[1] if stamp is not None else 0


class SystemClock:
    """The wall clock and time.sleep (the loop's Clock outside tests)."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
