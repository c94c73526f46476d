"""What a checkpoint is to the launcher: a complete one, or a candidate skipped and why (the
facts; finding them in a directory is `clusterctl.launcher.shared.checkpoints`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: where, which step, which validator accepted it, what it cost to write.

    A multi-level checkpoint (validator `tiers`) is in its folder `path` on shared storage only once
    flushed; `from_tiers` says what the nodes' own tiers give of it ('' : it is read whole from `path`)."""

    path: str
    step: int
    validator: str
    written_at: float | None = None
    save_seconds: float | None = None
    from_tiers: str = ""

    @property
    def where(self) -> str:
        """Where it is read from, as a user reads it: its path; for a multi-level checkpoint its step and
        tiers, `step 20 (in the nodes' tiers: 1 own copy, 1 buddy copy)` or `step 20 (shared: <path>)`."""
        if self.validator != "tiers":
            return self.path
        return f"step {self.step} ({self.from_tiers or f'shared: {self.path}'})"


@dataclass(frozen=True)
class Skipped:
    """A candidate that did not validate, and why."""

    path: str
    why: str
