"""What `clusterctl status` shows: a run's attempts joined with what Slurm says (pure).

The caller reads the run's journal and rank maps and asks Slurm (see
`clusterctl.launcher.login.use_cases.gather_status`); this module joins them into a `RunStatus`
and renders it.  `RunStatus.to_json()` is what `clusterctl status --json` prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from clusterctl.clock import duration_text, utc
from clusterctl.table_view import Column, TextTable
from clusterctl.terminal_view import plain
from clusterctl.launcher.pure.eta import DONE, ESTIMATE, Eta, eta
from clusterctl.launcher.pure.goodput import Goodput
from clusterctl.launcher.shared.runs import attempts_of, log_path
from clusterctl.records.agent_summary import AgentSummary
from clusterctl.records.node_step_times import NodeStepTimes
from clusterctl.records.rank_map import JobRankMap, PlanSummary
from clusterctl.launcher.pure.checkpoint_tiers import PartsHeld, resumed_text
from clusterctl.records.run_journal import (
    END_KINDS, RESUME_TIERS, Created, RecoveredInAllocation, Resumed, RunEnded, RunEvent, StragglerFound,
)
from clusterctl.slurm.jobs import JobReport


@dataclass(frozen=True)
class RankMapStatus:
    """The part of a job's rank map status shows: its slots and how many DP/PP groups cross a leaf
    (`summary`: None for a map written without the planner's summary)."""

    slots: tuple[str, ...]
    summary: PlanSummary | None

    @classmethod
    def of(cls, rank_map: JobRankMap) -> RankMapStatus:
        return cls(tuple(rank_map.slots), rank_map.summary)

    def to_json(self) -> dict[str, Any]:
        """The slots with the summary's fields beside them (each None without a summary)."""
        summary = self.summary.to_json() if self.summary is not None else {
            "strategy": None, "leaf_crossing_groups": None, "slurm_order_leaf_crossing_groups": None,
            "dfs_order_leaf_crossing_groups": None}
        return {"slots": list(self.slots), **summary}


@dataclass(frozen=True)
class AttemptStatus:
    """One attempt as status shows it: the journal's submission joined with Slurm's report of its job.

    Without a report (Slurm knows the job no more) `state` is UNKNOWN and Slurm's fields are empty.
    """

    attempt: int
    job_id: str
    state: str
    reason: str
    nodes: str
    exit_code: int | None
    signal: int | None
    ended: str
    """How a finished job ended ("exit 3", "signal 9"); empty while it runs."""
    resume_from: str | None
    exclude: str | None
    log: Path
    rank_map: RankMapStatus | None

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "job_id": self.job_id, "state": self.state, "reason": self.reason,
                "nodes": self.nodes, "exit_code": self.exit_code, "signal": self.signal, "ended": self.ended,
                "resume_from": self.resume_from, "exclude": self.exclude, "log": str(self.log),
                "rank_map": self.rank_map.to_json() if self.rank_map is not None else None}


def straggler_json(found: StragglerFound) -> dict[str, Any]:
    """A straggler as `status --json` and `report --json` show it (the journal's event without its blame)."""
    return {"job_id": found.job_id, "node": found.node, "ranks": list(found.ranks), "ratio": found.ratio,
            "seconds": found.seconds, "reference": found.reference, "steps": found.steps,
            "since_step": found.since_step, "lost_s": found.lost_s, "action": found.action,
            "hardware": list(found.hardware), "drain": found.drain, "evidence": list(found.evidence)}


def recovery_status_json(recovered: RecoveredInAllocation) -> dict[str, Any]:
    """A restart inside an allocation as `status --json` shows it."""
    return {"job_id": recovered.job_id, "restart": recovered.restart, "blamed": [b.node for b in recovered.blame],
            "reasons": [b.reason for b in recovered.blame], "nodes": list(recovered.nodes),
            "checkpoint_step": recovered.checkpoint_step, "reason": recovered.reason, "agent": recovered.agent,
            "took_over_from": recovered.took_over_from}


