"""A checkpointer's saves: where the node saves a step (the first local rank to save it decides for all:
its local tier, room made, or shared storage and why), the staging folder every local rank writes its
part into, and the commit the last one triggers (a manifest over the hashed shards, renamed into place;
in the background by local rank 0's worker when it runs, else by the last rank itself).

    <tier root>/.tmp-save-<N:012d>-<attempt>/    step N's control folder: `where`, the ranks' marks, `ready`
    <tier root>/.tmp-step-<N:012d>-<attempt>/    step N's staging folder, renamed to local/step-<N> when committed
    <tier root>/.committer-<attempt>             present while local rank 0 commits in the background
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.checkpoint.copies import CopyError, shards_of
from clusterctl.checkpoint.flush import Throttle, flush_copy
from clusterctl.checkpoint.place import RankPlace, TierHold, Voice
from clusterctl.checkpoint.tier import (
    LOCAL,
    budget_bytes,
    commit_copy,
    mark_done,
    plan_room,
    publish_once,
    shared_copy_dir,
    slot_name,
    step_name,
)
from clusterctl.records.checkpoint_manifest import CheckpointManifest

READY = "ready"
"""In a save's control folder: every local rank's part is written; its content, the save's seconds."""


@dataclass(frozen=True)
class SaveTarget:
    """Where this rank writes step `step`'s part: `staging`, on tier `tier` (`local` or `shared`), with the
    save's marks in `control`."""

    step: int
    control: Path
    staging: Path
    tier: str


def committer_marker(tier_root: Path, attempt: str) -> Path:
    """Present while local rank 0 of this attempt commits the node's saves in the background."""
    return tier_root / f".committer-{attempt}"


