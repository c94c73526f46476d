"""Is a node's link to a known-good neighbour healthy? (pure: measurements and history in, verdict out)

`healthd prove` measures bandwidth and latency between the repaired node and a neighbour, then asks
`judge`.  The thresholds are relative to the fleet's healthy median: the median of the last passing proofs
of the same test (`ProofLimits.history_kept` of them), once there are `min_history`; until then absolute
floors.  Bandwidth must reach `bandwidth_share` of the median, latency stay within `latency_factor` of it.

The two readers turn a test's output into a `Measurement`: `read_nccl_tests` reads nccl-tests'
`all_reduce_perf` table, `read_link_test` the built-in TCP test's one JSON line.  Output is data from a
program healthd does not control: parsed, never interpreted.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from clusterctl.records.healthd_proof import ProofResult
from clusterctl.text import one_line

LINK_TEST = "tcp"
"""The built-in test's name in the proof journal (healthd/proof_link.py)."""


@dataclass(frozen=True)
class ProofLimits:
    """The thresholds' settings ([prove] in healthd.toml)."""

    bandwidth_share: float = 0.8
    """A pass needs at least this share of the fleet's median bandwidth."""
    latency_factor: float = 1.5
    """... and at most this multiple of its median latency."""
    min_history: int = 5
    """Passing proofs of the same test needed before the median is used (absolute floors until then)."""
    history_kept: int = 50
    """The median is over at most this many of the latest passing proofs (a fleet's links change)."""
    floor_bandwidth_gbs: float = 0.1
    """Until there is history: the least bandwidth, GB/s (0.1 GB/s: any working 1 Gb/s link)."""
    ceiling_latency_us: float = 1000.0
    """Until there is history: the most latency, microseconds."""


@dataclass(frozen=True)
class Measurement:
    """What one test measured (either may be unknown: a test that reports only one)."""

    bandwidth_gbs: float | None
    latency_us: float | None
    problems: tuple[str, ...] = ()
    """What the test itself reported wrong (nccl-tests' #wrong column): fails the proof whatever the numbers."""


@dataclass(frozen=True)
class Thresholds:
    """What a measurement is judged against, and where that came from."""

    min_bandwidth_gbs: float
    max_latency_us: float
    basis: str


@dataclass(frozen=True)
class ProofVerdict:
    passed: bool
    thresholds: Thresholds
    reasons: tuple[str, ...]


def thresholds(history: Sequence[ProofResult], test: str, limits: ProofLimits) -> Thresholds:
    """The thresholds for a proof by `test`: relative to the median of its latest passing proofs, or the floors."""
    healthy = [p for p in history if p.passed and p.test == test][-limits.history_kept:]
    bandwidths = [p.bandwidth_gbs for p in healthy if p.bandwidth_gbs is not None and math.isfinite(p.bandwidth_gbs)]
    latencies = [p.latency_us for p in healthy if p.latency_us is not None and math.isfinite(p.latency_us)]
    if len(healthy) < limits.min_history or not bandwidths or not latencies:
        return Thresholds(limits.floor_bandwidth_gbs, limits.ceiling_latency_us,
                          f"absolute floors ({len(healthy)} passing proofs of {test}, {limits.min_history} needed "
                          f"for the fleet's median)")
    bandwidth, latency = statistics.median(bandwidths), statistics.median(latencies)
    return Thresholds(bandwidth * limits.bandwidth_share, latency * limits.latency_factor,
                      f"median of {len(healthy)} passing proofs of {test}: {bandwidth:.3g} GB/s, {latency:.3g} us")


def judge(measured: Measurement, history: Sequence[ProofResult], test: str, limits: ProofLimits) -> ProofVerdict:
    """Pass when neither the test reported a problem nor a measured value misses its threshold.

    A value the test did not report is not judged; a test that reported neither fails (nothing proven)."""
    limit = thresholds(history, test, limits)
    reasons = list(measured.problems)
    bandwidth, latency = measured.bandwidth_gbs, measured.latency_us
    if bandwidth is None and latency is None:
        reasons.append("the test reported neither bandwidth nor latency")
    if bandwidth is not None and not bandwidth >= limit.min_bandwidth_gbs:  # `not >=`: NaN fails
        reasons.append(f"bandwidth {bandwidth:.3g} GB/s below {limit.min_bandwidth_gbs:.3g} GB/s")
    if latency is not None and not latency <= limit.max_latency_us:
        reasons.append(f"latency {latency:.3g} us above {limit.max_latency_us:.3g} us")
    return ProofVerdict(not reasons, limit, tuple(reasons))


class UnreadableOutput(ValueError):
    """A test's output this reader cannot take a measurement from."""


# srun --label ("0: ") and mpirun --tag-output ("[1,0]<stdout>:") put a prefix before each line.
_LINE_PREFIX = re.compile(r"^\s*(?:\d+:|\[\d+,\d+\]<std(?:out|err)>:)\s?")
_FAILURE_MARKS = ("Test NCCL failure", "Test CUDA failure", "Test failure", "NCCL WARN", "NCCL failure")


