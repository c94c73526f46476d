"""What healthd's watching threads hand the main thread: a batch of findings (`Observed`).

The applier's outcomes (`Applied`, applier.py) travel in the same inbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.healthd.findings import Finding
from clusterctl.slurm.nodes import NodeState


@dataclass(frozen=True)
class Observed:
    """A batch of findings from one thread (periodic: with Slurm's view of the node and the GPU count)."""

    source: str
    findings: tuple[Finding, ...]
    node: NodeState | None = None
    node_at: float | None = None
    gpu_count: int | None = None
