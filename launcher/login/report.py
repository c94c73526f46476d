"""`clusterctl report RUN`: attempts, what each ran, blame with evidence, checkpoints and goodput (pure).

The caller reads the journal and lists the checkpoints (see
`clusterctl.launcher.login.use_cases.gather_report`); this module accounts them into a `RunReport`
and renders it.  `RunReport.to_json()` is what `clusterctl report --json` prints.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from clusterctl.clock import duration_text
from clusterctl.launcher.pure.checkpoint import Checkpoint, Skipped
from clusterctl.launcher.pure.goodput import (
    COST_LOCAL_SAVE, Goodput, LostSpan, account, attempt_times, lost_spans, restarts_of,
)
from clusterctl.launcher.pure.restart_policy import replay
from clusterctl.launcher.login.status import resume_where, resumed_json, resumes_of, straggler_json, stragglers_of
from clusterctl.launcher.pure.checkpoint_tiers import resumed_text
from clusterctl.launcher.pure.training_curves import training_line
from clusterctl.table_view import Column, TextTable
from clusterctl.terminal_view import plain
from clusterctl.records.experiment_record import CodeVersion, ExperimentRecord
from clusterctl.records.training_series import TrainingPoint
from clusterctl.records.run_journal import (
    BlamedNode, DecisionAction, OutcomeKind, RecoveredInAllocation, Resumed, RunEvent, StragglerFound,
)
from clusterctl.errors import HostlistError
from clusterctl.slurm import hostlist
from clusterctl.text import one_line


@dataclass(frozen=True)
class AttemptReport:
    """One attempt as the report shows it: what the supervisor decided when its job ended (every
    decision field None, `state` "running", while the attempt has not ended), and when it was
    submitted, started and ended (epoch seconds, None when not known or not yet)."""

    attempt: int
    job_id: str | None
    state: str
    outcome: OutcomeKind | None
    message: str | None
    blame: tuple[BlamedNode, ...]
    checkpoint_step: int | None
    action: DecisionAction | None
    submitted_at: float | None = None
    """When sbatch accepted it (the journal's time), else Slurm's submit time."""
    started_at: float | None = None
    """Slurm's start time."""
    ended_at: float | None = None
    """Slurm's end time; for a job Slurm lost, when the supervisor decided."""
    nodes: AttemptNodes | None = None
    """The nodes its job ran on and its spares, as its rank map says (None: the job wrote none)."""

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "job_id": self.job_id, "state": self.state,
                "outcome": str(self.outcome) if self.outcome is not None else None, "message": self.message,
                "blame": [b.to_json() for b in self.blame], "checkpoint_step": self.checkpoint_step,
                "action": str(self.action) if self.action is not None else None,
                "submitted_at": self.submitted_at, "started_at": self.started_at, "ended_at": self.ended_at,
                "nodes": self.nodes.to_json() if self.nodes is not None else None}


def natural_order(name: str) -> list[Any]:
    """A node name's sort key with its numbers as numbers: node2 before node10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def nodes_text(names: Sequence[str]) -> str:
    """Node names as one compressed Slurm hostlist in natural order (`node[1-3,7]`); "" for none.  Names
    read from a file that are not host names are listed as written, on one line, never as controls."""
    ordered = sorted(set(names), key=natural_order)
    try:
        return hostlist.compress(ordered)
    except HostlistError:
        return one_line(",".join(ordered))


@dataclass(frozen=True)
class AttemptNodes:
    """Where an attempt's job ran, from its rank map (`RUN/jobs/<job>/rankmap.json`; after restarts inside
    the allocation, the last step's): the nodes holding its ranks and the allocated nodes left as spares."""

    used: tuple[str, ...]
    spares: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """As `report --json` shows it: compressed hostlists, "" for none."""
        return {"used": nodes_text(self.used), "spares": nodes_text(self.spares)}


NOT_RECORDED = "no experiment record (submitted by a clusterctl that did not write one)"


@dataclass(frozen=True)
class AttemptExperiment:
    """What one attempt ran, as its experiment record (`path`) says; `record` None when it could not be
    read (`problem` says why: none written, damaged, from a newer clusterctl)."""

    attempt: int
    path: Path
    record: ExperimentRecord | None
    problem: str | None = None


