"""The actions healthd's policy can call for: one vocabulary for its state, its drains and the epilog's records."""

from __future__ import annotations

import enum


class Action(enum.IntEnum):
    """What a finding calls for, in increasing severity (comparisons pick the worst)."""

    IGNORE = 0
    APP_FAULT = 1  # the job's own fault: record against the job, keep the node
    WARN = 2
    RESET_AT_IDLE = 3  # healthy enough to run, reset the GPU when the node is idle
    DRAIN_RESET = 4
    DRAIN_REBOOT = 5
    DRAIN_RMA = 6  # hardware must be replaced: never resumed automatically

    @property
    def drains(self) -> bool:
        """The node must leave service."""
        return self >= Action.DRAIN_RESET

    @property
    def label(self) -> str:
        """How records, reasons and humans name it: `drain-reset`."""
        return self.name.lower().replace("_", "-")

    @classmethod
    def from_label(cls, label: str) -> Action:
        """`drain-reset` → Action.DRAIN_RESET; ValueError naming the known labels otherwise."""
        for action in cls:
            if action.label == label:
                return action
        raise ValueError(f"unknown action {label!r} (known: {', '.join(a.label for a in cls)})")
