"""The step log: one line per training step per rank, the clock every tool comparison reads.

A line is ``<wall seconds> <step> <rank> <world size>``: the wall clock (time.time(), the one the
bench's fault injection stamps too) when this rank finished the step.  Every rank of every attempt
appends to the same file with one write() of a short line on an O_APPEND descriptor, so lines never
interleave.  bench/peers_bench.py parses it (bench/peer_steps.py); the trainers of
examples/torch_trainer.py and examples/peers/ write it when given --step-log.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


class StepLog:
    """Appends this rank's steps to the shared step log (nothing when `path` is None)."""

    def __init__(self, path: Path | None) -> None:
        self.fd = None if path is None else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def step(self, step: int, rank: int, world: int) -> None:
        """Record that `rank` of a world of `world` ranks finished `step`, now."""
        if self.fd is not None:
            os.write(self.fd, f"{time.time():.6f} {step} {rank} {world}\n".encode())
