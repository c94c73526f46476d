"""A checkpointer's resume: the planned copy of this slot's files found, staged into the node's local
tier and verified (the node's own copy, the buddy's, shared storage; shared storage read in place when
the local tier cannot take it); or the resume-failed record written and the rank ended."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from clusterctl.checkpoint.copies import MANIFEST_NAME, ReceivedCopy, copy_verified, link_shards, verify_copy
from clusterctl.checkpoint.link import CopyLink
from clusterctl.checkpoint.place import RankPlace, TierHold, Voice
from clusterctl.checkpoint.tier import LOCAL, abandoned_copies, commit_copy, flocked, shared_copy_dir
from clusterctl.records.checkpoint_holdings import LastResume
from clusterctl.records.checkpoint_manifest import CheckpointManifest, read_checkpoint_manifest
from clusterctl.records.resume_failure import EXIT_RESUME_FAILED, BadCopy, ResumeFailure, write_resume_failure
from clusterctl.records.tier_index import NONE
from clusterctl.records.versioned import RecordError

PEER_START_SECONDS = 60.0
"""How long a fetch waits for the peer's copy server to come up (every node's first rank starts one as
the step starts, so a resume on one node may ask before another node's server listens)."""


@dataclass(frozen=True)
class Resume:
    """The checkpoint to resume from: its step, and the directory holding this node's slot's files
    (in the node's local tier, staged and verified; on shared storage when the local tier is unusable).
    `source` says where the files came from in a user's words (`this node's own copy`, `node2's copy
    on node3`, `shared storage`), `seconds` what staging them took; `tier` the tier they came from
    (`local`: this node's own copy; `buddy`: `of_node`'s copy held on node `held_on`; `shared`)."""

    step: int
    directory: Path
    source: str = ""
    seconds: float = 0.0
    tier: str = ""
    of_node: str = ""
    held_on: str = ""