def resumed_json(resumed: Resumed) -> dict[str, Any]:
    """A resume from multi-level checkpoints as `status --json` and `report --json` show it: nodes per tier
    (every tier named), the buddy copies read, and the slowest node's read (None: no node said)."""
    return {"at": resumed.at, "job_id": resumed.job_id, "restart": resumed.restart, "step": resumed.step,
            "nodes": resumed.nodes, "tiers": {tier: resumed.count(tier) for tier in RESUME_TIERS},
            "buddy_copies": list(resumed.buddy_copies), "more_buddy_copies": resumed.more_buddy_copies,
            "reported": resumed.reported, "read_seconds": resumed.read_seconds, "slowest_node": resumed.slowest_node}


def resumes_of(events: Sequence[RunEvent]) -> tuple[Resumed, ...]:
    """The run's resumes from multi-level checkpoints as the journal has them, oldest first."""
    return tuple(e for e in events if isinstance(e, Resumed))


def resume_where(resumed: Resumed) -> str:
    """Which step of which job resumed: "job 42's first step", "job 42, restart 2"."""
    return f"job {resumed.job_id}, " + ("first step" if resumed.restart == 0 else f"restart {resumed.restart}")


@dataclass(frozen=True)
class CheckpointStatus:
    """The run's newest complete checkpoint as `status` shows it: in `directory` (the spec's), recognised by
    `validator` (`tiers`: multi-level checkpoints), `complete` checkpoints found there; `step` None: none is
    complete yet.  `written_at`: when it was saved (the writer's clock; None: not known).  With tiers: the
    newest checkpoint complete across the tiers of the nodes present, `held` where its parts are, and
    `flushed_step` the newest flushed whole to shared storage (None: none yet)."""

    directory: str
    validator: str
    complete: int = 0
    step: int | None = None
    path: str | None = None
    written_at: float | None = None
    held: PartsHeld | None = None
    flushed_step: int | None = None

    def to_json(self) -> dict[str, Any]:
        """As `status --json` shows it (`checkpoint`)."""
        return {"directory": self.directory, "validator": self.validator, "complete": self.complete,
                "step": self.step, "path": self.path, "written_at": self.written_at,
                "tiers": self.held.to_json() if self.held is not None else None, "flushed_step": self.flushed_step}


@dataclass(frozen=True)
class RunStatus:
    """What `clusterctl status` shows of one run; `to_json()` is its `--json`."""

    run: Path
    name: str
    state: str
    """The run's end (done, stopped, cancelled), else its latest job's Slurm state, else "not submitted"."""
    message: str
    attempts: tuple[AttemptStatus, ...]
    in_allocation: tuple[RecoveredInAllocation, ...]
    stragglers: tuple[StragglerFound, ...]
    step_times: NodeStepTimes | None
    """The latest job's per-node step times (None: none written)."""
    agent: AgentSummary | None = None
    """What the latest job's in-allocation agent last saw of its nodes (None: no agent, or none written)."""
    last_resume: Resumed | None = None
    """The run's newest resume from multi-level checkpoints (None: none journaled)."""
    total_steps: int | None = None
    """The spec's `[job] total_steps` (None: not set, or the spec was not read)."""
    checkpoint: CheckpointStatus | None = None
    """The newest complete checkpoint (None: no checkpoint directory, or not read: an ended run in a listing)."""
    goodput: Goodput | None = None
    """The run's goodput so far, as `report` accounts it (None: not read: an ended run in a listing)."""
    looked_at: float | None = None
    """When this status was gathered (epoch s; not in the JSON: ages are counted from it)."""

    @property
    def live(self) -> bool:
        """The run goes on: its journal has no end (a run without a supervisor has none: it goes on as long as
        one looks at it)."""
        return self.state not in RUN_ENDS

    @property
    def eta(self) -> Eta:
        """When the training ends, at the steps/s the job's agent measured (launcher/pure/eta.py)."""
        training = self.agent.training if self.agent is not None else None
        step = self.agent.max_step if self.agent is not None else None
        goodput = self.goodput.goodput if self.goodput is not None else None
        running = self.state in ("RUNNING", "COMPLETING")
        why = "" if running else f"the run {self.state}" if self.state in RUN_ENDS else f"the job is {self.state}"
        return eta(self.total_steps, step, training.steps_per_s if training is not None else None, goodput,
                   not_training=why, finished=self.state == "done")

    def to_json(self) -> dict[str, Any]:
        return {"run": str(self.run), "name": self.name, "state": self.state, "message": self.message,
                "attempts": [a.to_json() for a in self.attempts],
                "in_allocation": [recovery_status_json(r) for r in self.in_allocation],
                "stragglers": [straggler_json(s) for s in self.stragglers],
                "step_times": self.step_times.to_json() if self.step_times is not None else None,
                "agent": self.agent.to_json() if self.agent is not None else None,
                "last_resume": resumed_json(self.last_resume) if self.last_resume is not None else None,
                "eta": self.eta.to_json(),
                "checkpoint": self.checkpoint.to_json() if self.checkpoint is not None else None,
                "goodput": self.goodput.to_json() if self.goodput is not None else None}


