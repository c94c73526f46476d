"""What one trial of bench/peers_bench.py measured, read from outside the tools: pure functions.

Every tool runs the same program, which appends a line per step per rank to one step log
(examples/step_log.py: ``<wall> <step> <rank> <world>``); the bench stamps the fault with the same
wall clock and every line a tool prints as it arrives.  From those alone, per trial:

* detected: fault → the tool's first log line (after the fault) that says it saw the failure
  (each tool's own words: bench/peers_bench.py's DETECTION patterns); else its first sign of a restart
  (the step log's first line of a new attempt);
* stepping again: fault → the first step after the fault that every rank of its world finished
  (a step the fault cut short, finished by some ranks only, does not count);
* steps lost: the newest step any rank had finished before the fault, less the step that first
  complete step followed (a restart from checkpoint 20 after step 25: 5; a tool that goes on: 0).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


class StepLogError(ValueError):
    """A step log line that is not ``<wall> <step> <rank> <world>``."""

    def __init__(self, line_number: int, text: str) -> None:
        super().__init__(f"step log line {line_number}: {text!r} is not '<wall seconds> <step> <rank> <world size>'")


@dataclass(frozen=True)
class StepLine:
    """One rank finished one step: when (wall clock, seconds), which step, which rank of a world of how many."""

    wall: float
    step: int
    rank: int
    world: int


@dataclass(frozen=True)
class TrialMeasure:
    """One trial's figures in seconds from the fault (None: it never happened within the trial)."""

    detected_s: float | None
    stepping_again_s: float | None
    steps_lost: int | None
    detected_by: str  # "tool log" or "restart" (the first step of a new attempt) or "" (never)


def parse_step_log(text: str) -> list[StepLine]:
    """Every line of a step log; a line cut off by the end of the file (no newline: a rank killed
    mid-write cannot leave one, but a reader may race a writer) is left out, any other bad line raises."""
    lines: list[StepLine] = []
    rows = text.split("\n")
    complete = rows[:-1]  # what follows the last newline is either "" or a line still being written
    for number, row in enumerate(complete, start=1):
        if not row.strip():
            continue
        fields = row.split()
        try:
            if len(fields) != 4:
                raise ValueError
            wall = float(fields[0])
            step, rank, world = int(fields[1]), int(fields[2]), int(fields[3])
        except ValueError:
            raise StepLogError(number, row) from None
        if not math.isfinite(wall) or step < 0 or world < 1 or not 0 <= rank < world:
            raise StepLogError(number, row)
        lines.append(StepLine(wall, step, rank, world))
    return lines


def first_complete_step_after(lines: Iterable[StepLine], after: float) -> StepLine | None:
    """The first step after `after` that every rank of its world finished after `after`: the line that
    completed it (its wall time is when training was stepping again).

    The step in flight at the fault (the one after the newest finished before it, in the same world) does
    not count until a restart shows (a step no newer than one finished before the fault): its ranks may
    all log it after the fault although its work was done before -- a stopped rank that its tool wakes
    (SIGCONT) only to kill it logs the step it was stopped in.  A restart that resumes exactly at that
    step is then seen one step late."""
    ordered = sorted(lines, key=lambda line: line.wall)
    before = [line for line in ordered if line.wall <= after]
    in_flight = (max(line.step for line in before) + 1, before[-1].world) if before else None
    restarted = False
    seen: dict[tuple[int, int], set[int]] = {}
    for line in ordered:
        if line.wall <= after:
            continue
        if in_flight is not None and line.step < in_flight[0]:
            restarted = True
        key = (line.step, line.world)
        if key == in_flight and not restarted:
            continue
        ranks = seen.setdefault(key, set())
        ranks.add(line.rank)
        if len(ranks) == line.world:
            return line
    return None


def first_match(stamped: Iterable[tuple[float, str]], after: float, pattern: re.Pattern[str]) -> float | None:
    """The wall time of the first tool log line after `after` that matches `pattern`."""
    times = [wall for wall, text in stamped if wall > after and pattern.search(text)]
    return min(times) if times else None