class Saver:
    """`Checkpointer.save_files()`: this rank's part of a step written into the node's staging folder,
    and the node's copy committed once every local rank's part is."""

    def __init__(self, place: RankPlace, hold: TierHold, voice: Voice) -> None:
        self._place, self._hold, self._voice = place, hold, voice
        self.last_saved: SaveTarget | None = None

    @contextmanager
    def save_files(self, step: int) -> Iterator[Path]:
        """See Checkpointer.save_files."""
        began = time.monotonic()
        target = self._begin_save(step)
        if target is None:
            scratch = Path(tempfile.mkdtemp(prefix="clusterctl-unsaved-"))
            try:
                yield scratch
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        try:
            yield target.staging
        except OSError as exc:
            self._voice.say(f"step {step} is not saved on {self._place.node}: writing {target.staging} failed "
                            f"({exc.strerror or exc}); training goes on")
            return
        self._finish_save(target, time.monotonic() - began)

    def _name(self, kind: str, step: int) -> str:
        """This attempt's `.tmp-<kind>-` folder of step `step` in the node's tier."""
        return f".tmp-{kind}-{step:012d}-{self._place.attempt}"

    def _control_dir(self, step: int) -> Path:
        if self._hold.tier is not None:
            return self._hold.tier.root / self._name("save", step)
        return (self._place.shared_dir / "tiers" / step_name(step)
                / f".tmp-save-{slot_name(self._place.slot)}-{self._place.attempt}")

    def _begin_save(self, step: int) -> SaveTarget | None:
        place = self._place
        try:
            control = self._control_dir(step)
            try:
                control.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError:
                if self._hold.tier is None:
                    raise
                # And so the next saves go to shared storage directly, too.
                self._hold.give_up(f"the node's checkpoint directory {self._hold.tier.root} is not writable")
                control = self._control_dir(step)
                control.mkdir(mode=0o700, parents=True, exist_ok=True)
            where = control / "where"
            decision = where.read_text() if where.exists() else None
            won = False
            if decision is None:
                decision, won = publish_once(where, self._decide(step))
            tier, _, reason = decision.partition("\n")
            if tier == LOCAL and self._hold.tier is not None:
                staging = self._hold.tier.root / self._name("step", step)
            else:
                tier = "shared"
                if won:
                    self._voice.say_once("shared", f"{place.node}: saving step {step} to shared storage directly, "
                                                   f"not the node's local tier: {reason} (said once; any later save "
                                                   "that does not fit goes there too)")
                staging = (place.shared_dir / "tiers" / step_name(step)
                           / f".tmp-{slot_name(place.slot)}-{place.attempt}")
            staging.mkdir(mode=0o700, parents=True, exist_ok=True)
            return SaveTarget(step, control, staging, tier)
        except OSError as exc:
            self._voice.say(f"step {step} is not saved on {place.node}: neither the local tier nor shared storage "
                            f"can be written ({exc}); training goes on")
            return None

    def _decide(self, step: int) -> str:
        """Where the node saves step `step` (the first local rank to save it decides for all): `local`,
        or `shared` and why."""
        tier = self._hold.tier
        if tier is None:
            return f"shared\n{self._hold.problem}"
        attempt = self._place.attempt
        mine = (".tmp-save-", ".tmp-step-", ".tmp-stage-", ".tmp-resume-", ".committer-")
        # Saves of this attempt still being committed in the background (every rank done) are kept too.
        pending = [c.name.split("-")[2] for c in tier.root.glob(f".tmp-save-*-{attempt}")
                   if (c / READY).exists()]
        tier.clean_stale(mine, keep=(self._name("save", step), self._name("step", step),
                                     f".tmp-resume-{attempt}", committer_marker(tier.root, attempt).name,
                                     *(f".tmp-save-{n}-{attempt}" for n in pending),
                                     *(f".tmp-step-{n}-{attempt}" for n in pending)))
        try:
            copies = tier.copies_on_disk()
            own = sorted((c for c in copies if c.tier == LOCAL), key=lambda c: c.step)
            estimate = own[-1].size if own else 0  # a save is about as large as the one before it
            budget = budget_bytes(self._place.settings.local_budget_bytes, tier.filesystem_bytes())
            room = plan_room(copies, estimate, self._place.settings.keep, budget)
            if room is None:
                held = sum(c.size for c in copies)
                return (f"shared\nthe local tier's budget is {budget} bytes; it holds {held} and this save needs "
                        f"about {estimate} more")
            with self._hold.lock:
                tier.remove(room)
            probe = tier.root / self._name("step", step)
            probe.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            return f"shared\nthe node's checkpoint directory {tier.root} cannot be written ({exc.strerror})"
        return LOCAL

    def _finish_save(self, target: SaveTarget, seconds: float) -> None:
        try:
            self.last_saved = target
            if not mark_done(target.control, self._place.local_rank, self._place.local_ranks):
                return
            tier = self._hold.tier
            if target.tier == LOCAL and tier is not None and committer_marker(tier.root, self._place.attempt).exists():
                # Hashing every shard (for the manifest) takes about as long as writing it: the node's first
                # rank does it in the background, so training waits only for the write to memory.
                publish_once(target.control / READY, f"{seconds:.6f}")
                return
            shards = shards_of(target.staging)
            if target.tier == LOCAL:
                self._commit_local(target, shards, seconds)
            else:
                self._commit_shared(target.staging, target.step, shards, seconds)
            shutil.rmtree(target.control, ignore_errors=True)
        except (OSError, CopyError, ValueError) as exc:
            shutil.rmtree(target.control, ignore_errors=True)
            self._commit_failed(target.step, exc)

    def _commit_failed(self, step: int, exc: Exception) -> None:
        self._voice.say(f"step {step} is not saved on {self._place.node}: committing the node's copy failed "
                        f"({exc}); training goes on")

    def commit_ready(self) -> None:
        """Local rank 0's background work: commit the node's saves whose every rank is done (READY), oldest
        first: list and hash the shards, write the manifest, rename into place."""
        tier = self._hold.tier
        assert tier is not None
        for control in sorted(tier.root.glob(f".tmp-save-*-{self._place.attempt}")):
            if not (control / READY).exists():
                continue
            step = int(control.name.split("-")[2])
            target = SaveTarget(step, control, tier.root / self._name("step", step), LOCAL)
            try:
                seconds = float((control / READY).read_text() or 0)
                self._commit_local(target, shards_of(target.staging), seconds)
            except (OSError, CopyError, ValueError) as exc:
                self._commit_failed(step, exc)
            shutil.rmtree(control, ignore_errors=True)

    def wait_for_last_commit(self, timeout: float, *, commit: bool) -> None:
        """Wait, at most `timeout` seconds, until the node's copy of the last step this rank saved locally
        is committed, whichever way it went (the committer removes the control folder); `commit`: nobody
        else commits the node's saves, this rank does."""
        last = self.last_saved
        if last is not None and last.tier == LOCAL:
            deadline = time.monotonic() + timeout
            # The last local rank commits (rank 0 may finish its part first).
            while last.control.exists() and time.monotonic() < deadline:
                if commit:
                    self.commit_ready()
                time.sleep(0.05)

    def _commit_local(self, target: SaveTarget, shards: tuple[Any, ...], seconds: float) -> None:
        tier = self._hold.tier
        assert tier is not None
        place = self._place
        manifest = CheckpointManifest(step=target.step, of_node=place.node, tier=LOCAL, held_on=place.node,
                                      shards=shards, written_at=time.time(), save_seconds=round(seconds, 6),
                                      slot=place.slot, slots=place.slots)
        others = sum(c.size for c in tier.copies_on_disk() if not (c.tier == LOCAL and c.step == target.step))
        budget = budget_bytes(place.settings.local_budget_bytes, tier.filesystem_bytes())
        if others + manifest.total_bytes > budget:
            # Larger than the estimate the decision was made on: moved to shared storage, never left half-kept.
            shared = flush_copy(target.staging, manifest, place.shared_dir, place.slot, Throttle(0))
            tier.note_flushed(shared)
            shutil.rmtree(target.staging, ignore_errors=True)
            self._voice.say_once("shared", f"{place.node}: step {target.step}'s copy ({manifest.total_bytes} bytes) "
                                           f"went to shared storage: the local tier's budget is {budget} bytes and "
                                           f"it holds {others}")
            return
        commit_copy(target.staging, tier.local_copy(target.step), manifest)

    def _commit_shared(self, staging: Path, step: int, shards: tuple[Any, ...], seconds: float) -> None:
        place = self._place
        manifest = CheckpointManifest(step=step, of_node=place.node, tier="shared", held_on=None, shards=shards,
                                      written_at=time.time(), save_seconds=round(seconds, 6), slot=place.slot,
                                      slots=place.slots)
        done = commit_copy(staging, shared_copy_dir(place.shared_dir, step, place.slot), manifest)
        if self._hold.tier is not None:
            self._hold.tier.note_flushed(done)