def spec_changes(before: Mapping[str, object], after: Mapping[str, object], prefix: str = "") -> tuple[str, ...]:
    """The dotted keys whose values differ between two resolved specs (`job.spare_nodes`), sorted."""
    changed: list[str] = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            changed += spec_changes(old, new, f"{prefix}{key}.")
        elif old != new or (key in before) != (key in after):
            changed.append(f"{prefix}{key}")
    return tuple(changed)


def _changes(shown: Sequence[AttemptExperiment]) -> list[tuple[AttemptExperiment, ExperimentRecord | None]]:
    """Each attempt with the previous attempt whose record was read (None for the first)."""
    pairs: list[tuple[AttemptExperiment, ExperimentRecord | None]] = []
    previous: ExperimentRecord | None = None
    for attempt in shown:
        pairs.append((attempt, previous))
        previous = attempt.record or previous
    return pairs


def experiment_json(shown: Sequence[AttemptExperiment]) -> list[dict[str, Any]]:
    """The attempts' experiment records as `report --json` shows them: everything but the resolved spec
    itself (it may hold secrets, and it is in `record`), with the spec keys changed since the previous
    attempt."""
    entries = []
    for attempt, previous in _changes(shown):
        entry: dict[str, Any] = {"attempt": attempt.attempt, "record": str(attempt.path), "problem": attempt.problem}
        record = attempt.record
        if record is not None:
            entry.update(recorded_at=record.recorded_at, clusterctl_version=record.clusterctl_version,
                         command=list(record.command), data_version=record.data_version, code=record.code.to_json(),
                         spec_changed=list(spec_changes(previous.spec, record.spec)) if previous else [])
        entries.append(entry)
    return entries


def code_text(code: CodeVersion) -> str:
    """The code version in a user's words: `git 1a2b3c4d5e6f, clean, in /home/u/proj`."""
    where = f", in {code.workdir}"
    if code.commit is None:
        return f"unknown ({code.unknown}){where}"
    if code.dirty is None:
        state = f" ({code.unknown})"
    else:
        state = " with uncommitted changes to tracked files" if code.dirty else ", clean"
    return f"git {code.commit[:12]}{state}{where}"


def experiment_lines(shown: Sequence[AttemptExperiment]) -> list[tuple[str, str]]:
    """The report's experiment section as (text, style) lines: per attempt its code, data and clusterctl
    versions (after the first, only what changed) and the command its ranks started with."""
    if not shown:
        return []
    if all(a.record is None and a.problem == NOT_RECORDED for a in shown):
        return [("experiment: not recorded (the attempts were submitted by a clusterctl that did not record them)",
                 "dim")]
    lines = [("experiment (each attempt's record, with its resolved spec: RUN/attempts/<n>/experiment.json)", "")]
    for attempt, previous in _changes(shown):
        record = attempt.record
        if record is None:
            lines.append((f"  attempt {attempt.attempt}: {attempt.problem}", "yellow"))
            continue
        data = f'data version "{record.data_version}"' if record.data_version is not None else \
            "no data version (job.data_version)"
        facts = [f"code {code_text(record.code)}", data, f"clusterctl {record.clusterctl_version}"]
        if previous is not None:
            facts = [f"code as attempt {previous.attempt}" if record.code == previous.code else facts[0]]
            facts += [data] if record.data_version != previous.data_version else []
            facts += [f"clusterctl {record.clusterctl_version}"] if (
                record.clusterctl_version != previous.clusterctl_version) else []
            changed = spec_changes(previous.spec, record.spec)
            facts += [f"spec changed: {', '.join(changed)}"] if changed else []
        lines.append((f"  attempt {attempt.attempt}: {'; '.join(facts)}", ""))
        lines.append((f"      {shlex.join(record.command)}", "dim"))
    return [(one_line(text), style) for text, style in lines]  # a record is a file: nothing in it may steer a terminal


