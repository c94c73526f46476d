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
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from clusterctl.records.healthd_proof import ProofResult

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


def read_nccl_tests(text: str) -> Measurement:
    """nccl-tests' table (`all_reduce_perf -b 8 -e 1G -f 2`): bus bandwidth at the largest size, the time of the
    smallest size as latency (out-of-place columns), and any row with wrong results as a problem.

    A row: `size count type redop [root] time algbw busbw #wrong time algbw busbw #wrong` (root since 2.10).
    UnreadableOutput when no row is found."""
    rows: list[tuple[int, float, float, str]] = []
    problems = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#") or len(words) not in (12, 13) or not words[0].isdigit():
            continue
        out_of_place = words[-8:-4]
        try:
            size, time_us, busbw = int(words[0]), float(out_of_place[0]), float(out_of_place[2])
        except ValueError:
            continue
        wrong = [w for w in (out_of_place[3], words[-1]) if w not in ("0", "N/A")]
        if wrong:
            problems.append(f"wrong results at {size} bytes ({'/'.join(wrong)} elements)")
        rows.append((size, time_us, busbw, line))
    if not rows:
        raise UnreadableOutput("no result rows of nccl-tests (size count type redop ... time algbw busbw #wrong)")
    rows.sort()
    return Measurement(rows[-1][2], rows[0][1], tuple(problems))


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
