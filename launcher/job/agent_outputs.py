"""What the in-job agent writes while it watches a step: its summary, the job's training series, its metrics file.

Once per summary interval (`StepWatch`, launcher/job/step_watch.py) and when a step ends, the agent
rewrites `<job dir>/agent-summary.json` (read by the supervisor, its standby and `clusterctl
status`), appends a point to `<job dir>/training-series.jsonl` when the step moved (read by
`clusterctl report`), and writes the job's node_exporter textfile when a directory was chosen.
It also journals where a resumed step's checkpoint came from (multi-level checkpoints).  A failed
write is said (once for the series and the metrics file) and the job goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from clusterctl.job_metrics_file import destination, directory_problem, remove_textfile, textfile_name, write_textfile
from clusterctl.launcher.job.agent_doors import AgentDoors
from clusterctl.launcher.job.checkpoint_plan import TierPlanner
from clusterctl.launcher.job.signal_watch import SignalWatch
from clusterctl.launcher.job.step_launch import Launched
from clusterctl.launcher.pure.checkpoint_tiers import resumed_text
from clusterctl.launcher.pure.job_metrics_text import job_metrics_text
from clusterctl.launcher.pure.node_signals import Signals
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.pure.straggler_watch import StragglerWatch
from clusterctl.records.agent_summary import AgentSummary, write_agent_summary
from clusterctl.records.checkpoint_holdings import CheckpointHoldings
from clusterctl.records.run_journal import append_run_event
from clusterctl.records.training_series import SERIES_NAME, append_training_point, point_of

SUMMARY_MIN_SECONDS = 2.0
"""The agent summary (`<job dir>/agent-summary.json`) is rewritten every max(this, heartbeat) s."""
SERIES_MIN_SECONDS = 10.0
"""The job's training series gets a point at most this often while the step runs (and at each state change)."""


class MetricsExport:
    """The job's metrics as a node_exporter textfile (clusterctl/job_metrics_file.py), while the agent runs."""

    def __init__(self, environ: Mapping[str, str], doors: AgentDoors, job_id: str, job_name: str) -> None:
        self.environ, self.doors, self.job_id, self.job_name = environ, doors, job_id, job_name
        self.directory: Path | None = None
        """Where the job's metrics file goes (node_exporter's textfile directory; None: nowhere)."""
        self.failed = False
        self.written = False

    def choose(self) -> None:
        """Where the job's metrics file goes (clusterctl/job_metrics_file.py: the job's environment, else
        the admins' healthd.toml): said in one line, or why not; the job goes on either way."""
        chosen = destination(self.environ, self.doors.admin_metrics())
        self.directory = None
        if chosen.problem:
            self.doors.say(chosen.problem)
        if chosen.directory is None:
            return
        problem = directory_problem(chosen.directory)
        if problem is not None:
            self.doors.say(f"{chosen.source} names {chosen.directory}, which {problem}: the job's metrics are not "
                           "exported")
            return
        self.directory = chosen.directory
        self.doors.say(f"the job's metrics go to {chosen.directory / textfile_name(self.job_id)} (from "
                       f"{chosen.source}) while this agent runs")
        self.doors.on_terminate(self.withdraw)

    def write(self, summary: AgentSummary) -> None:
        """The summary's figures as a node_exporter textfile (launcher/pure/job_metrics_text.py), when a
        directory was chosen; a failure is said once, the job goes on."""
        if self.directory is None:
            return
        try:
            self.written = True  # a write cut short may leave its temp file: withdrawn too
            write_textfile(self.directory, self.job_id, job_metrics_text(summary, self.job_name))
        except OSError as exc:
            if not self.failed:
                self.doors.say(f"cannot write the job's metrics to {self.directory / textfile_name(self.job_id)} "
                               f"({exc.strerror}): watching on without them")
            self.failed = True

    def withdraw(self) -> None:
        """Remove the job's metrics file: once the agent is gone nobody updates it, and node_exporter
        would export its last figures for ever (the epilog removes it too, for an agent killed hard)."""
        if self.directory is None or not self.written:
            return
        try:
            remove_textfile(self.directory, self.job_id)
        except OSError as exc:
            self.doors.say(f"cannot remove the job's metrics file from {self.directory} ({exc.strerror})")


