"""`clusterctl report RUN --html FILE`: the run drawn on one self-contained HTML page (pure).

`report_html(report, now, extra)` turns a `RunReport` (what `clusterctl report` shows) and what
the run's files hold besides the journal (`RunSeries`: per-node step times, and the loss, tokens/s
and MFU curves of the jobs' training series, `run_series`) into one HTML page: a timeline of
attempts, faults, recoveries and checkpoints; the time lost, by cause; the training curves on the
timeline's axis, each fault and recovery a dashed line across them; a per-node step-time heat map;
and what happened, in words.  Inline SVG and CSS only: no script, nothing fetched, so the file opens
offline, attached to a ticket or mailed.

Every text from outside (the run's path, job ids, node names, blame reasons, evidence, commands,
messages) goes through `_text`: shown as written, never read as markup.  The page's size is bounded
whatever the run's: a heat map of more than HEAT_MAP_NODES nodes draws the SLOWEST_NODES slowest and
every node's percentiles; a curve keeps at most CURVE_POINTS points (each bucket's lowest and highest,
so a spike stays); the timeline draws at most TIMELINE_MARKS marks of a kind and the list of what
happened at most EVENT_LINES lines.  Each cut says so on the page.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import TypeVar

from clusterctl import __version__
from clusterctl.launcher.login.report import (
    AttemptReport, RunReport, attempt_cells, duration_text, experiment_lines, natural_order,
)
from clusterctl.launcher.pure.goodput import LOST_QUEUE, LOST_REDONE, LOST_RESTART
from clusterctl.launcher.pure.training_curves import TrainingCurves
from clusterctl.records.node_step_times import NodeStepTime, NodeStepTimes
from clusterctl.records.run_journal import OutcomeKind
from clusterctl.text import one_line

FAULT_COLOUR = "#d62728"
"""A fault's marker on the timeline (a node blamed for an attempt's end or a restart); nothing else is this red."""
COMPLETED_COLOUR = "#2ca02c"
"""An attempt that completed."""
ENDED_COLOUR = "#7b8a99"
"""An attempt that ended without completing (a node failure, the program's failure, cancelled)."""
RUNNING_COLOUR = "#1f77b4"
"""An attempt still running."""
QUEUE_COLOUR = "#cfcfcf"
REDONE_COLOUR = "#fd8d3c"
RESTART_COLOUR = "#9e9ac8"
SLOW_COLOUR = "#e6b800"
PRODUCTIVE_COLOUR = "#74c476"
RECOVERY_COLOUR = "#6a51a3"
CHECKPOINT_COLOUR = "#08519c"
CURVE_COLOUR = "#1f4e79"

HEAT_MAP_NODES = 24
"""Up to this many nodes the heat map has a row per node; beyond, the slowest and percentile rows."""
SLOWEST_NODES = 16
BANDS = (50, 90, 99)
"""The percentiles of every node's ratio drawn as rows when the nodes are too many for a row each."""
HEAT_MAP_COLUMNS = 48
"""Step-time tables beyond this many are merged by time (each node's slowest in the bin)."""
CURVE_POINTS = 600
TIMELINE_MARKS = 400
TIMELINE_LABELS = 12
EVENT_LINES = 150
EVIDENCE_LINES = 12

WIDTH = 1000
LEFT = 130
"""The lane labels' column; the plot starts here."""
RIGHT = 20
PLOT = WIDTH - LEFT - RIGHT


@dataclass(frozen=True)
class Series:
    """One training curve: (epoch seconds, value) points, oldest first, and where they came from."""

    label: str
    """What is measured, with its unit: `loss`, `tokens/s`."""
    points: tuple[tuple[float, float], ...]
    source: str = ""
    from_zero: bool = False
    """Draw the value axis from 0 (a rate), not from the lowest value (a loss)."""
    not_finite: tuple[tuple[float, str], ...] = ()
    """Where the value was not a number (epoch s, what: `loss nan at step 1200`): marked, not drawn."""


@dataclass(frozen=True)
class RunSeries:
    """What the drawing shows besides the report: the jobs' per-node step-time tables (oldest first;
    one per job today, the agent's last), and the program's loss and throughput where it reported them."""

    step_times: tuple[NodeStepTimes, ...] = ()
    loss: Series | None = None
    throughput: Series | None = None
    mfu: Series | None = None
    recorded: bool = False
    """Some job of the run kept a training series, whatever it held."""
    unread: tuple[str, ...] = ()
    """The jobs' series that could not be read, a sentence each (the curves leave them out)."""
    notes: tuple[str, ...] = ()
    """What else the curves leave out (a last line incomplete), a sentence each."""


SERIES_SOURCE = "the jobs' training series (RUN/jobs/<job>/training-series.jsonl, {points:,} points)"


def run_series(curves: TrainingCurves, step_times: Sequence[NodeStepTimes] = (), unread: Sequence[str] = (),
               notes: Sequence[str] = ()) -> RunSeries:
    """What the page draws of the run's training: its jobs' series joined (`training_curves.joined`), the
    per-node step-time tables, and what could not be read.  Throughput is tokens/s where the program
    reported tokens, else steps/s; MFU in percent."""
    source = SERIES_SOURCE.format(points=curves.points)
    loss = Series("loss", curves.loss, source, not_finite=tuple(
        (at, f"loss {value} at step {step}") for at, step, value in curves.not_finite_loss)) \
        if curves.loss or curves.not_finite_loss else None
    throughput = Series("tokens/s", curves.tokens_per_s, source, from_zero=True) if curves.tokens_per_s else \
        Series("steps/s", curves.steps_per_s, source, from_zero=True) if curves.steps_per_s else None
    mfu = Series("MFU (%)", tuple((t, 100 * v) for t, v in curves.mfu), source, from_zero=True) if curves.mfu else None
    return RunSeries(tuple(step_times), loss, throughput, mfu, recorded=curves.points > 0, unread=tuple(unread),
                     notes=tuple(notes))


def _text(value: object) -> str:
    """Outside text made safe for the page: one line (controls and bidirectional overrides written as
    visible escapes), then HTML-escaped, quotes included (it may land in an attribute)."""
    return html.escape(one_line(str(value)), quote=True)


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _number(value: float) -> str:
    """A value for an axis or a cell: three significant digits, k/M/G/T above a thousand."""
    if not math.isfinite(value):
        return str(value)
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


T = TypeVar("T")


def _thin(items: Sequence[T], limit: int) -> tuple[list[T], int]:
    """At most `limit` (2 or more) of `items`, evenly spread, the first and last kept; and how many were left out."""
    if len(items) <= max(limit, 2):
        return list(items), 0
    picks = sorted({round(i * (len(items) - 1) / (limit - 1)) for i in range(limit)})
    return [items[i] for i in picks], len(items) - len(picks)


def thin_curve(points: Sequence[tuple[float, float]], limit: int = CURVE_POINTS) -> list[tuple[float, float]]:
    """At most `limit` points of a curve: in each of limit/2 buckets (by position) its lowest and highest
    point, in time order, so a spike or a dip survives the thinning."""
    finite = [(t, v) for t, v in points if math.isfinite(t) and math.isfinite(v)]
    if len(finite) <= limit:
        return finite
    buckets = max(1, limit // 2)
    kept: list[tuple[float, float]] = []
    for b in range(buckets):
        chunk = finite[b * len(finite) // buckets:(b + 1) * len(finite) // buckets]
        if not chunk:
            continue
        low = min(range(len(chunk)), key=lambda i: chunk[i][1])
        high = max(range(len(chunk)), key=lambda i: chunk[i][1])
        kept += [chunk[i] for i in sorted({low, high})]
    return kept


# ---- the time axis ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Axis:
    start: float
    end: float

    def x(self, t: float) -> float:
        span = self.end - self.start
        return LEFT + PLOT * min(1.0, max(0.0, (t - self.start) / span))

    def inside(self, t: float | None) -> bool:
        return t is not None and self.start <= t <= self.end


_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)
"""Wall-clock tick steps (s): seconds, minutes and hours a clock face divides into, then days and a week."""
TIME_TICKS = 10
"""The most intervals the time axis is cut into (its labels stay apart at 1,000 px)."""


def time_ticks(start: float, end: float) -> tuple[float, list[float]]:
    """The time axis' step and ticks: the smallest clock step (_STEPS, or whole weeks beyond) that cuts
    [start, end] into at most TIME_TICKS intervals, and every multiple of it in UTC inside (round clock times:
    04:28:40, 04:28:42...; at a day or more, UTC midnights)."""
    span = max(end - start, 1e-9)
    step = float(next((s for s in _STEPS if span / s <= TIME_TICKS),
                      _STEPS[-1] * math.ceil(span / _STEPS[-1] / TIME_TICKS)))
    first = math.ceil(start / step)
    return step, [k * step for k in range(first, math.floor(end / step) + 1)]


def clock_label(t: float, step: float, previous: float | None) -> str:
    """A tick's UTC time, as precise as the step needs: `04:28:42`, `04:30`, `Nov 26`; the date leads
    when the day changed since the tick before."""
    when = datetime.fromtimestamp(t, UTC)
    if step >= 86400:
        return when.strftime("%b %d")
    clock = when.strftime("%H:%M:%S" if step < 60 else "%H:%M")
    new_day = previous is not None and datetime.fromtimestamp(previous, UTC).date() != when.date()
    return f"{when.strftime('%b %d')} {clock}" if new_day else clock


def _axis_svg(axis: _Axis, y: float, height: float) -> list[str]:
    """Gridlines over `height` from `y` at round UTC times, each labelled with its clock time."""
    step, ticks = time_ticks(axis.start, axis.end)
    out = []
    previous = None
    for t in ticks:
        x = axis.x(t)
        # The last label stays on the page, the first clear of the value axis' labels.
        anchor = "end" if x > WIDTH - RIGHT - 24 else "start" if x < LEFT + 24 else "middle"
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + height}" class="grid"/>')
        out.append(f'<text x="{x:.1f}" y="{y - 4}" text-anchor="{anchor}" class="tick">'
                   f"{clock_label(t, step, previous)}</text>")
        previous = t
    return out


def value_ticks(low: float, high: float, most: int = 5) -> list[float]:
    """3 to `most` round values (steps of 1, 2 or 5 times a power of ten) whose first is at or below `low`
    and last at or above `high`: a value axis' ticks, and so its range."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        raise ValueError(f"no axis from {low} to {high}")
    power = 10.0 ** math.floor(math.log10((high - low) / most))
    for step in (m * power * 10 ** e for e in (0, 1, 2) for m in (1, 2, 5)):
        if not math.isfinite(low / step) or not math.isfinite(high / step) or not math.isfinite(step):
            break
        first, last = math.floor(low / step), math.ceil(high / step)
        first -= first * step > low  # a quotient rounded (or underflowed) the wrong way
        last += last * step < high
        if last - first + 1 <= most:
            ticks = [k * step for k in range(first, last + 1)]
            if len(ticks) >= 3 and all(a < b for a, b in zip(ticks, ticks[1:])):
                return ticks
            break
    return [low, low + (high - low) / 2, high]  # beyond a float's precision: no round step to be had


def _time_domain(report: RunReport, now: float, extra: RunSeries = RunSeries()) -> _Axis | None:
    """From the first submission to the last end (now, while an attempt runs), or the newest point of a
    training curve when later (Slurm's end is a whole second, cut; the agent's last summary may follow it);
    None before any attempt."""
    # The journal's submission times, when there are any: Slurm's start times are whole seconds (cut),
    # so a start may read as before the submission.
    starts = [a.submitted_at for a in report.attempts if a.submitted_at] or [
        a.started_at for a in report.attempts if a.started_at]
    if not starts:
        return None
    ends = [a.ended_at if a.ended_at else now for a in report.attempts]
    ends += [max(t for t, _ in series.points) for series in (extra.loss, extra.throughput, extra.mfu)
             if series is not None and series.points]
    start = min(starts)
    end = max([*ends, start])
    return _Axis(start, end if end > start else start + 1.0)


# ---- the timeline ----------------------------------------------------------------------------
def _attempt_colour(a: AttemptReport) -> str:
    if a.ended_at is None:
        return RUNNING_COLOUR
    return COMPLETED_COLOUR if a.outcome == OutcomeKind.COMPLETED else ENDED_COLOUR


_XID = re.compile(r"\bxid\s*(\d+)", re.IGNORECASE)
_GPU = re.compile(r"\bgpu\s*(\d+)\b", re.IGNORECASE)


def fault_headline(node: str, reason: str) -> str:
    """A fault in a few words for its marker: `node2: Xid 79 on gpu3` where the reason names an Xid,
    else the node and the reason's first clause (the whole reason is in the list below the timeline)."""
    xid = _XID.search(reason)
    if xid is not None:
        gpu = _GPU.search(reason, xid.end())
        return f"{node}: Xid {xid.group(1)}" + (f" on gpu{gpu.group(1)}" if gpu else "")
    first = re.split(r"[;(]", reason, maxsplit=1)[0].strip()
    return f"{node}: {first[:40]}{'...' if len(first) > 40 else ''}" if first else node


@dataclass(frozen=True)
class _Mark:
    at: float
    kind: str  # fault, resubmit, restart, straggler, resume
    label: str
    detail: str
    evidence: tuple[str, ...] = ()


def _marks(report: RunReport) -> list[_Mark]:
    """Every fault, recovery, straggler and resume of the run, in time order."""
    marks: list[_Mark] = []
    by_number = {a.attempt: a for a in report.attempts}
    for a in report.attempts:
        for b in a.blame:
            marks.append(_Mark(a.ended_at or a.started_at or a.submitted_at or 0.0, "fault",
                               fault_headline(b.node, b.reason),
                               f"attempt {a.attempt} (job {a.job_id}) ended: {b.node} blamed: {b.reason}", b.evidence))
        after = by_number.get(a.attempt + 1)
        if after is not None and after.submitted_at:
            step = f" from step {a.checkpoint_step}" if a.checkpoint_step is not None else " from the start"
            marks.append(_Mark(after.submitted_at, "resubmit", f"resubmit{step}",
                               f"attempt {after.attempt} submitted as job {after.job_id}{step}"))
    for r in report.in_allocation:
        took = sum(seconds for _, seconds in r.phases)
        for b in r.blame:
            given = "given back to Slurm" if b.node in r.given_back else "kept in the job"
            marks.append(_Mark(r.at - took, "fault", fault_headline(b.node, b.reason),
                               f"job {r.job_id}: {b.node} blamed ({given}): {b.reason}", b.evidence))
        step = f"step {r.checkpoint_step}" if r.checkpoint_step is not None else "the start"
        why = "" if r.blame or not r.reason else f" ({r.reason})"
        smaller = (f", shrunk from {r.data_parallel_before} to {r.data_parallel_after} data-parallel replicas"
                   if r.shrank else "")
        marks.append(_Mark(r.at, "restart", f"restart {r.restart} in place",
                           f"job {r.job_id}: restart {r.restart} inside the allocation in {duration_text(took)}, "
                           f"from {step} on {' '.join(r.nodes)}{smaller}{why}", r.stacks))
    for s in report.stragglers:
        marks.append(_Mark(s.at, "straggler", f"{s.node} slow {s.ratio:.2f}x",
                           f"job {s.job_id}: straggler {s.node} ({s.action}): {s.ratio:.2f}x the job's compute time "
                           f"for {s.steps} steps from step {s.since_step}, {duration_text(s.lost_s)} lost when found",
                           (*s.evidence, *s.hardware, *((s.drain,) if s.drain else ()))))
    for resumed in report.resumes:
        marks.append(_Mark(resumed.at, "resume", f"resumed step {resumed.step}",
                           f"job {resumed.job_id}, restart {resumed.restart}: resumed from checkpoint step "
                           f"{resumed.step} ({', '.join(f'{n} node(s) from {t}' for t, n in resumed.tiers)})"))
    return sorted(marks, key=lambda m: m.at)


def _marker(kind: str, x: float, y: float, title: str) -> str:
    tip = f"<title>{_text(title)}</title>"
    if kind == "fault":  # a downward triangle, 14 px: big enough to have pixels of its own colour
        return (f'<polygon points="{x - 8:.1f},{y - 7} {x + 8:.1f},{y - 7} {x:.1f},{y + 8}" fill="{FAULT_COLOUR}" '
                f'class="fault">{tip}</polygon>')
    if kind in ("resubmit", "restart"):
        return f'<circle cx="{x:.1f}" cy="{y}" r="6" fill="{RECOVERY_COLOUR}" class="recovery">{tip}</circle>'
    if kind == "straggler":
        return (f'<polygon points="{x:.1f},{y - 7} {x + 7:.1f},{y} {x:.1f},{y + 7} {x - 7:.1f},{y}" '
                f'fill="{SLOW_COLOUR}" class="straggler">{tip}</polygon>')
    return f'<rect x="{x - 5:.1f}" y="{y - 5}" width="10" height="10" fill="{CHECKPOINT_COLOUR}">{tip}</rect>'


def _label(x: float, y: float, text: str, cls: str = "label") -> str:
    anchor = "end" if x > LEFT + PLOT - 140 else "start" if x < LEFT + 60 else "middle"
    return f'<text x="{x:.1f}" y="{y}" text-anchor="{anchor}" class="{cls}">{_text(text)}</text>'


def _on_nodes(a: AttemptReport) -> str:
    """` on node[1-3] (spares: node4)`: where the attempt ran, for its bar's tip ("" when not known)."""
    if a.nodes is None:
        return ""
    _, _, _, _, _, _, nodes, spares = attempt_cells(a)
    return f" on {nodes}" + (f" (spares: {spares})" if a.nodes.spares else "")


def timeline_svg(report: RunReport, axis: _Axis) -> str:
    """Attempts (queued, then running, coloured by how they ended), the time lost under them, the
    faults and recoveries, and the checkpoints written, on one time axis."""
    lanes = {"attempts": 40, "lost": 74, "marks": 104, "checkpoints": 176}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="206" class="timeline" '
           'role="img" aria-label="timeline of the run">']
    out += _axis_svg(axis, 22, 170)
    for lane, text in (("attempts", "attempts"), ("lost", "time lost"), ("marks", "faults, recoveries"),
                       ("checkpoints", "checkpoints")):
        out.append(f'<text x="8" y="{lanes[lane] + 4}" class="lane">{text}</text>')
    y = lanes["attempts"]
    for a in report.attempts:
        submitted = a.submitted_at or a.started_at
        if submitted is None:
            continue
        end = a.ended_at if a.ended_at else axis.end
        began = a.started_at or end
        x0, x1, x2 = axis.x(submitted), axis.x(began), axis.x(end)
        what = "running" if a.ended_at is None else f"{a.state}, {a.outcome}" if a.outcome else a.state
        tip = (f"attempt {a.attempt}, job {a.job_id}: {what}; queued {duration_text(max(0.0, began - submitted))}, "
               f"ran {duration_text(end - began) if a.started_at else '-'}{_on_nodes(a)}")
        if x1 > x0:
            out.append(f'<rect x="{x0:.1f}" y="{y - 11}" width="{x1 - x0:.1f}" height="22" fill="{QUEUE_COLOUR}">'
                       f"<title>{_text(tip)}</title></rect>")
        if a.started_at and x2 > x1:
            out.append(f'<rect x="{x1:.1f}" y="{y - 11}" width="{max(1.0, x2 - x1):.1f}" height="22" '
                       f'fill="{_attempt_colour(a)}" class="attempt"><title>{_text(tip)}</title></rect>')
            name = f"attempt {a.attempt} · job {a.job_id}" if x2 - x1 > 130 else f"{a.attempt}"
            if x2 - x1 > 14:
                out.append(f'<text x="{(x1 + x2) / 2:.1f}" y="{y + 4}" text-anchor="middle" class="on-bar">'
                           f"{_text(name)}</text>")
    y = lanes["lost"]
    colours = {LOST_QUEUE: QUEUE_COLOUR, LOST_REDONE: REDONE_COLOUR, LOST_RESTART: RESTART_COLOUR}
    spans, left_out = _thin(sorted(report.lost, key=lambda s: s.start), TIMELINE_MARKS)
    for span in spans:
        x0, x1 = axis.x(span.start), axis.x(span.end)
        out.append(f'<rect x="{x0:.1f}" y="{y - 6}" width="{max(1.0, x1 - x0):.1f}" height="12" '
                   f'fill="{colours.get(span.cause, RESTART_COLOUR)}"><title>{_text(span.cause)}: '
                   f"{_text(duration_text(span.seconds))}</title></rect>")
    notes = [f"{left_out} more spans of lost time not drawn"] if left_out else []
    y = lanes["marks"]
    marks = [m for m in _marks(report) if axis.inside(m.at)]
    shown, left_out = _thin(marks, TIMELINE_MARKS)
    notes += [f"{left_out} more faults and recoveries not drawn (see the list below)"] if left_out else []
    labelled = {id(m) for m in _thin([m for m in shown if m.kind == "fault"], TIMELINE_LABELS // 2)[0]}
    labelled |= {id(m) for m in _thin([m for m in shown if m.kind != "fault"], TIMELINE_LABELS // 2)[0]}
    rows = {"fault": 0, "resubmit": 1, "restart": 1, "straggler": 2, "resume": 2}
    for m in shown:
        x = axis.x(m.at)
        out.append(_marker(m.kind, x, y, m.detail))
        if id(m) in labelled:
            out.append(_label(x, y + 24 + 14 * rows[m.kind], m.label,
                              "label fault-label" if m.kind == "fault" else "label"))
    y = lanes["checkpoints"]
    written = [c for c in report.checkpoints if axis.inside(c.written_at)]
    shown_checkpoints, left_out = _thin(written, TIMELINE_MARKS)
    notes += [f"{left_out} more checkpoints not drawn"] if left_out else []
    labels = {id(c) for c in _thin(shown_checkpoints, TIMELINE_LABELS)[0]}
    for c in shown_checkpoints:
        x = axis.x(c.written_at or 0.0)
        out.append(f'<rect x="{x - 4:.1f}" y="{y - 4}" width="8" height="8" fill="{CHECKPOINT_COLOUR}" '
                   f'transform="rotate(45 {x:.1f} {y})"><title>checkpoint step {c.step}: {_text(c.where)}'
                   f"</title></rect>")
        if id(c) in labels:
            out.append(f'<text x="{x:.1f}" y="{y - 9}" text-anchor="middle" class="tick">{c.step}</text>')
    out.append("</svg>")
    out += [f'<p class="note">{_text(note)}</p>' for note in notes]
    return "\n".join(out)


def _legend(items: Iterable[tuple[str, str]]) -> str:
    return '<p class="legend">' + " ".join(
        f'<span><i style="background:{colour}"></i>{_text(name)}</span>' for colour, name in items) + "</p>"


# ---- lost time by cause ----------------------------------------------------------------------
def lost_time_html(report: RunReport) -> str:
    """The run's wall time as one bar, productive first, then each cause of lost time, with a table."""
    g = report.goodput
    parts = [("productive", g.productive_seconds, PRODUCTIVE_COLOUR),
             ("work redone after failures", g.redone_seconds, REDONE_COLOUR),
             ("queue", g.queue_seconds, QUEUE_COLOUR),
             ("restarts", g.restart_overhead_seconds, RESTART_COLOUR),
             ("slow nodes", g.slow_node_seconds, SLOW_COLOUR)]
    if g.reduced_capacity_seconds > 0:
        parts.append(("capacity lost running smaller", g.reduced_capacity_seconds, SLOW_COLOUR))
    total = max(g.wall_seconds, sum(seconds for _, seconds, _ in parts))
    share = f"{g.goodput * 100:.1f}%" if g.goodput is not None else "-"
    out = ["<h2>Time lost, by cause</h2>",
           f'<p>goodput <b>{share}</b>: productive {duration_text(g.productive_seconds)} of '
           f"{duration_text(g.wall_seconds)} wall time; lost time "
           f"{duration_text(g.redone_seconds + g.queue_seconds + g.restart_overhead_seconds + g.slow_node_seconds + g.reduced_capacity_seconds)}; "
           f"node failures {g.node_failures}</p>",
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="30" class="lost-bar" role="img" '
           'aria-label="the wall time by cause">']
    x = 0.0
    for name, seconds, colour in parts:
        if total <= 0 or seconds <= 0:
            continue
        w = (WIDTH - RIGHT) * seconds / total
        out.append(f'<rect x="{x:.1f}" y="2" width="{w:.1f}" height="26" fill="{colour}"><title>{name}: '
                   f"{duration_text(seconds)}</title></rect>")
        x += w
    out.append("</svg>")
    out.append('<table class="lost"><tr><th></th><th>cause</th><th>time</th><th>of the wall time</th></tr>')
    for name, seconds, colour in parts:
        of_wall = f"{seconds / g.wall_seconds * 100:.1f}%" if g.wall_seconds > 0 else "-"
        out.append(f'<tr><td><i style="background:{colour}"></i></td><td>{name}</td>'
                   f"<td>{duration_text(seconds)}</td><td>{of_wall}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


# ---- curves ----------------------------------------------------------------------------------
def _during(a: AttemptReport, t: float | None) -> bool:
    """`t` falls while attempt `a` ran.  Slurm's times are whole seconds (cut, not rounded): a checkpoint
    written in the attempt's last second reads as after its end."""
    return bool(t and a.started_at and a.started_at <= t < (a.ended_at + 1.0 if a.ended_at else math.inf))


def progress_series(report: RunReport) -> Series:
    """The step reached over time, as the checkpoints say: each attempt starts from the step it resumed
    (0 for the first), then each complete checkpoint it wrote."""
    points: list[tuple[float, float]] = []
    resume = 0
    for a in report.attempts:
        if a.started_at:
            points.append((a.started_at, float(resume)))
        points += [(c.written_at, float(c.step)) for c in report.checkpoints if c.written_at and _during(a, c.written_at)]
        resume = a.checkpoint_step if a.checkpoint_step is not None else resume
    return Series("step", tuple(sorted(points)), "the complete checkpoints")


def checkpoint_rate_series(report: RunReport) -> Series:
    """Steps per second between consecutive checkpoints of the same attempt (at the later one)."""
    points: list[tuple[float, float]] = []
    for a in report.attempts:
        if not a.started_at:
            continue
        own = sorted((c.written_at, c.step) for c in report.checkpoints if c.written_at and _during(a, c.written_at))
        for (t0, s0), (t1, s1) in zip(own, own[1:]):
            if t1 > t0 and s1 > s0:
                points.append((t1, (s1 - s0) / (t1 - t0)))
    return Series("steps/s", tuple(points), "the steps between consecutive checkpoints of an attempt, over the "
                  "time between them", from_zero=True)


def _pieces(points: Sequence[tuple[float, float]], breaks: Sequence[float]) -> list[list[tuple[float, float]]]:
    """The points cut where an attempt ended or a step restarted between two of them: no line joins two
    jobs, or the two sides of a restart."""
    pieces: list[list[tuple[float, float]]] = []
    for t, v in points:
        if not pieces or any(pieces[-1][-1][0] < b < t for b in breaks):
            pieces.append([])
        pieces[-1].append((t, v))
    return pieces


@dataclass(frozen=True)
class _Lines:
    """The vertical lines every curve carries: faults, and the recoveries after them (epoch s, what)."""

    faults: tuple[tuple[float, str], ...]
    recoveries: tuple[tuple[float, str], ...]
    breaks: tuple[float, ...]


def _lines(report: RunReport, axis: _Axis) -> _Lines:
    """The faults and the recoveries (resubmissions, restarts inside the allocation) of the run, at most one
    of a kind per pixel and TIMELINE_MARKS of a kind; and where a curve's line is broken."""
    def spread(kinds: tuple[str, ...]) -> tuple[tuple[float, str], ...]:
        by_pixel: dict[int, tuple[float, str]] = {}
        for m in marks:
            if m.kind in kinds:
                by_pixel.setdefault(round(axis.x(m.at)), (m.at, m.detail))
        return tuple(_thin(sorted(by_pixel.values()), TIMELINE_MARKS)[0])

    marks = [m for m in _marks(report) if axis.inside(m.at)]
    # An attempt's end, a second on: Slurm's whole seconds (see _during); a restart inside the allocation.
    breaks = [a.ended_at + 1.0 for a in report.attempts if a.ended_at]
    breaks += [r.at for r in report.in_allocation]
    return _Lines(spread(("fault",)), spread(("resubmit", "restart")), tuple(sorted(breaks)))


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """The value axis' labels: three significant digits and k/M/G/T (`_number`), more digits where that
    would print two ticks alike (a curve that barely moves)."""
    labels = [_number(v) for v in ticks]
    digits = 4
    while len(set(labels)) < len(labels) and digits <= 17:
        labels = [f"{v:.{digits}g}" for v in ticks]
        digits += 1
    return labels


def _curve_svg(series: Series, axis: _Axis, lines: _Lines, height: int = 120) -> str:
    points = thin_curve([(t, v) for t, v in series.points if axis.inside(t)]) or [(axis.start, 0.0)]
    top, bottom = 14, height - 18
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" class="curve" role="img" '
           f'aria-label="{_text(series.label)} over time">',
           f'<text x="8" y="{top + 10}" class="lane">{_text(series.label)}</text>']
    out += _axis_svg(axis, top, bottom - top)
    for kind, marked in (("fault-line", lines.faults), ("recovery-line", lines.recoveries)):
        for t, _ in marked:
            x = math.floor(axis.x(t)) + 0.5  # a pixel's middle: a 1-pixel line in its own colour, not two half-tones
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="{kind}"/>')
    lowest = min(v for _, v in points)
    highest = max(v for _, v in points)
    low, high = (min(0.0, lowest) if series.from_zero else lowest), highest
    if high - low < 1e-12 * max(1.0, abs(high)):
        low, high = low - max(1.0, abs(low) / 10), high + max(1.0, abs(high) / 10)
    ticks = value_ticks(low, high)
    low, high = ticks[0], ticks[-1]

    def y(v: float) -> float:
        return bottom - (bottom - top) * (v - low) / (high - low)

    if series.points:
        out[1] = out[1].replace("</text>", f"<title>{_text(series.label)}: {_number(lowest)} to {_number(highest)} "
                                           "over the time shown</title></text>")
    for v, label in zip(ticks, tick_labels(ticks)):
        out.append(f'<line x1="{LEFT}" y1="{y(v):.1f}" x2="{LEFT + PLOT}" y2="{y(v):.1f}" class="grid"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 3.5:.1f}" text-anchor="end" class="tick">{label}</text>')
    for piece in _pieces(points, lines.breaks) if series.points else []:
        path = " ".join(f"{axis.x(t):.1f},{y(v):.1f}" for t, v in piece)
        out.append(f'<polyline points="{path}" fill="none" stroke="{CURVE_COLOUR}" stroke-width="1.8"/>')
        if len(piece) == 1 and len(points) > 60:  # a piece of one point draws no line: a dot
            out.append(f'<circle cx="{axis.x(piece[0][0]):.1f}" cy="{y(piece[0][1]):.1f}" r="2" fill="{CURVE_COLOUR}"/>')
    if series.points and len(points) <= 60:
        out += [f'<circle cx="{axis.x(t):.1f}" cy="{y(v):.1f}" r="2.5" fill="{CURVE_COLOUR}">'
                f"<title>{_text(series.label)} {_number(v)} at +{duration_text(t - axis.start)}</title></circle>"
                for t, v in points]
    for t, what in _thin([(t, w) for t, w in series.not_finite if axis.inside(t)], TIMELINE_MARKS)[0]:
        out.append(f'<text x="{axis.x(t):.1f}" y="{top + 8}" text-anchor="middle" class="not-finite">NaN'
                   f"<title>{_text(what)} at +{duration_text(t - axis.start)}</title></text>")
    out.append("</svg>")
    return "\n".join(out)


NO_SERIES = ("no training curves: none of the run's jobs kept a training series (the job's agent appends one, "
             "RUN/jobs/<job>/training-series.jsonl, while the program reports its loss or throughput through "
             "clusterctl.progress.beat; a run made by an older clusterctl, a job without the agent, or a program "
             "that reports none of it has none)")


def curves_html(report: RunReport, axis: _Axis, extra: RunSeries) -> str:
    """The loss, the throughput (tokens/s), MFU and the step reached, on the timeline's axis, a dashed line
    at each fault and each recovery; a sentence for each curve there is not, saying why."""
    lines = _lines(report, axis)
    out = ["<h2>Training curves</h2>"]
    out += [f'<p class="warning">warning: {_text(problem)}</p>' for problem in extra.unread]
    out += [f'<p class="note">{_text(note)}</p>' for note in extra.notes]
    recorded = extra.recorded or any(s is not None for s in (extra.loss, extra.throughput, extra.mfu))
    if not recorded and not extra.unread:  # (a series that could not be read is said above)
        out.append(f'<p class="missing">{_text(NO_SERIES)}</p>')
    panels: list[tuple[Series | None, str]] = [
        (extra.loss, "loss: the program reported no loss (clusterctl.progress.beat(step, loss=...))"),
        (extra.throughput, ""),
        (extra.mfu, "MFU: not known (the program reported no FLOPs, or the GPUs' peak is unknown: "
                    "`clusterctl status` says which; set [job] gpu_peak_tflops in the spec)"),
        (progress_series(report), "step: no complete checkpoint with a time yet"),
    ]
    if not recorded:
        panels = panels[1:2] + panels[3:]
    if extra.throughput is None:
        rate = checkpoint_rate_series(report)
        panels[1 if recorded else 0] = (
            rate, "throughput: not measured (no tokens/s or steps/s from the program, and fewer than two "
                  "checkpoints in one attempt to measure steps/s)")
        out.append('<p class="note">throughput: the program reported no tokens/s; steps/s measured between '
                   "consecutive checkpoints instead</p>")
    drawn = [(series, missing, series is not None and any(
        axis.inside(t) for t, _ in (*series.points, *series.not_finite))) for series, missing in panels]
    labels: list[str] = []  # the panels drawn since their source was last said: said once under them
    for i, (series, missing, shown) in enumerate(drawn):
        if series is None or not shown:
            out.append(f'<p class="missing">{_text(missing)}</p>')
            continue
        out.append(_curve_svg(series, axis, lines))
        labels.append(series.label)
        following = drawn[i + 1] if i + 1 < len(drawn) else None
        if following is None or not following[2] or following[0] is None or following[0].source != series.source:
            if series.source:
                out.append(f'<p class="note">{_text(", ".join(labels))}: from {_text(series.source)}</p>')
            labels = []
    if lines.faults or lines.recoveries:
        out.append(_legend([(FAULT_COLOUR, "dashed: a fault"), (RECOVERY_COLOUR, "dashed: a resubmission or restart")])
                   .replace("</p>", " <span>a gap in a curve: nothing measured (queued, restarting)</span></p>"))
    return "\n".join(out)


# ---- the heat map ----------------------------------------------------------------------------
_STOPS = ((0.9, (0xde, 0xeb, 0xf7)), (1.0, (0xf7, 0xf7, 0xf7)), (1.1, (0xfe, 0xe0, 0x8b)), (1.2, (0xfd, 0xae, 0x61)),
          (1.35, (0xf4, 0x6d, 0x43)), (1.5, (0xa5, 0x00, 0x26)))


def heat_colour(ratio: float) -> str:
    """A node's step time over the job's, as a colour: pale blue faster, near-white at 1.0, then yellow,
    orange and deep red from 1.5 times on."""
    rgb: tuple[int, ...] = _STOPS[0][1] if ratio <= _STOPS[0][0] else _STOPS[-1][1]
    for (r0, c0), (r1, c1) in zip(_STOPS, _STOPS[1:]):
        if r0 < ratio <= r1:
            rgb = tuple(round(a + (b - a) * (ratio - r0) / (r1 - r0)) for a, b in zip(c0, c1))
    return "#" + "".join(f"{c:02x}" for c in rgb)


_STATE_RANK = {"ok": 0, "slow": 1, "straggler": 2}


@dataclass(frozen=True)
class _Column:
    label: str
    detail: str
    cells: dict[str, NodeStepTime]


def _columns(tables: Sequence[NodeStepTimes]) -> tuple[list[_Column], bool]:
    """One column per table; beyond HEAT_MAP_COLUMNS, tables merged by time (each node's slowest)."""
    ordered = sorted(tables, key=lambda t: t.at)
    if len(ordered) <= HEAT_MAP_COLUMNS:
        return [_Column(f"job {t.job_id}", f"job {t.job_id} at step {t.step}: reference "
                        f"{t.reference if t.reference is not None else '-'} s/step, {duration_text(t.lost_s)} lost",
                        {n.node: n for n in t.nodes}) for t in ordered], False
    columns = []
    for b in range(HEAT_MAP_COLUMNS):
        chunk = ordered[b * len(ordered) // HEAT_MAP_COLUMNS:(b + 1) * len(ordered) // HEAT_MAP_COLUMNS]
        if not chunk:
            continue
        cells: dict[str, NodeStepTime] = {}
        for table in chunk:
            for n in table.nodes:
                had = cells.get(n.node)
                if had is None or (n.ratio or 0.0, _STATE_RANK[n.state]) > (had.ratio or 0.0, _STATE_RANK[had.state]):
                    cells[n.node] = n
        jobs = sorted({t.job_id for t in chunk})
        columns.append(_Column(f"{len(chunk)} tables", f"{len(chunk)} tables of job(s) {', '.join(jobs[:5])}"
                               f"{'...' if len(jobs) > 5 else ''}, each node's slowest", cells))
    return columns, True


def _percentile(values: Sequence[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def heat_map_html(tables: Sequence[NodeStepTimes]) -> str:
    """Nodes down, step-time tables across, each cell the node's step time over the job's: a straggler
    is the dark row.  Past HEAT_MAP_NODES nodes, the SLOWEST_NODES slowest get a row and the percentile
    rows (BANDS) summarise every node."""
    out = ["<h2>Step time per node</h2>"]
    if not tables:
        out.append('<p class="missing">no per-node step times recorded (the job\'s agent writes them in '
                   "RUN/jobs/&lt;job&gt;/step_times.json once it compares the nodes' steps; the program must call "
                   "clusterctl.progress.beat)</p>")
        return "\n".join(out)
    columns, merged = _columns(tables)
    nodes = sorted({name for c in columns for name in c.cells}, key=natural_order)

    def worst(name: str) -> tuple[float, int]:
        cells = [c.cells[name] for c in columns if name in c.cells]
        return (max((n.ratio or 0.0) for n in cells), max(_STATE_RANK[n.state] for n in cells))

    rows: list[tuple[str, bool, list[NodeStepTime | float | None]]] = []
    notes = []
    if len(nodes) <= HEAT_MAP_NODES:
        rows = [(name, False, [c.cells.get(name) for c in columns]) for name in nodes]
    else:
        slowest = sorted(nodes, key=lambda name: (worst(name)[1], worst(name)[0]), reverse=True)[:SLOWEST_NODES]
        rows = [(name, False, [c.cells.get(name) for c in columns]) for name in slowest]
        for q in BANDS:
            band: list[NodeStepTime | float | None] = []
            for c in columns:
                ratios = [n.ratio for n in c.cells.values() if n.ratio is not None]
                band.append(_percentile(ratios, q) if ratios else None)
            rows.append((f"p{q} of {len(nodes):,} nodes", True, band))
        notes.append(f"{len(nodes):,} nodes: the {SLOWEST_NODES} slowest have a row each; every node is in the "
                     f"percentile rows (p{', p'.join(str(q) for q in BANDS)} of each column's ratios)")
    if merged:
        notes.append(f"{len(tables):,} step-time tables merged into {len(columns)} columns by time "
                     "(each node's slowest in each)")
    cell_w = max(10.0, min(90.0, PLOT / len(columns)))
    cell_h = 18
    top = 22
    height = top + cell_h * len(rows) + 10
    out.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" class="heat" role="img" '
               'aria-label="step time per node">')
    for i, column in enumerate(columns):
        x = LEFT + i * cell_w
        if cell_w >= 40 or i == 0 or i == len(columns) - 1:
            out.append(f'<text x="{x + cell_w / 2:.1f}" y="{top - 6}" text-anchor="middle" class="tick">'
                       f"{_text(column.label)}<title>{_text(column.detail)}</title></text>")
    for r, (name, is_band, cells) in enumerate(rows):
        y = top + r * cell_h
        out.append(f'<text x="{LEFT - 6}" y="{y + 13}" text-anchor="end" class="{"band" if is_band else "node"}">'
                   f"{_text(name)}</text>")
        for i, cell in enumerate(cells):
            x = LEFT + i * cell_w
            ratio = cell.ratio if isinstance(cell, NodeStepTime) else cell
            fill = heat_colour(ratio) if ratio is not None else "#eeeeee"
            state = cell.state if isinstance(cell, NodeStepTime) else ""
            stroke = ' stroke="#000" stroke-width="2"' if state == "straggler" else (
                ' stroke="#555" stroke-dasharray="3 2"' if state == "slow" else ' stroke="#fff"')
            if isinstance(cell, NodeStepTime):
                seconds = f"{cell.seconds:.4g} s/step" if cell.seconds is not None else "not measured"
                tip = f"{name} in {columns[i].label}: {seconds}, {f'{ratio:.2f}x' if ratio else '-'}, {state}"
            else:
                tip = f"{name} in {columns[i].label}: {f'{ratio:.2f}x' if ratio is not None else 'no data'}"
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{cell_w:.1f}" height="{cell_h}" fill="{fill}"{stroke}>'
                       f"<title>{_text(tip)}</title></rect>")
            if ratio is not None and cell_w >= 40:
                dark = ratio >= 1.3
                out.append(f'<text x="{x + cell_w / 2:.1f}" y="{y + 13}" text-anchor="middle" '
                           f'class="{"cell-dark" if dark else "cell"}">{ratio:.2f}x</text>')
    out.append("</svg>")
    out.append(_legend([(heat_colour(r), f"{r:.1f}x") for r in (0.9, 1.0, 1.1, 1.2, 1.35, 1.5)]
                       + [("#eeeeee", "not measured")])
               .replace("</p>", " <span>black border: straggler; dashed: slow, not yet a straggler</span></p>"))
    out += [f'<p class="note">{_text(note)}</p>' for note in notes]
    return "\n".join(out)


# ---- what happened, in words -----------------------------------------------------------------
def _events(report: RunReport) -> list[tuple[float, str, str, tuple[str, ...]]]:
    """(when, what, detail, evidence): every attempt's submission and end, and every mark, in time order."""
    lines: list[tuple[float, str, str, tuple[str, ...]]] = []
    for a in report.attempts:
        if a.submitted_at and a.attempt == 1:
            lines.append((a.submitted_at, "submitted", f"attempt {a.attempt} as job {a.job_id}", ()))
        if a.ended_at is not None:
            step = f"; newest complete checkpoint: step {a.checkpoint_step}" if a.checkpoint_step is not None else ""
            lines.append((a.ended_at, "ended", f"attempt {a.attempt} (job {a.job_id}) {a.state}: {a.message}{step}; "
                                               f"decision: {a.action}", ()))
    lines += [(m.at, m.kind, m.detail, m.evidence) for m in _marks(report)]
    return sorted(lines, key=lambda line: line[0])


def events_html(report: RunReport, start: float) -> str:
    """What happened, one line each, time from the run's first submission."""
    lines = _events(report)
    shown, left_out = _thin(lines, EVENT_LINES)
    out = ["<h2>What happened</h2>", '<table class="events"><tr><th>when</th><th>what</th><th></th></tr>']
    for at, what, detail, evidence in shown:
        more = "".join(f"<br><span class=\"evidence\">{_text(line)}</span>" for line in evidence[:EVIDENCE_LINES])
        if len(evidence) > EVIDENCE_LINES:
            more += f'<br><span class="evidence">({len(evidence) - EVIDENCE_LINES} more lines of evidence)</span>'
        out.append(f'<tr class="{_text(what)}"><td>+{duration_text(max(0.0, at - start))}</td><td>{_text(what)}</td>'
                   f"<td>{_text(detail)}{more}</td></tr>")
    out.append("</table>")
    if left_out:
        out.append(f'<p class="note">{left_out} more lines not shown: `clusterctl report RUN` lists every one</p>')
    return "\n".join(out)


def _attempts_table(report: RunReport) -> str:
    out = ['<table class="attempts"><tr><th>attempt</th><th>job</th><th>ended</th><th>outcome</th>'
           "<th>queued</th><th>ran</th><th>checkpoint</th><th>decision</th><th>nodes</th><th>spares</th></tr>"]
    for a in report.attempts:
        # Slurm's times are whole seconds, the journal's submission is not: a start may read as before it.
        queued = duration_text(max(0.0, a.started_at - a.submitted_at)) if a.started_at and a.submitted_at else "-"
        ran = duration_text(a.ended_at - a.started_at) if a.started_at and a.ended_at else "-"
        number, job, state, outcome, checkpoint, decision, nodes, spares = attempt_cells(a)
        cells = (number, job, state, outcome, queued, ran, checkpoint, decision, nodes, spares)
        out.append("<tr>" + "".join(f"<td>{_text(cell)}</td>" for cell in cells) + "</tr>")
    out.append("</table>")
    out += [f'<p class="{_text(style) or "plain"}">{_text(text)}</p>' for text, style in experiment_lines(report.experiment)]
    return "\n".join(out)


_CSS = """
body { font: 13px/1.4 system-ui, "DejaVu Sans", sans-serif; color: #222; background: #fff; margin: 0; }
main { width: 1000px; margin: 16px auto; }
h1 { font-size: 18px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 22px 0 6px; }
.state { font-weight: bold; } .sub { color: #555; margin: 0 0 8px; }
.warning { background: #fff3cd; padding: 4px 8px; }
svg text { font: 11px system-ui, "DejaVu Sans", sans-serif; fill: #333; }
svg .lane { font-weight: bold; } svg .tick { fill: #777; font-size: 10px; }
svg .label { font-size: 11px; } svg .fault-label { fill: #a11; font-weight: bold; }
svg .on-bar { fill: #fff; font-weight: bold; } svg .cell { font-size: 10px; fill: #333; }
svg .cell-dark { font-size: 10px; fill: #fff; } svg .band { font-style: italic; }
.grid { stroke: #eee; } .fault-line { stroke: #d62728; stroke-dasharray: 4 3; }
.recovery-line { stroke: #6a51a3; stroke-dasharray: 2 3; } svg .not-finite { fill: #d62728; font-weight: bold; }
table { border-collapse: collapse; } .events td:first-child { white-space: nowrap; } td, th { padding: 2px 10px 2px 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: normal; border-bottom: 1px solid #ddd; }
tr.fault td { color: #a11; } .evidence { color: #666; font-size: 12px; }
.note, .dim { color: #666; font-size: 12px; margin: 2px 0; } .missing { color: #777; font-style: italic; }
.yellow { color: #8a6d00; } p { margin: 4px 0; }
.legend span { margin-right: 14px; white-space: nowrap; font-size: 12px; }
i { display: inline-block; width: 11px; height: 11px; margin-right: 4px; vertical-align: -1px; }
footer { color: #888; font-size: 11px; margin-top: 24px; border-top: 1px solid #eee; padding-top: 6px; }
"""


def _exclusion_text(report: RunReport) -> str:
    """Which nodes the run avoids: a running run's as of now (its next submission), an ended run's as they were
    when it ended (a fact of the record: the page of a finished run reads the same on any later day)."""
    if report.excluded_when_ended is not None:
        nodes = report.excluded_when_ended
        return f"; excluded when the run ended: {_text(', '.join(nodes))}" if nodes else ""
    return f"; excluded from the next submission: {_text(', '.join(report.excluded_now))}" if report.excluded_now else ""


def report_html(report: RunReport, now: float, extra: RunSeries = RunSeries()) -> str:
    """The run drawn as one self-contained HTML page (inline SVG and CSS; no script, nothing fetched):
    its timeline, the time lost by cause, the training curves, the per-node step-time heat map, its
    attempts and what happened.  `now`: when it is drawn (a running attempt runs until then)."""
    g = report.goodput
    name = report.run.name or str(report.run)
    axis = _time_domain(report, now, extra)
    share = f"{g.goodput * 100:.1f}%" if g.goodput is not None else "-"
    limit = f" of {report.max_restarts}" if report.max_restarts is not None else ""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           # The page fetches nothing and runs nothing, whoever opens it: say so to the browser too.
           "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
           f"<title>clusterctl report: {_text(name)}</title>", f"<style>{_CSS}</style></head><body><main>",
           f'<h1>run {_text(name)} <span class="state">{_text(report.state)}</span></h1>',
           f'<p class="sub">{_text(report.run)}{" · " + _text(report.message) if report.message else ""}</p>',
           f"<p>{len(report.attempts)} attempt(s); restarts used {report.restarts_used}{limit}; goodput "
           f"<b>{share}</b>; {len(report.checkpoints)} complete checkpoint(s)"
           + (f", the newest step {report.checkpoints[-1].step}" if report.checkpoints else "")
           + _exclusion_text(report) + "</p>"]
    out += [f'<p class="warning">warning: {_text(w)}</p>' for w in report.journal_warnings]
    if axis is None:
        out.append('<p class="missing">nothing to draw yet: no attempt has been submitted</p>')
    else:
        out.append(f"<h2>Timeline</h2><p class=\"note\">times in UTC; the first submission at {_utc(axis.start)}; "
                   f"hover a mark for its details</p>")
        out.append(timeline_svg(report, axis))
        out.append(_legend([(COMPLETED_COLOUR, "attempt completed"), (ENDED_COLOUR, "attempt ended otherwise"),
                            (RUNNING_COLOUR, "running"), (QUEUE_COLOUR, "queued"),
                            (REDONE_COLOUR, "work redone"), (RESTART_COLOUR, "restarting"),
                            (FAULT_COLOUR, "fault (node blamed)"), (RECOVERY_COLOUR, "resubmit or restart"),
                            (SLOW_COLOUR, "straggler"), (CHECKPOINT_COLOUR, "checkpoint")]))
    out.append(lost_time_html(report))
    if axis is not None:
        out.append(curves_html(report, axis, extra))
    out.append(heat_map_html(extra.step_times))
    out.append("<h2>Attempts</h2>")
    out.append(_attempts_table(report))
    if axis is not None:
        out.append(events_html(report, axis.start))
    skipped = [f"{s.path}: {s.why}" for s in report.skipped]
    if skipped:
        out.append("<h2>Checkpoints skipped</h2>")
        out += [f'<p class="dim">{_text(line)}</p>' for line in _thin(skipped, EVENT_LINES)[0]]
    out.append(f"<footer>drawn by clusterctl {_text(__version__)} at {_utc(now)} from {_text(report.run)}; "
               "no script, nothing fetched; again with <code>clusterctl report RUN --html FILE</code></footer>")
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"