def read_nccl_tests(text: str) -> Measurement:
    """nccl-tests' table (`all_reduce_perf -b 8 -e 1G -f 2`): the out-of-place bus bandwidth at the largest size, the
    out-of-place time at the smallest size as latency, and wrong results as problems.

    The columns are read from the table's own header line, so every layout nccl-tests has printed is read
    (tests/data/nccl-tests/README.md): `size count type redop time algbw busbw error ...` (v2.0-2.11, `error` a
    maximum deviation, not a count), `size count type redop root time algbw busbw #wrong ...` (v2.13 on), with
    per-iteration columns (`-I 1`, v2.19.2 on) or a trailing timestamp (v2.17.6 on).  A size printed more than once
    (several tables, `-N` repeats) counts at its worst.  Wrong results are a nonzero `#wrong` in either half or a
    nonzero `Out of bounds values` summary.  UnreadableOutput, naming what is missing and quoting any failure line
    the test printed, when there is no header, no result row, or no `# Avg bus bandwidth` summary (the run did not
    finish: a measurement from part of a run is not a proof)."""
    columns: list[str] = []
    rows: dict[int, tuple[float, float]] = {}
    problems: list[str] = []
    failures: list[str] = []
    finished = False
    for raw in text.splitlines():
        line = _LINE_PREFIX.sub("", raw, count=1).strip()
        if any(mark in line for mark in _FAILURE_MARKS):
            failures.append(line)
        if line.startswith("#"):
            words = line.lstrip("#").split()
            if len(words) > 4 and words[0] == "size" and "busbw" in words:
                columns = words
            elif line.lstrip("#").split(":")[0].strip() == "Out of bounds values":
                count = line.split(":", 1)[1].split()
                if count and count[0] != "0":
                    problems.append(f"nccl-tests found {count[0]} out-of-bounds values (wrong results)")
            elif line.lstrip("#").split(":")[0].strip() == "Avg bus bandwidth":
                finished = True
                if "FAILED" in line:
                    problems.append("nccl-tests' own average bus bandwidth check FAILED")
            continue
        read = _nccl_tests_row(line.split(), columns) if columns else None
        if read is None:
            continue
        size, time_us, busbw, wrong = read
        if wrong:
            problems.append(f"wrong results at {size} bytes ({'/'.join(wrong)} elements)")
        seen = rows.get(size)
        rows[size] = (time_us, busbw) if seen is None else (max(seen[0], time_us), min(seen[1], busbw))
    said = f"; it said: {one_line(failures[0])[:200]}" if failures else ""
    if not columns:
        raise UnreadableOutput(f"no nccl-tests table: no column header line (# size count type ... busbw){said}")
    if not rows:
        raise UnreadableOutput(f"no result rows under nccl-tests' column header ({' '.join(columns)}){said}")
    if not finished:
        raise UnreadableOutput(f"nccl-tests did not finish: no '# Avg bus bandwidth' line after {len(rows)} result "
                               f"rows (the last at {max(rows)} bytes){said}")
    return Measurement(rows[max(rows)][1], rows[min(rows)][0], tuple(problems))


def _nccl_tests_row(words: list[str], columns: list[str]) -> tuple[int, float, float, tuple[str, ...]] | None:
    """One result row read by the header's columns: (size, out-of-place time, out-of-place busbw, wrong counts);
    None for any other line (NCCL's own lines, a row garbled by another rank's output)."""
    expected = len(columns) + (1 if columns[-1] == "timestamp" else 0)  # the timestamp is two words, date and time
    if len(words) != expected or not words[0].isdigit():
        return None
    times = [i for i, name in enumerate(columns) if name in ("time", "cputime")]
    busbws = [i for i, name in enumerate(columns) if name == "busbw"]
    if not times or not busbws:
        return None
    try:
        time_us, busbw = float(words[times[0]]), float(words[busbws[0]])
        # v2.0-2.11's `error` column is the largest deviation (`2e-07` is fine): only a count (#wrong) is judged.
        wrong = tuple(words[i] for i, name in enumerate(columns)
                      if name == "#wrong" and words[i] != "N/A" and float(words[i]) != 0)
    except ValueError:
        return None
    if not (math.isfinite(time_us) and math.isfinite(busbw)):
        return None
    return int(words[0]), time_us, busbw, wrong


def read_link_test(text: str) -> Measurement:
    """The built-in TCP test's result: the last line that is a JSON object with `bandwidth_gbs` and `latency_us`."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if not isinstance(found, dict):
            continue
        values = found.get("bandwidth_gbs"), found.get("latency_us")
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return Measurement(float(values[0]), float(values[1]))  # type: ignore[arg-type]
    raise UnreadableOutput("no result line of the TCP link test ({\"bandwidth_gbs\": ..., \"latency_us\": ...})")