RUN_ENDS = frozenset(str(kind) for kind in END_KINDS)
"""The run states its journal's end gives (done, stopped, cancelled)."""


def best_report(job_id: str, queue: Mapping[str, JobReport], accounting: Mapping[str, JobReport]) -> JobReport | None:
    """The controller's view while it has the job (fresher), else accounting's."""
    return queue.get(job_id) or accounting.get(job_id)


def ended_how(report: JobReport) -> str:
    """How a finished job ended, for a person: " (exit 3)", " (signal 9)", or "" while it runs."""
    if not report.terminal:
        return ""
    if report.exit_code is None and report.signal is None:
        return "" if report.state == "COMPLETED" else " (exit code unknown)"
    parts = ([f"exit {report.exit_code}"] if report.exit_code is not None else []) + (
        [f"signal {report.signal}"] if report.signal else [])
    return f" ({', '.join(parts)})"


STEP_TIME_ROWS = 8
"""Nodes the terminal's step-time table lists (the slowest first); --json has them all."""


def stragglers_of(events: Sequence[RunEvent]) -> tuple[StragglerFound, ...]:
    """The run's stragglers as the journal has them, oldest first."""
    return tuple(e for e in events if isinstance(e, StragglerFound))


def run_status(run_path: Path, events: Sequence[RunEvent], rank_maps: Mapping[str, JobRankMap],
               queue: Mapping[str, JobReport], accounting: Mapping[str, JobReport],
               step_times: NodeStepTimes | None = None, agent: AgentSummary | None = None, *,
               total_steps: int | None = None, checkpoint: CheckpointStatus | None = None,
               goodput: Goodput | None = None, looked_at: float | None = None) -> RunStatus:
    """The status of the run at `run_path` from its journal's `events`, the `rank_maps` its jobs wrote
    (by job id), Slurm's `queue` and `accounting`, the latest job's per-node step times and agent summary,
    the spec's total step count, the newest checkpoint, the goodput so far, and when it was looked at."""
    attempts: list[AttemptStatus] = []
    for attempt in attempts_of(events):
        report = best_report(attempt.job_id, queue, accounting)
        rank_map = rank_maps.get(attempt.job_id)
        attempts.append(AttemptStatus(
            attempt=attempt.number, job_id=attempt.job_id,
            state=report.state if report else "UNKNOWN", reason=report.reason if report else "",
            nodes=report.nodes if report else "", exit_code=report.exit_code if report else None,
            signal=report.signal if report else None, ended=ended_how(report).strip(" ()") if report else "",
            resume_from=attempt.resume_from, exclude=attempt.exclude, log=log_path(run_path, attempt.job_id),
            rank_map=RankMapStatus.of(rank_map) if rank_map is not None else None))
    ended = [e for e in events if isinstance(e, RunEnded)]
    if ended:
        state = str(ended[-1].kind)
    elif attempts:
        state = attempts[-1].state
    else:
        state = "not submitted"
    created = next((e for e in events if isinstance(e, Created)), None)
    return RunStatus(run=run_path, name=created.name if created else run_path.name, state=state,
                     message=ended[-1].message if ended else "", attempts=tuple(attempts),
                     in_allocation=tuple(e for e in events if isinstance(e, RecoveredInAllocation)),
                     stragglers=stragglers_of(events), step_times=step_times, agent=agent,
                     last_resume=(resumes_of(events) or (None,))[-1], total_steps=total_steps,
                     checkpoint=checkpoint, goodput=goodput, looked_at=looked_at)


