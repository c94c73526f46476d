"""The supervisor's doors: its side effects (the clock, sleeping, what it says and shows, notifications,
the slow node's GPU evidence, the drain door, git), one object passed to the supervisor and its parts
(launcher/login/supervisor.py), swappable in tests; and the snapshot of its attempt that it shows."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clusterctl.launcher.login.code_version import GitDoor, run_git
from clusterctl.launcher.shared.straggler_actions import GpuEvidenceReader, StragglerDrain


@dataclass(frozen=True)
class WatchSnapshot:
    """What the supervisor shows of the attempt it watches, each poll (`Hooks.show`)."""

    attempt: int
    job_id: str | None
    state: str
    """Slurm's state of the job, "?" while Slurm does not report it."""
    nodes: str
    blamed: tuple[tuple[str, str], ...]
    """(node, reason) of each node still blamed."""
    checkpoint_step: int | None

    def line(self) -> str:
        """The live line a terminal shows (plain text: the views never read it as markup)."""
        blamed = "; ".join(f"{n}: {r}" for n, r in self.blamed) or "none"
        return (f"attempt {self.attempt} job {self.job_id} {self.state} on {self.nodes or '-'} | "
                f"checkpoint step {self.checkpoint_step} | blamed: {blamed}")


@dataclass
class Hooks:
    """The supervisor's side effects, swappable in tests."""

    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    say: Callable[[str], None] = print
    notify: Callable[[str, dict[str, Any]], None] = lambda event, payload: None
    show: Callable[[WatchSnapshot], None] = lambda snapshot: None
    gpu_evidence: GpuEvidenceReader | None = None
    """What a slow node's GPUs say, asked as a step of the job (None: not asked)."""
    drain: StragglerDrain | None = None
    """The drain door for straggler verdicts (None: never drain; SlurmCommandError when Slurm refuses)."""
    git: GitDoor = run_git
    """Asks git the code version of the launch workdir, for each attempt's experiment record."""