def recovery_report_json(recovered: RecoveredInAllocation) -> dict[str, Any]:
    """A restart inside an allocation as `report --json` shows it."""
    return {"job_id": recovered.job_id, "restart": recovered.restart, "blame": [b.to_json() for b in recovered.blame],
            "given_back": list(recovered.given_back), "nodes": list(recovered.nodes),
            "checkpoint_step": recovered.checkpoint_step, "phases": dict(recovered.phases),
            "reason": recovered.reason, "agent": recovered.agent, "took_over_from": recovered.took_over_from,
            "stacks": list(recovered.stacks)}


@dataclass(frozen=True)
class RunReport:
    """What `clusterctl report` shows of one run; `to_json()` is its `--json`."""

    run: Path
    state: str
    """The run's end (done, stopped, cancelled), or "running"."""
    message: str
    attempts: tuple[AttemptReport, ...]
    excluded_now: tuple[str, ...]
    """Nodes still blamed now: the next submission excludes them (a live fact: it changes as blames expire)."""
    in_allocation: tuple[RecoveredInAllocation, ...]
    stragglers: tuple[StragglerFound, ...]
    checkpoints: tuple[Checkpoint, ...]
    """The complete checkpoints, oldest first."""
    skipped: tuple[Skipped, ...]
    goodput: Goodput
    restarts_used: int = 0
    """Recoveries so far, in place, on a spare or by resubmission: each uses one of restart.max_restarts."""
    max_restarts: int | None = None
    journal_warnings: tuple[str, ...] = ()
    """Damaged journal lines that were skipped, each with what it may have cost (the counts above may be off)."""
    resumes: tuple[Resumed, ...] = ()
    """Every resume from multi-level checkpoints, oldest first: where the nodes' parts came from, how long reading took."""
    experiment: tuple[AttemptExperiment, ...] = ()
    """What each attempt ran (its experiment record), oldest first."""
    lost: tuple[LostSpan, ...] = ()
    """Where the time `goodput` counts as lost went, span by span (queue, work redone, restarts)."""
    training: tuple[TrainingPoint, TrainingPoint] | None = None
    """The first and the newest point of the jobs' training series (None: none kept one)."""
    training_problems: tuple[str, ...] = ()
    """What could not be read of those series."""
    excluded_when_ended: tuple[str, ...] | None = None
    """An ended run's nodes whose blame was in force when it ended (what its last submissions avoided, the same
    whenever the report is made); None while the run runs."""

    def to_json(self) -> dict[str, Any]:
        return {"run": str(self.run), "state": self.state, "message": self.message,
                "attempts": [a.to_json() for a in self.attempts], "excluded_now": list(self.excluded_now),
                "excluded_when_ended": None if self.excluded_when_ended is None else list(self.excluded_when_ended),
                "experiment": experiment_json(self.experiment),
                "in_allocation": [recovery_report_json(r) for r in self.in_allocation],
                "resumes": [resumed_json(r) for r in self.resumes],
                "stragglers": [straggler_json(s) for s in self.stragglers],
                "checkpoints": {"complete": len(self.checkpoints),
                                "latest_step": self.checkpoints[-1].step if self.checkpoints else None,
                                "skipped": [{"path": s.path, "why": s.why} for s in self.skipped]},
                "goodput": self.goodput.to_json(),
                "restarts": {"used": self.restarts_used, "max": self.max_restarts},
                "journal_warnings": list(self.journal_warnings), "training": self._training_json()}

    def _training_json(self) -> dict[str, Any] | None:
        if self.training is None and not self.training_problems:
            return None
        first, last = self.training or (None, None)
        return {"first": first.to_json() if first else None, "last": last.to_json() if last else None,
                "problems": list(self.training_problems)}