class TrainingSeriesLog:
    """The job's training series (`<job dir>/training-series.jsonl`): a point when the step moved."""

    def __init__(self, job_dir: Path, doors: AgentDoors) -> None:
        self.job_dir, self.doors = job_dir, doors
        self.failed = False
        self.at = float("-inf")
        """When the last point was appended (the summary's time)."""
        self.last: tuple[str, int] | None = None
        """(launch, step) of the last point appended to the job's training series."""

    def append(self, summary: AgentSummary, stragglers: StragglerWatch | None) -> None:
        """One point of the job's training series (`<job dir>/training-series.jsonl`), when the summary has
        training figures and the step moved since the last point; a failure is said once, the job goes on."""
        if summary.training is None or summary.max_step is None or \
                (summary.launch, summary.max_step) == self.last:
            return
        if summary.state == "watching" and summary.at - self.at < SERIES_MIN_SECONDS:
            return  # a small job's 2 s summaries: its rates are 30 s averages, a point each 10 s loses nothing
        slowest = stragglers.slowest if stragglers is not None else None
        point = point_of(summary, (slowest.node, slowest.seconds) if slowest and slowest.seconds is not None else None,
                         stragglers.reference if stragglers is not None else None)
        if point is None:
            return
        try:
            append_training_point(self.job_dir, point)
        except OSError as exc:
            if not self.failed:
                self.doors.say(f"cannot append the job's training series to {self.job_dir / SERIES_NAME} "
                               f"({exc.strerror}): `report --html` will draw its curves with gaps; watching on")
            self.failed = True
            return
        self.last = (summary.launch, summary.max_step)
        self.at = summary.at


class AgentOutputs:
    """Everything the agent writes about the step it watches: the summary and what follows each one."""

    def __init__(self, run_dir: Path, job_dir: Path, job_id: str, spec: JobSpec, doors: AgentDoors,
                 tiers: TierPlanner | None, metrics: MetricsExport) -> None:
        self.run_dir, self.job_dir, self.job_id, self.spec, self.doors = run_dir, job_dir, job_id, spec, doors
        self.tiers, self.metrics = tiers, metrics
        self.series = TrainingSeriesLog(job_dir, doors)

    def summarize(self, launched: Launched, watch: SignalWatch, signals: Signals, state: str = "watching",
                  stragglers: StragglerWatch | None = None) -> None:
        """Rewrite the agent summary the supervisor and `clusterctl status` read (one file per interval), append
        to the job's training series when the step moved (`stragglers`: the slowest node's step time) and
        write the job's metrics file."""
        if self.tiers is not None:
            self.tiers.observe(watch.holdings())
        steps = watch.signals.step_range()
        stopped = tuple(sorted(h.report.node for h in watch.signals.heard.values()
                               if "stopped" in h.report.columns.process or "gone" in h.report.columns.process))
        refused = dict(watch.inbox.refused)
        training = watch.training(launched.rank_map.world_size, self.spec.job.gpu_peak_tflops)
        summary = AgentSummary(
            job_id=self.job_id, launch=launched.launch, at=self.doors.now(),
            interval=max(SUMMARY_MIN_SECONDS, watch.policy.heartbeat), state=state,
            nodes=len(launched.slots), reporting=signals.reporting, silent=signals.silent, stopped=stopped,
            drained=signals.drained, min_step=steps[0] if steps else None,
            max_step=steps[1] if steps else None, refused=refused,
            message="; ".join(m for m in (
                f"{signals.channel_silent} nodes silent at once: the report channel, not the nodes"
                if signals.channel_silent else "", watch.refusing(), watch.copies_refusing()) if m),
            training=training)
        try:
            write_agent_summary(self.job_dir, summary)
        except OSError as exc:
            self.doors.say(f"cannot write the agent summary in {self.job_dir} ({exc.strerror}); watching on")
        self.series.append(summary, stragglers)
        self.metrics.write(summary)

    def journal_resume(self, holdings: Mapping[str, CheckpointHoldings], *, step_ended: bool = False) -> None:
        """Journal where the running step's resume came from and how long the slowest node's read took: one
        line per resumed step, once every node said (from the holdings in their reports), else at its end."""
        assert self.tiers is not None
        line = self.tiers.resume_line(holdings, self.job_id, self.doors.now(), step_ended=step_ended)
        if line is None:
            return
        self.doors.say(f"resumed {resumed_text(line)}")
        try:
            append_run_event(self.run_dir / "journal.jsonl", line)
        except OSError as exc:
            self.doors.say(f"cannot journal the resume ({exc.strerror}): status and report will not show it")
