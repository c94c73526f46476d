"""What to do about a straggler: report it, exclude it from the next submission, or swap it for a spare
now, and whether to drain it.  (pure)

The one place that decides, asked by both watchers of a job's progress (through
launcher/shared/straggler_actions.py, which gathers the GPUs' evidence first and carries the verdict
out): the in-job agent, which can swap a node for a spare, and the supervisor of a job without an
agent, which cannot.  The rules:

- the spec's `[stragglers] action` says how far to go (`report` never acts on the node);
- a swap needs an agent, a spare left, and a node other than the batch host (where the agent itself
  runs); without one the node is excluded instead, and the reason is written down;
- an evicted node (excluded or swapped) is drained only when its GPUs' own evidence explains the
  slowdown (a slow data shard or a noisy neighbour is this run's business, not the admins'), and
  only through a drain door (none given: never drained).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

NO_AGENT = ("the job has no in-job agent to swap nodes (a built-in launch template with spare_nodes and "
            "restart.recover = in-allocation)")
"""Why a straggler the supervisor finds is excluded rather than swapped."""
NOT_EXPLAINED = "not drained: the GPUs' own evidence does not explain the slowdown; avoided by this run only"
"""What became of draining an evicted node whose GPUs do not explain its slowness."""

Done = Literal["reported", "excluded", "swapped"]


@dataclass(frozen=True)
class SwapRoom:
    """What the job's in-job agent could swap a straggler with: the spares left, and the batch host it
    runs on (never swapped out from under it)."""

    spares: int
    batch_host: str


@dataclass(frozen=True)
class StragglerVerdict:
    """What to do about one straggler: `done` (as journaled), whether to drain it, and why (`notes` go
    into the journal's evidence; `drain_note` is its `drain` when no drain is tried)."""

    done: Done
    drain: bool = False
    notes: tuple[str, ...] = ()
    drain_note: str = ""

    @property
    def evicted(self) -> bool:
        """The node leaves this run: avoided from the next submission on, or swapped for a spare now."""
        return self.done != "reported"


def straggler_verdict(node: str, hardware: Sequence[str], action: str, room: SwapRoom | None,
                      can_drain: bool) -> StragglerVerdict:
    """The verdict on straggler `node`, given what its GPUs said that explains a slowdown (`hardware`,
    empty: nothing), the spec's `action` (report, exclude or swap), what the in-job agent could swap it
    with (`room`; None: the job has no agent, as when its supervisor watches) and whether a drain door
    is there."""
    if action not in ("exclude", "swap"):
        return StragglerVerdict("reported")
    notes: tuple[str, ...] = ()
    done: Done = "excluded"
    if action == "swap":
        no_swap = _no_swap(node, room)
        if no_swap:
            notes = (f"not swapped: {no_swap}; avoided from the next resubmission on",)
        else:
            done = "swapped"
    drain = bool(hardware) and can_drain
    return StragglerVerdict(done, drain, notes, "" if drain else NOT_EXPLAINED)


def _no_swap(node: str, room: SwapRoom | None) -> str:
    """Why `node` cannot be swapped for a spare now ("": it can)."""
    if room is None:
        return NO_AGENT
    if node == room.batch_host:
        return f"{node} is the batch host, where this agent runs"
    if room.spares < 1:
        return "no spare left"
    return ""