def run_report(run_path: Path, events: Sequence[RunEvent], checkpoints: Sequence[Checkpoint],
               skipped: Sequence[Skipped], now: float, slow_node_seconds: float = 0.0,
               max_restarts: int | None = None, journal_warnings: Sequence[str] = (), tiers: bool = False,
               experiment: Sequence[AttemptExperiment] = (),
               training: tuple[TrainingPoint, TrainingPoint] | None = None,
               training_problems: Sequence[str] = (), nodes: Mapping[str, AttemptNodes] | None = None) -> RunReport:
    """The report of the run at `run_path` from its journal's `events`, the complete `checkpoints`
    (oldest first) and `skipped` ones found in its checkpoint directory, the seconds its jobs
    lost to slow nodes (their step-time tables), its spec's restart.max_restarts, and the warnings
    of the journal's damaged lines (shown first: every count below may be off by what they held).
    `tiers`: the spec has multi-level checkpoints on (the checkpoints' cost is the local save's).
    `experiment`: each attempt's experiment record, oldest first.  `training`: the first and the newest
    point of the jobs' training series, and what could not be read of them.  `nodes`: where each job ran, by
    job id (from its rank map)."""
    state = replay(events)
    times = []
    attempts = []
    for a in state.attempts:
        d = a.decided
        times.append(attempt_times(a))
        attempts.append(AttemptReport(attempt=a.number, job_id=a.job_id, state=d.state if d else "running",
                                      outcome=d.outcome if d else None, message=d.message if d else None,
                                      blame=d.blame if d else (), checkpoint_step=d.checkpoint_step if d else None,
                                      action=d.action if d else None, submitted_at=times[-1].submit or None,
                                      started_at=times[-1].start or None,
                                      ended_at=(times[-1].end or d.at) if d is not None else None,
                                      nodes=(nodes or {}).get(a.job_id or "")))
    recoveries = tuple(e for e in events if isinstance(e, RecoveredInAllocation))
    restarts = restarts_of(recoveries)
    goodput = account(times, list(checkpoints), now, restarts, slow_node_seconds, tiers)
    return RunReport(run=run_path, state=str(state.ended.kind) if state.ended else "running",
                     message=state.ended.message if state.ended else "", attempts=tuple(attempts),
                     excluded_now=tuple(state.excluded(now)), in_allocation=recoveries,
                     stragglers=stragglers_of(events), checkpoints=tuple(checkpoints), skipped=tuple(skipped),
                     goodput=goodput, restarts_used=state.budget.restarts, max_restarts=max_restarts,
                     journal_warnings=tuple(journal_warnings), resumes=resumes_of(events),
                     experiment=tuple(experiment), lost=lost_spans(times, list(checkpoints), now, restarts),
                     training=training, training_problems=tuple(training_problems),
                     excluded_when_ended=tuple(state.excluded(state.ended.at)) if state.ended else None)


def attempt_cells(a: AttemptReport) -> tuple[object, ...]:
    """An attempt's row in the report's table: number, job, Slurm's end, outcome, checkpoint, decision, its
    nodes and spares (`-`: none, or no rank map)."""
    return (a.attempt, a.job_id, a.state, a.outcome if a.outcome is not None else "-",
            a.checkpoint_step if a.checkpoint_step is not None else "-", a.action if a.action is not None else "-",
            (nodes_text(a.nodes.used) or "-") if a.nodes else "-", (nodes_text(a.nodes.spares) or "-") if a.nodes else "-")


