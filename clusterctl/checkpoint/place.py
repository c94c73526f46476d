"""What a `Checkpointer`'s parts (resume, save, the background worker) share: the rank's place in the
job (`RankPlace`), the node's tier as this rank holds it (`TierHold`) and its lines on stderr (`Voice`)."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from clusterctl.checkpoint.tier import NodeTier, TierRootError, open_tier_root
from clusterctl.files import owner_label
from clusterctl.records.checkpoint_holdings import CopyRefusals, LastResume
from clusterctl.records.checkpoint_settings import CheckpointSettings
from clusterctl.records.tier_index import TierSlot


@dataclass(frozen=True)
class RankPlace:
    """This rank among the job's: the node's name and slot (of `slots`), the global `rank`, this rank
    among the node's `local_ranks`, the `attempt` token that names this attempt's temporary folders,
    and the node's `line` of the step's tier index (None without one: no buddy, no planned tier)."""

    settings: CheckpointSettings
    node: str
    slot: int
    slots: int
    rank: int
    local_rank: int
    local_ranks: int
    attempt: str
    line: TierSlot | None

    @property
    def shared_dir(self) -> Path:
        """The run's checkpoint directory on shared storage."""
        return Path(self.settings.shared_dir)


class Voice:
    """The checkpointer's lines on stderr (`clusterctl.checkpoint: ...`), some of a kind said only once."""

    def __init__(self, stderr: TextIO | None) -> None:
        self._stderr = stderr
        self._said: set[str] = set()

    def say(self, message: str) -> None:
        """One line on stderr."""
        print(f"clusterctl.checkpoint: {message}", file=self._stderr or sys.stderr, flush=True)

    def say_once(self, kind: str, message: str) -> None:
        """One line on stderr, the first time something of `kind` is said."""
        if kind not in self._said:
            self._said.add(kind)
            self.say(message)


class TierHold:
    """The node's local tier as this rank holds it: `tier` is None when it cannot be used (`problem`
    says why), and becomes None when a save finds it unwritable, so every later save goes to shared
    storage directly.  `lock` guards holdings and retention (the background thread, the copy server's
    callback, a resume and a save's room-making all change them)."""

    def __init__(self, tier: NodeTier | None, problem: str = "") -> None:
        self.tier = tier
        self.problem = problem
        self.lock = threading.Lock()
        self._holdings_seen: object = None
        self.serving = False
        """This process runs the node's copy server (local rank 0): `refused` is what it turned away."""
        self.refused: CopyRefusals | None = None

    @classmethod
    def open(cls, root: Path, base: Path, node: str, uid: int | None, job_id: str = "") -> TierHold:
        """The node's tier at `root` (under `base`), made when missing; a hold without one when it
        cannot be made or is not safe to use (a folder on its way planted by another user, a symlink, open
        to others): `problem` then says which folder, who owns it and that saves go to shared storage.
        The job never dies for it: the prolog moves a planted folder aside for the next job
        (healthd/stale_tiers.py)."""
        try:
            return cls(NodeTier(open_tier_root(root, base, uid=uid, job_id=job_id), node))
        except TierRootError as exc:
            if exc.path is None or exc.owner is None:
                return cls(None, f"{exc}; this node's checkpoints go to shared storage")
            return cls(None, f"the node's local checkpoint tier is not used: {exc.path} belongs to "
                             f"{owner_label(exc.owner)} ({exc.problem}; planted by another user?): this node's "
                             "checkpoints go to shared storage (the next tier); the node's prolog moves a planted "
                             "directory aside for the next job")
        except OSError as exc:
            return cls(None, f"the node's checkpoint directory {root} cannot be made ({exc.strerror or exc})")

    def give_up(self, problem: str) -> None:
        """The tier is not usable after all (`problem`): from now on every part goes without it."""
        self.problem = problem
        self.tier = None

    def rewrite_holdings(self, *, force: bool = False, resumed: LastResume | None = None) -> None:
        """Write holdings.json when what the tier holds changed since the last write (or `force`);
        `resumed` is the resume to record in it, with `refused` when `serving`.  The caller holds `lock`."""
        assert self.tier is not None
        seen = ([m.step for _, m in self.tier.local_copies()],
                [(m.of_node, m.step) for _, m in self.tier.buddy_copies()],
                [m.step for m in self.tier.flushed()], self.refused)
        if force or seen != self._holdings_seen:
            self.tier.write_holdings(resumed, self.refused, serving=self.serving)
            self._holdings_seen = seen