def agent_line(summary: AgentSummary) -> str:
    """One line of what a job's agent last saw: who reports, how far the ranks got, who is silent."""
    steps = ("no step reported yet" if summary.min_step is None else
             f"step {summary.min_step}" if summary.min_step == summary.max_step else
             f"steps {summary.min_step}-{summary.max_step}")
    parts = [f"job {summary.job_id} agent ({summary.state}, {utc(summary.at)}): {summary.reporting}/{summary.nodes} "
             f"nodes reporting, {steps}"]
    for label, names in (("silent", summary.silent), ("stopped ranks", summary.stopped),
                         ("healthd drains", summary.drained)):
        if names:
            parts.append(f"{label}: {' '.join(names)}")
    refused = sum(summary.refused.values())
    if refused:
        parts.append(f"refused {refused} reports ({', '.join(f'{n} {k}' for k, n in sorted(summary.refused.items()))})")
    if summary.message:
        parts.append(summary.message)
    return "; ".join(parts)


def _rate(value: float) -> str:
    """A rate for a person: whole units with thousands marked from 100 up (1,638,400), else 3 digits."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _measured(value: float) -> str:
    """A loss or a norm: 4 significant digits; nan and inf as such (the loss went NaN: that is the news)."""
    return f"{value:.4g}"


def training_line(summary: AgentSummary) -> str | None:
    """One line of what the program says of its training, as the job's agent measured it: "job 7 training
    (last 30 s): step N, X steps/s, Y tokens/s, MFU Z% (peak P TFLOP/s per GPU from ...), loss L at step
    S, grad norm G at step S"; None when the program reports none of it (the line is left out)."""
    t = summary.training
    if t is None:
        return None
    parts = [f"step {summary.max_step}"] if summary.max_step is not None else []
    if t.steps_per_s is not None:
        parts.append(f"{t.steps_per_s:.3g} steps/s")
    if t.tokens_per_s is not None:
        parts.append(f"{_rate(t.tokens_per_s)} tokens/s")
    if t.mfu is not None and t.peak_tflops is not None:
        source = "the spec" if t.peak_from == "spec" else f"NVML's name {t.gpu!r}"
        parts.append(f"MFU {100 * t.mfu:.1f}% (peak {t.peak_tflops:g} TFLOP/s per GPU from {source})")
    elif t.flops_per_s is not None:
        parts.append(f"{_rate(t.flops_per_s / 1e12)} TFLOP/s" + (f", MFU unknown: {t.mfu_missing}" if t.mfu_missing
                                                               else ""))
    elif t.mfu_missing and t.nodes == 0:
        parts.append(f"MFU unknown: {t.mfu_missing}")
    if t.nodes == 0 and (t.tokens_per_s, t.flops_per_s, t.steps_per_s) == (None, None, None):
        parts.append(f"rates: measuring (no node has reported twice within {t.window_s:g} s yet)")
    elif t.nodes < t.nodes_reporting:
        parts.append(f"rates from {t.nodes} of {t.nodes_reporting} nodes")
    if t.loss is not None:
        parts.append(f"loss {_measured(t.loss)} at step {t.loss_step}")
    if t.grad_norm is not None:
        parts.append(f"grad norm {_measured(t.grad_norm)} at step {t.grad_norm_step}")
    return f"job {summary.job_id} training (last {t.window_s:g} s): " + ", ".join(parts)


