"""Slurm reads shared by every supervisor under one runs directory.

Each supervisor polls `squeue --json` and `sinfo --json`; ten supervised runs on a login
node would ask slurmctld ten times per interval for the same answer.  The answer is kept in
a file next to the runs (written atomically, read by all) and reused while it is younger
than the poll interval, so slurmctld sees one query per interval however many runs are
supervised.  A lock makes only one supervisor refresh at a time.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from clusterctl.records.slurm_cache import CachedAnswer, read_cached_answer, write_cached_answer
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.jobs import JobReport


class SharedReads:
    """`queue()` and `nodes_json()` through a cache file shared by supervisors."""

    def __init__(self, slurm: Slurm, directory: Path, max_age: float, clock: Callable[[], float]) -> None:
        self.slurm, self.directory, self.max_age, self.clock = slurm, directory, max_age, clock

    def _read(self, command: str, fetch: Callable[[], str]) -> str:
        fresh = self._fresh(command)
        if fresh is not None:
            return fresh
        with open(self.directory / f".slurm-{command}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one refresher; the others then read its answer
            fresh = self._fresh(command)
            if fresh is not None:
                return fresh
            text = fetch()
            write_cached_answer(self.directory, CachedAnswer(command, self.clock(), os.getpid(), text))
            return text

    def _fresh(self, command: str) -> str | None:
        try:
            cached = read_cached_answer(self.directory, command)
        except (OSError, RecordError):
            return None  # an answer we cannot read is a miss: ask Slurm and write one we can
        if cached is None:
            return None
        return cached.text if 0 <= cached.age(self.clock()) < self.max_age else None

    def queue(self) -> dict[str, JobReport]:
        """Every job slurmctld holds, finished ones included (one squeue per interval for all supervisors)."""
        return self.slurm.parse_queue(self._read("squeue", self.slurm.queue_json))

    def nodes_json(self) -> str:
        """`sinfo --json`, shared the same way."""
        return self._read("sinfo", self.slurm.nodes_json)