class Resumer:
    """`Checkpointer.resume()`: finds, stages and verifies step `resume_step`'s copy of this slot's files
    (None: a fresh start).  `resumed` is what it found, `bad_copies` the copies it passed over."""

    def __init__(self, place: RankPlace, hold: TierHold, voice: Voice, link: CopyLink,
                 resume_step: int | None) -> None:
        self._place, self._hold, self._voice, self._link = place, hold, voice, link
        self._resume_step = resume_step
        self.resumed: Resume | None = None
        self.bad_copies: tuple[BadCopy, ...] = ()

    def resume(self) -> Resume | None:
        """See Checkpointer.resume."""
        step = self._resume_step
        if step is None:
            if self._place.local_rank == 0:
                self._drop_abandoned(None)
            return None
        began = time.monotonic()
        tier = self._hold.tier
        if tier is None:
            resumed, bad = self._resume_in_place(step, [])
            return self._resumed_or_exit(step, self._timed(resumed, began), bad, failure_said=False)
        note = tier.root / f".tmp-resume-{self._place.attempt}"
        with flocked(tier.stage_lock):
            if note.exists():
                text = note.read_text()
                if text.startswith("ok "):
                    staged = json.loads(text[3:])
                    self.resumed = Resume(step, Path(staged["directory"]), staged["source"], staged["seconds"],
                                          staged.get("tier", ""), staged.get("of_node", ""),
                                          staged.get("held_on", ""))
                    return self.resumed
                return self._resumed_or_exit(step, None, [], failure_said=True)
            resumed, bad = self._stage(step)
            resumed = self._timed(resumed, began)
            if resumed is not None:
                self._drop_abandoned(step)
                self._record_resume(resumed)
            else:
                # Before the note: the node's other ranks exit at once on "failed", and the launcher (torchrun)
                # may then end this rank before it could write why (the agent would see a program failure).
                self._say_failure(step, bad)
            note.write_text("ok " + json.dumps({"directory": str(resumed.directory), "source": resumed.source,
                                                "seconds": resumed.seconds, "tier": resumed.tier,
                                                "of_node": resumed.of_node, "held_on": resumed.held_on})
                            if resumed else "failed")
        return self._resumed_or_exit(step, resumed, bad, failure_said=True)

    def _record_resume(self, resumed: Resume) -> None:
        """Put the resume in the node's holdings (its reporter carries it to the agent, which journals one
        line per resumed step: where every node's files came from and how long the slowest read took).
        A holdings file that cannot be written costs only that line's read time."""
        try:
            last = LastResume(resumed.step, resumed.tier or "shared", resumed.of_node or self._place.node,
                              resumed.held_on, resumed.seconds, time.time())
            with self._hold.lock:
                self._hold.rewrite_holdings(force=True, resumed=last)
        except (OSError, ValueError) as exc:
            self._voice.say(f"cannot record the resume in the node's checkpoint holdings ({exc})")

    def _drop_abandoned(self, step: int | None) -> None:
        """Remove this node's copies of steps after `step` (all for a fresh start): the old timeline's."""
        tier = self._hold.tier
        if tier is None:
            return
        with self._hold.lock:
            gone = abandoned_copies(tier.copies_on_disk(), step)
            tier.remove(gone)
            if gone:
                self._hold.rewrite_holdings(force=True)

    def _timed(self, resumed: Resume | None, began: float) -> Resume | None:
        """`resumed` with the time staging took, said in one line (by the rank that staged it)."""
        if resumed is None:
            return None
        resumed = dataclasses.replace(resumed, seconds=round(time.monotonic() - began, 3))
        self._voice.say(f"resuming step {resumed.step} on {self._place.node}: slot {self._place.slot}'s files from "
                        f"{resumed.source} in {resumed.seconds:.2f} s")
        return resumed

    def _resumed_or_exit(self, step: int, resumed: Resume | None, bad: list[BadCopy], *, failure_said: bool) -> Resume:
        self.bad_copies = tuple(bad)
        if resumed is not None:
            for copy in bad:
                self._voice.say(f"step {step}: passed over {copy.of_node}'s {copy.tier} copy"
                                f"{f' on {copy.held_on}' if copy.held_on and copy.tier == 'buddy' else ''}: "
                                f"the copy {copy.problem}")
            self.resumed = resumed
            return resumed
        if not failure_said:  # else the node's stager said why and wrote the record before it told the others
            self._say_failure(step, bad)
        raise SystemExit(EXIT_RESUME_FAILED)

    def _say_failure(self, step: int, bad: list[BadCopy]) -> None:
        """Say why no copy of this slot's files of `step` verifies and write the node's failure record."""
        problems = "; ".join(f"the {b.tier} copy {b.problem}" for b in bad) or "no copy was found"
        why = f"no copy of slot {self._place.slot}'s files of step {step} verifies ({problems})"
        where = ""
        if self._place.settings.tier_index:
            path = write_resume_failure(Path(self._place.settings.tier_index).parent,
                                        ResumeFailure(node=self._place.node, step=step, why=why, bad_copies=tuple(bad)))
            where = f"; wrote {path}"
        self._voice.say(f"cannot resume on {self._place.node}: {why}{where}; exiting with {EXIT_RESUME_FAILED}")

    def _stage(self, step: int) -> tuple[Resume | None, list[BadCopy]]:
        tier = self._hold.tier
        assert tier is not None
        place = self._place
        bad: list[BadCopy] = []
        line = place.line
        planned = line.tier if line is not None else NONE
        own = tier.local_copy(step)
        manifest = tier.manifest(own) if planned in (LOCAL, NONE) else None
        # The plan's tier first, then the farther ones: a nearer copy the plan passed over may be of
        # an earlier save of the same step (before a resume from an older one), not the plan's.
        if manifest is not None and (manifest.slot, manifest.slots) == (place.slot, place.slots):
            problem = verify_copy(own, manifest)
            if not problem:
                return Resume(step, own, "this node's own copy", tier=LOCAL, of_node=place.node,
                              held_on=place.node), bad
            bad.append(BadCopy(step, manifest.of_node, "local", place.node, problem))
        if line is not None and line.tier == "buddy" and line.held_on not in (NONE, ""):
            try:
                staging = self._fresh_dir(f".tmp-stage-{step:012d}-{place.attempt}")
            except OSError:
                return self._resume_in_place(step, bad)  # nowhere to stage: shared storage, read in place
            try:
                if line.held_on == place.node:
                    # Kept here already: linked into the staging folder (no byte moves), then hashed once.
                    source = tier.buddy_copy(line.of_node, step)
                    fetched = read_checkpoint_manifest(source / MANIFEST_NAME)
                    link_shards(source, staging, [s.name for s in fetched.shards])
                    problem = self._check_staged(staging, fetched, step)
                else:
                    # The transport hashed every byte as it wrote it: its measurements are checked
                    # against the manifest instead of reading the copy a second time.
                    received = self._fetch_waiting(line.held_on, line.of_node, step, staging)
                    fetched = received.manifest
                    problem = self._check_identity(fetched, step) or received.problem()
            except Exception as exc:  # a dead, unreachable or refusing buddy is one more bad copy
                problem = f"cannot be fetched ({exc})"
            if not problem and (resumed := self._commit_staged(staging, fetched, step)) is not None:
                return resumed, bad
            if not problem:
                return self._resume_in_place(step, bad)
            bad.append(BadCopy(step, line.of_node, "buddy", line.held_on, problem))
            shutil.rmtree(staging, ignore_errors=True)
        return self._resume_from_shared(step, bad)

    def _fetch_waiting(self, host: str, of_node: str, step: int, staging: Path) -> ReceivedCopy:
        """Fetch through the transport, trying again while the peer's server is not up yet (every node's
        first rank starts its server as the step starts), for at most PEER_START_SECONDS."""
        deadline = time.monotonic() + PEER_START_SECONDS
        while True:
            try:
                return self._link.fetch(host, of_node, step, staging)
            except Exception as exc:
                if not getattr(exc, "retryable", False) or time.monotonic() >= deadline:
                    raise
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(mode=0o700)
            time.sleep(0.5)

    def _resume_from_shared(self, step: int, bad: list[BadCopy]) -> tuple[Resume | None, list[BadCopy]]:
        tier = self._hold.tier
        assert tier is not None
        place = self._place
        source = shared_copy_dir(place.shared_dir, step, place.slot)
        of_node = place.line.of_node if place.line is not None and place.line.of_node != NONE else place.node
        try:
            manifest = read_checkpoint_manifest(source / MANIFEST_NAME)
        except FileNotFoundError:
            bad.append(BadCopy(step, of_node, "shared", None, f"is not on shared storage ({source})"))
            return None, bad
        except (OSError, RecordError) as exc:
            bad.append(BadCopy(step, of_node, "shared", None, f"has an unreadable manifest ({exc})"))
            return None, bad
        staging = tier.root / f".tmp-stage-{step:012d}-{place.attempt}"
        problem = self._check_identity(manifest, step)
        try:
            self._fresh_dir(staging.name)
            # Hashed as it is copied: shared storage is read once and the staged copy not again.
            problem = problem or copy_verified(source, staging, manifest)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            return self._resume_in_place(step, bad)  # the local tier is full or broken: read shared directly
        if problem:
            shutil.rmtree(staging, ignore_errors=True)
            bad.append(BadCopy(step, manifest.of_node, "shared", None, problem))
            return None, bad
        resumed = self._commit_staged(staging, manifest, step)
        return (resumed, bad) if resumed is not None else self._resume_in_place(step, bad)

    def _resume_in_place(self, step: int, bad: list[BadCopy]) -> tuple[Resume | None, list[BadCopy]]:
        source = shared_copy_dir(self._place.shared_dir, step, self._place.slot)
        try:
            manifest = read_checkpoint_manifest(source / MANIFEST_NAME)
        except (OSError, RecordError) as exc:
            bad.append(BadCopy(step, self._place.node, "shared", None, f"cannot be read ({exc})"))
            return None, bad
        problem = self._check_staged(source, manifest, step)
        if problem:
            bad.append(BadCopy(step, manifest.of_node, "shared", None, problem))
            return None, bad
        return Resume(step, source, "shared storage (read in place)", tier="shared", of_node=manifest.of_node), bad

    def _check_staged(self, directory: Path, manifest: CheckpointManifest, step: int) -> str:
        return self._check_identity(manifest, step) or verify_copy(directory, manifest)

    def _check_identity(self, manifest: CheckpointManifest, step: int) -> str:
        if (manifest.step, manifest.slot) != (step, self._place.slot):
            return f"is of step {manifest.step}, slot {manifest.slot}, not step {step}, slot {self._place.slot}"
        return ""

    def _commit_staged(self, staging: Path, source: CheckpointManifest, step: int) -> Resume | None:
        """The verified copy in `staging` made this node's local copy of `step`; None when the local
        tier cannot take it (the caller reads shared storage in place)."""
        tier = self._hold.tier
        assert tier is not None
        node = self._place.node
        local = CheckpointManifest(step=step, of_node=node, tier=LOCAL, held_on=node,
                                   shards=source.shards, written_at=source.written_at,
                                   save_seconds=source.save_seconds, slot=self._place.slot, slots=self._place.slots)
        try:
            (staging / MANIFEST_NAME).unlink(missing_ok=True)
            commit_copy(staging, tier.local_copy(step), local)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            return None
        where = "shared storage" if source.tier == "shared" else \
            f"{source.of_node}'s copy on {source.held_on}" if source.held_on and source.held_on != node else \
            f"{source.of_node}'s copy kept on this node"
        shared = source.tier == "shared"
        return Resume(step, tier.local_copy(step), where, tier="shared" if shared else "buddy",
                      of_node=source.of_node, held_on="" if shared else source.held_on or node)

    def _fresh_dir(self, name: str) -> Path:
        tier = self._hold.tier
        assert tier is not None
        path = tier.root / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o700)
        return path
