"""What a checkpoint is to the launcher: a complete one, or a candidate skipped and why (the
facts; finding them in a directory is `clusterctl.launcher.shared.checkpoints`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: where, which step, which validator accepted it, what it cost to write."""

    path: str
    step: int
    validator: str
    written_at: float | None = None
    save_seconds: float | None = None


@dataclass(frozen=True)
class Skipped:
    """A candidate that did not validate, and why."""

    path: str
    why: str
