"""Small statistics helpers shared by the benchmarks."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank: the value below which a share q of the runs fall."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
