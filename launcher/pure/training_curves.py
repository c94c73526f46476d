"""A job's training series thinned to curves a page can hold: loss, tokens/s, steps/s, MFU.  (pure)

The agent appends a point per summary interval to the job's series (clusterctl.records.training_series):
a job of weeks at 10 s holds a quarter of a million.  `thin_series` folds them, one at a time and in
bounded memory, into at most `limit` points per curve: the points are cut into buckets of equal count
and each bucket keeps its lowest and its highest point, in time order, so a spike of the loss or a dip
of the throughput survives however long the series.  A curve's buckets double in width as the series
grows (adjacent buckets merged), so the fold never holds more than `limit` points of a curve.

A loss that went NaN or infinite cannot be drawn as a value: it is counted, and the first
NOT_FINITE_KEPT of them kept (when, at which step) for the page to mark.

Nothing here reads a file: the caller passes the points (`TrainingSeriesReader` streams them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clusterctl.records.training_series import TrainingPoint

CURVE_LIMIT = 1000
"""Points kept per curve of one job's series."""
NOT_FINITE_KEPT = 20

Point = tuple[float, float]
"""(epoch seconds, value)."""


class _Thinner:
    """One curve's fold: buckets of `width` points, each its lowest and highest; at most `limit` points."""

    __slots__ = ("buckets", "width", "closed", "count", "low", "high")

    def __init__(self, limit: int) -> None:
        self.buckets = max(2, limit // 4 * 2)  # even: merging pairs leaves no bucket of the old width
        self.width = 1
        self.closed: list[tuple[Point, Point]] = []
        self.count = 0
        self.low: Point = (0.0, 0.0)
        self.high: Point = (0.0, 0.0)

    def add(self, at: float, value: float) -> None:
        if self.count == self.width:
            self.closed.append((self.low, self.high))
            self.count = 0
            if len(self.closed) == self.buckets:
                pairs = zip(self.closed[::2], self.closed[1::2])
                self.closed = [(a[0] if a[0][1] <= b[0][1] else b[0], a[1] if a[1][1] >= b[1][1] else b[1])
                               for a, b in pairs]
                self.width *= 2
        if self.count == 0:
            self.low = self.high = (at, value)
        elif value < self.low[1]:
            self.low = (at, value)
        elif value > self.high[1]:
            self.high = (at, value)
        self.count += 1

    def points(self) -> tuple[Point, ...]:
        buckets = self.closed + ([(self.low, self.high)] if self.count else [])
        kept: list[Point] = []
        for low, high in buckets:
            kept += [low] if low == high else sorted((low, high))
        return tuple(kept)


@dataclass(frozen=True)
class TrainingCurves:
    """What a series (one job's, or a run's jobs' joined) holds, thinned: each curve at most its limit of
    (epoch s, value) points in time order (a figure never reported: no points), the points read, the
    first and the newest point as written (for a one-line summary), and the loss's non-finite values."""

    loss: tuple[Point, ...] = ()
    tokens_per_s: tuple[Point, ...] = ()
    steps_per_s: tuple[Point, ...] = ()
    mfu: tuple[Point, ...] = ()
    """A fraction (0.41 is 41%)."""
    points: int = 0
    first: TrainingPoint | None = None
    last: TrainingPoint | None = None
    not_finite_loss: tuple[tuple[float, int, float], ...] = ()
    """(when, step, the value: nan, inf or -inf) of the first NOT_FINITE_KEPT losses that were not a number."""
    not_finite_losses: int = 0


def thin_series(series: Iterable[TrainingPoint], limit: int = CURVE_LIMIT) -> TrainingCurves:
    """The curves of a series, oldest point first, each thinned to at most `limit` points (4 or more),
    every bucket's lowest and highest kept; memory bounded by `limit` whatever the series' length."""
    if limit < 4:
        raise ValueError(f"a curve needs a limit of 4 points or more, not {limit}")
    loss, tokens, steps, mfu = (_Thinner(limit) for _ in range(4))
    first: TrainingPoint | None = None
    last: TrainingPoint | None = None
    count = 0
    not_finite: list[tuple[float, int, float]] = []
    not_finite_count = 0
    isfinite = math.isfinite
    for point in series:
        if first is None:
            first = point
        last = point
        count += 1
        at = point.at
        if point.loss is not None:
            if isfinite(point.loss):
                loss.add(at, point.loss)
            else:
                not_finite_count += 1
                if len(not_finite) < NOT_FINITE_KEPT:
                    not_finite.append((at, point.step, point.loss))
        if point.tokens_per_s is not None:
            tokens.add(at, point.tokens_per_s)
        if point.steps_per_s is not None:
            steps.add(at, point.steps_per_s)
        if point.mfu is not None:
            mfu.add(at, point.mfu)
    return TrainingCurves(loss.points(), tokens.points(), steps.points(), mfu.points(), count, first, last,
                          tuple(not_finite), not_finite_count)


def joined(curves: Sequence[TrainingCurves]) -> TrainingCurves:
    """The curves of several jobs (a run's attempts, oldest first) as one: points one after the other,
    the first job's first point and the last one's newest."""
    firsts = [c.first for c in curves if c.first is not None]
    lasts = [c.last for c in curves if c.last is not None]
    return TrainingCurves(
        loss=tuple(p for c in curves for p in c.loss), tokens_per_s=tuple(p for c in curves for p in c.tokens_per_s),
        steps_per_s=tuple(p for c in curves for p in c.steps_per_s), mfu=tuple(p for c in curves for p in c.mfu),
        points=sum(c.points for c in curves), first=firsts[0] if firsts else None, last=lasts[-1] if lasts else None,
        not_finite_loss=tuple(p for c in curves for p in c.not_finite_loss)[:NOT_FINITE_KEPT],
        not_finite_losses=sum(c.not_finite_losses for c in curves))


def _figure(value: float) -> str:
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def training_line(first: TrainingPoint, last: TrainingPoint, points: int | None = None) -> str:
    """A run's training in one line, from its first and its newest point (`points`: how many there are, when
    known): `training: loss 9.14 → 2.31 over steps 0–4200 (1,234 points); newest: 4.26M tokens/s, 0.52
    steps/s, MFU 41.2%`."""
    parts = []
    if first.loss is not None or last.loss is not None:
        parts.append(f"loss {_measured(first.loss)} → {_measured(last.loss)}")
    parts.append(f"over steps {first.step}–{last.step}" + (f" ({points:,} points)" if points is not None else ""))
    newest = [f"{_figure(last.tokens_per_s)} tokens/s" if last.tokens_per_s is not None else "",
              f"{last.steps_per_s:.3g} steps/s" if last.steps_per_s is not None else "",
              f"MFU {last.mfu * 100:.1f}%" if last.mfu is not None else ""]
    shown = [text for text in newest if text]
    return "training: " + " ".join(parts) + (f"; newest: {', '.join(shown)}" if shown else "")


def _measured(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if math.isfinite(value) else str(value)