def measure_trial(lines: Sequence[StepLine], fault_at: float, detected_at: float | None) -> TrialMeasure:
    """A trial's figures from its step log, the fault's wall time and the tool's detection line's (if any)."""
    before = [line.step for line in lines if line.wall <= fault_at]
    again = first_complete_step_after(lines, fault_at)
    lost = None
    if again is not None and before:
        lost = max(0, max(before) - (again.step - 1))
    detected_by = "tool log" if detected_at is not None else ""
    if detected_at is None:
        restart = _first_restart(lines, fault_at)
        if restart is not None:
            detected_at, detected_by = restart, "restart"
    return TrialMeasure(
        detected_s=None if detected_at is None else round(detected_at - fault_at, 3),
        stepping_again_s=None if again is None else round(again.wall - fault_at, 3),
        steps_lost=lost, detected_by=detected_by)


def _first_restart(lines: Sequence[StepLine], fault_at: float) -> float | None:
    """The first line after the fault of a step no later than one already finished before it: a new attempt."""
    done = max((line.step for line in lines if line.wall <= fault_at), default=None)
    if done is None:
        return None
    times = [line.wall for line in lines if line.wall > fault_at and line.step <= done]
    return min(times) if times else None


# ---- the table ---------------------------------------------------------------------------------
def spread(values: Sequence[float]) -> str:
    """``median [min–max]``, or ``median`` alone when every value is the same; "—" for none."""
    if not values:
        return "—"
    median, low, high = statistics.median(values), min(values), max(values)
    if low == high:
        return f"{_num(median)}"
    return f"{_num(median)} [{_num(low)}–{_num(high)}]"


def _num(value: float) -> str:
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".") or "0"


def ratios_to_best(medians: Mapping[str, float]) -> dict[str, float]:
    """Each tool's median over the smallest (the best) median of the row: 1.0 for the best."""
    if not medians:
        return {}
    best = min(medians.values())
    return {tool: (math.inf if best == 0 and value > 0 else 1.0 if best == value else round(value / best, 2))
            for tool, value in medians.items()}


def table(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """A markdown table, one row per (fault, tool, timeouts): each row a mapping with fault, tool, timeouts,
    trials (the list of TrialMeasure-like dicts) or note (why there is no measurement: "not handled",
    "not run locally: …", what failed).  Ratios compare the medians of fault → stepping again within a fault."""
    out = ["| fault | tool | timeouts | trials | fault → detected (s) | fault → stepping again (s) | steps lost | × best |",
           "|---|---|---|---|---|---|---|---|"]
    medians: dict[str, dict[str, float]] = {}
    for row in rows:
        again = _values(row, "stepping_again_s")
        if again and len(again) == len(_trials(row)):
            medians.setdefault(str(row["fault"]), {})[_key(row)] = statistics.median(again)
    ratios = {fault: ratios_to_best(m) for fault, m in medians.items()}
    for row in rows:
        head = f"| {row['fault']} | {row['tool']} | {row.get('timeouts', '')} |"
        trials = _trials(row)
        if not trials:
            out.append(f"{head} 0 | {row.get('note') or 'not measured'} | | | |")
            continue
        again = _values(row, "stepping_again_s")
        missed = len(trials) - len(again)
        again_text = spread(again) + (f" ({missed} of {len(trials)} never)" if missed else "")
        ratio = ratios.get(str(row["fault"]), {}).get(_key(row))
        out.append(f"{head} {len(trials)} | {spread(_values(row, 'detected_s'))} | {again_text} | "
                   f"{spread(_values(row, 'steps_lost'))} | {'—' if ratio is None else f'{ratio:g}'} |")
    return out


def _trials(row: Mapping[str, object]) -> list[Mapping[str, object]]:
    trials = row.get("trials") or []
    return list(trials) if isinstance(trials, list) else []


def _values(row: Mapping[str, object], key: str) -> list[float]:
    return [float(v) for t in _trials(row) if isinstance(v := t.get(key), (int, float))]


def _key(row: Mapping[str, object]) -> str:
    return f"{row['tool']} ({row.get('timeouts', '')})"