def report_renderables(report: RunReport) -> Group:
    """The report for a terminal."""
    g = report.goodput
    parts: list[RenderableType] = [Text.assemble(("run ", "bold"), plain(report.run), "  ", plain(report.state, "bold"),
                                                 plain(f"  {report.message}" if report.message else ""))]
    parts += [plain(f"warning: {warning}", "yellow") for warning in report.journal_warnings]
    rows = tuple(tuple(str(cell) for cell in attempt_cells(a)) for a in report.attempts)
    parts.append(TextTable((*(Column(header) for header in ("attempt", "job", "ended", "outcome", "checkpoint",
                                                             "decision")),
                            Column("nodes", max_width=24), Column("spares", max_width=16)), rows, boxed=False))
    parts += [plain(text, style) for text, style in experiment_lines(report.experiment)]
    if report.training is not None:
        parts.append(plain(training_line(*report.training)))
    parts += [plain(f"warning: {problem}", "yellow") for problem in report.training_problems]
    for a in report.attempts:
        for b in a.blame:
            parts.append(plain(f"attempt {a.attempt}: blamed {b.node}: {b.reason}"))
            parts += [plain(f"    {line}", "dim") for line in b.evidence]
    for r in report.in_allocation:
        took = sum(dict(r.phases).values())
        step = r.checkpoint_step if r.checkpoint_step is not None else "the start"
        smaller = (f", shrunk from {r.data_parallel_before} to {r.data_parallel_after} data-parallel replicas"
                   if r.shrank else f" at {r.data_parallel_after} data-parallel replicas"
                   if r.data_parallel_after is not None else "")
        parts.append(plain(f"job {r.job_id}: restart {r.restart} inside the allocation in {duration_text(took)}, "
                          f"from step {step} on {' '.join(r.nodes)}{smaller} (no queue wait)"))
        if r.took_over_from:
            parts.append(plain(f"    the standby agent on {r.agent} took the job over from {r.took_over_from} "
                               "(the batch host, where the job's agent ran)"))
        if not r.blame and r.reason:
            parts.append(plain(f"    {r.reason}"))
        for b in r.blame:
            given = "given back to Slurm" if b.node in r.given_back else "kept in the job"
            parts.append(plain(f"    blamed {b.node} ({given}): {b.reason}"))
            parts += [plain(f"        {line}", "dim") for line in b.evidence]
        if r.stacks:
            parts.append(plain("    where the hung ranks were (their Python stacks, read before the step was ended):"))
            parts += [plain(f"        {line}", "dim") for line in r.stacks]
    for resumed in report.resumes:
        parts.append(plain(f"{resume_where(resumed)}: resumed {resumed_text(resumed)}"))
    for s in report.stragglers:
        parts.append(plain(f"job {s.job_id}: straggler {s.node} ({s.action}): {s.ratio:.2f}x the job's "
                          f"compute time for {s.steps} steps from step {s.since_step}, "
                          f"{duration_text(s.lost_s)} lost when found"))
        parts += [plain(f"    {line}", "dim") for line in (*s.evidence, *s.hardware)]
        if s.drain:
            parts.append(plain(f"    {s.drain}", "dim"))
    limit = f" of {report.max_restarts}" if report.max_restarts is not None else ""
    parts.append(plain(f"restarts used: {report.restarts_used}{limit} (restart.max_restarts; in place, on a spare "
                      f"or by resubmission, each counts one)"))
    share = f"{g.goodput * 100:.1f}%" if g.goodput is not None else "-"
    parts.append(Text(
        f"goodput {share}: productive {duration_text(g.productive_seconds)} of {duration_text(g.wall_seconds)}; "
        f"lost: redone work {duration_text(g.redone_seconds)}, queue {duration_text(g.queue_seconds)}, "
        f"restart overhead {duration_text(g.restart_overhead_seconds)}, slow nodes {duration_text(g.slow_node_seconds)}; "
        + (f"capacity lost running smaller {duration_text(g.reduced_capacity_seconds)}; "
           if g.reduced_capacity_seconds > 0 else "")
        + f"node failures {g.node_failures}"))
    if g.advised_interval_seconds is not None and g.checkpoint_cost_source == COST_LOCAL_SAVE:
        parts.append(Text(
            f"flushed to shared storage every {duration_text(g.checkpoint_interval_seconds)} now; Young/Daly advises "
            f"saving every {duration_text(g.advised_interval_seconds)} (cost {duration_text(g.checkpoint_cost_seconds)}: "
            f"the local save, the slowest node's; the copy to the buddy and the flush run behind training; "
            f"MTBF {duration_text(g.mtbf_seconds)})"))
    elif g.advised_interval_seconds is not None:
        parts.append(Text(
            f"checkpoint every {duration_text(g.checkpoint_interval_seconds)} now; Young/Daly advises "
            f"{duration_text(g.advised_interval_seconds)} (cost {duration_text(g.checkpoint_cost_seconds)}: the save, "
            f"MTBF {duration_text(g.mtbf_seconds)})"))
    else:
        parts.append(Text("checkpoint-interval advice needs a measured checkpoint cost and at least one node failure",
                          style="dim"))
    return Group(*parts)