def eta_text(e: Eta) -> str:
    """The ETA in words: "ETA 2.1 h: 3,800 steps left at 0.52 steps/s (2.3 h at the run's goodput so far,
    91%)", "ETA: done (step 5,000 of 5,000)", "ETA unknown: set [job] total_steps in the spec"."""
    if e.state == DONE:
        shown = f"step {e.step:,} of {e.total_steps:,}" if e.step is not None and e.total_steps is not None else ""
        return "ETA: done" + (f" ({shown})" if shown else "")
    if e.state != ESTIMATE or e.seconds is None or e.steps_per_s is None:
        return f"ETA unknown: {e.why}"
    text = f"ETA {duration_text(e.seconds)}: {e.steps_left:,} steps left at {e.steps_per_s:.3g} steps/s"
    if e.seconds_at_goodput is not None and e.goodput is not None:
        text += f" ({duration_text(e.seconds_at_goodput)} at the run's goodput so far, {_percent(e.goodput)})"
    return text


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


def _age(written_at: float | None, now: float | None) -> str:
    """ ", 4.8 min ago" from the time a thing was written; '' when either is unknown."""
    if written_at is None or now is None:
        return ""
    return f", {duration_text(max(0.0, now - written_at))} ago"


def checkpoint_text(c: CheckpointStatus, now: float | None = None, *, short: bool = False) -> str:
    """The newest complete checkpoint in words, its age counted to `now` (None: no age shown).  `short` (one
    line of the watch): "checkpoint step 1200 saved 4.8 min ago (parts of 12 nodes: 12 on their node, 12 on a
    buddy, 0 on shared storage)"; else with when it was saved and where it is."""
    if c.step is None:
        return "no complete checkpoint yet" + ("" if short else f" in {c.directory}")
    held = c.held
    where = ""
    if held is not None:
        where = (f"parts of {held.parts} node{'' if held.parts == 1 else 's'}: {held.local} on their node, "
                 f"{held.buddy} on a buddy, {held.shared} on shared storage")
    if short:
        age = _age(c.written_at, now)
        return f"checkpoint step {c.step}" + (f" saved{age[1:]}" if age else "") + (f" ({where})" if where else "")
    saved = f" (saved {utc(c.written_at)}{_age(c.written_at, now)})" if c.written_at is not None else ""
    text = f"newest complete checkpoint: step {c.step}{saved}"
    if held is None:
        return text + f": {c.path}"
    flushed = ("none yet" if c.flushed_step is None else
               f"step {c.flushed_step}" + (f" ({c.path})" if c.flushed_step == c.step and c.path else ""))
    return text + f"; {where}; newest flushed whole to shared storage: {flushed}"


def goodput_text(g: Goodput, *, so_far: bool = True, short: bool = False) -> str:
    """The goodput in words: "goodput so far 85% (5.7 min training of 6.7 min since the first submission;
    lost: queue 30.0 s, work redone 31.0 s, restarts 17.8 s, slow nodes 12.5 s)"; `short`: the first words."""
    label = "goodput so far" if so_far else "goodput"
    if g.goodput is None:
        return f"{label} unknown (no wall time since the first submission yet)"
    text = f"{label} {_percent(g.goodput)}"
    if short:
        return text
    lost = [f"{what} {duration_text(seconds)}" for what, seconds in (
        ("queue", g.queue_seconds), ("work redone", g.redone_seconds), ("restarts", g.restart_overhead_seconds),
        ("slow nodes", g.slow_node_seconds), ("running smaller", g.reduced_capacity_seconds)) if seconds > 0]
    return (text + f" ({duration_text(g.productive_seconds)} training of {duration_text(g.wall_seconds)} since "
            "the first submission" + (f"; lost: {', '.join(lost)})" if lost else ")"))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def step_time_table(step_times: NodeStepTimes) -> Group:
    """Per-node compute time per step, the slowest first (at most STEP_TIME_ROWS nodes, then how many more)."""
    nodes = sorted(step_times.nodes, key=lambda n: -(n.ratio or 0.0))
    title = plain(f"compute time per step, job {step_times.job_id} at step {step_times.step}: the job's "
                 f"{_seconds(step_times.reference)} s; lost to slow nodes {step_times.lost_s:.1f} s")
    rows = []
    for n in nodes[:STEP_TIME_ROWS]:
        ranks = n.ranks
        ranks_text = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0]) if ranks else "-"
        ratio = f"{n.ratio:.2f}" if n.ratio is not None else "-"
        rows.append((n.node, ranks_text, _seconds(n.seconds), ratio, n.state, f"{n.lost_s:.1f}"))
    table = TextTable((Column("node", bare=True), Column("ranks"), Column("s/step", "right"), Column("x job", "right"),
                       Column("state"), Column("lost s", "right")), tuple(rows), boxed=False)
    parts: list[RenderableType] = [title, table]
    if len(nodes) > STEP_TIME_ROWS:
        parts.append(Text(f"... and {len(nodes) - STEP_TIME_ROWS} more nodes (--json lists them all)"))
    return Group(*parts)


def progress_lines(status: RunStatus, now: float | None = None) -> list[str]:
    """The lines of how far the run got, as `status` shows them below the agent's: the ETA (while the run goes
    on), the newest checkpoint (its age while the run goes on, counted to `now`, default when the status was
    gathered) and the goodput so far."""
    lines = []
    live = status.live
    if live:
        lines.append(eta_text(status.eta))
    if status.checkpoint is not None:
        lines.append(checkpoint_text(status.checkpoint, (now if now is not None else status.looked_at) if live else None))
    if status.goodput is not None:
        lines.append(goodput_text(status.goodput, so_far=live))
    return lines


def status_renderables(status: RunStatus, now: float | None = None) -> Group:
    """The status for a terminal (ages counted to `now`, default when the status was gathered)."""
    title = Text.assemble(plain(status.name, "bold"), plain(f"  {status.state}  {status.run}"))
    parts: list[RenderableType] = [title]
    if status.message:
        parts.append(plain(status.message))
    rows = []
    for a in status.attempts:
        rm = a.rank_map
        # A map without the planner's summary shows "None / None", as it always has.
        summary = rm.summary if rm else None
        cost = (f"{summary.leaf_crossing_groups if summary else None} / "
                f"{summary.slurm_order_leaf_crossing_groups if summary else None}" if rm else "-")
        state = a.state + (f" ({a.reason})" if a.reason not in ("", "None") else "") + (
            f" {a.ended}" if a.ended else "")
        rows.append((str(a.attempt), a.job_id, state, a.nodes or "-", cost, str(a.log)))
    # Laid out where it is shown (clusterctl/table_view.py): piped, a row a line with every value whole;
    # on a terminal too narrow for the table, each attempt stacked with its values labelled.
    parts.append(TextTable((Column("attempt"), Column("job"), Column("state", max_width=28), Column("nodes"),
                            Column("cross-leaf (map/Slurm)", max_width=12), Column("log")),
                           tuple(rows), boxed=False))
    for r in status.in_allocation:
        step = r.checkpoint_step if r.checkpoint_step is not None else "the start"
        why = (f"{', '.join(f'{b.node} ({b.reason})' for b in r.blame)} given back"
               if r.blame else r.reason or "no node blamed")
        took = f"; the standby agent on {r.agent} took the job over from {r.took_over_from}" if r.took_over_from else ""
        parts.append(plain(f"job {r.job_id}: restarted inside the allocation ({r.restart}): {why}; "
                          f"new step on {' '.join(r.nodes)} from step {step}{took}"))
    if status.last_resume is not None:
        parts.append(plain(f"last resume ({resume_where(status.last_resume)}): {resumed_text(status.last_resume)}"))
    for s in status.stragglers:
        hardware = "; ".join(s.hardware) or "its GPUs say nothing that explains it"
        parts.append(plain(f"job {s.job_id}: straggler {s.node}: {s.ratio:.2f}x the job's compute time for "
                          f"{s.steps} steps from step {s.since_step}, {s.lost_s:.1f} s lost; {s.action}; "
                          f"GPUs: {hardware}" + (f"; {s.drain}" if s.drain else "")))
    if status.agent is not None and status.state in ("RUNNING", "COMPLETING"):
        parts.append(plain(agent_line(status.agent)))
        if (training := training_line(status.agent)) is not None:
            parts.append(plain(training))
    parts += [plain(line) for line in progress_lines(status, now)]
    if status.step_times:
        parts.append(step_time_table(status.step_times))
    return Group(*parts)
