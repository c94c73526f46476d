"""A node's tier: where the node keeps its own copies and its buddies' copies, how the node's local
ranks commit one copy together, what retention removes, whether a save fits the budget, and the
holdings record that tells the agent what the node holds.

    <tier root>/                       settings.tier_root(node): 0700, ours, never a symlink
      local/step-<N:012d>/             this node's part of step N + manifest.json (tier local)
      buddy/<of_node>/step-<N:012d>/   of_node's part, kept for it (tier buddy)
      flushed/step-<N:012d>.json       the manifest of a copy this node wrote to shared storage
      .tmp-*                           being written; removed at the next save
      holdings.json                    CheckpointHoldings
      holdings.lock                    flock: one process of the node rewrites holdings.json at a time
      stage.lock                       flock: one local rank stages a resume copy

The deciding parts (`retention_victims`, `plan_room`, `flush_due`, `budget_bytes`) are pure
functions of what is on disk, given as `CopyOnDisk` values; `NodeTier` reads the disk and acts.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from clusterctl.checkpoint.copies import MANIFEST_NAME
from clusterctl.files import UnsafePathError, check_owned, open_checked_dir
from clusterctl.records.checkpoint_holdings import (
    HOLDINGS_NAME,
    MAX_HELD,
    CheckpointHoldings,
    CopyRefusals,
    HeldCopy,
    LastResume,
    read_holdings,
    write_holdings,
)
from clusterctl.records.checkpoint_manifest import CheckpointManifest, read_checkpoint_manifest, write_checkpoint_manifest
from clusterctl.records.versioned import RecordError

LOCAL, BUDDY, FLUSHED = "local", "buddy", "flushed"
STAGE_LOCK = "stage.lock"
HOLDINGS_LOCK = "holdings.lock"
TMP_PREFIX = ".tmp-"
_STEP = re.compile(r"step-(\d{12})")


class TierRootError(UnsafePathError):
    """The node's tier root is not a private directory of this user (planted, a symlink, open to others).

    `path` is the folder refused, `owner` the uid that owns it and `problem` what is wrong with it (None and
    '' when the base itself is refused)."""

    def __init__(self, message: str, path: Path | None = None, owner: int | None = None, problem: str = "") -> None:
        super().__init__(message)
        self.path, self.owner, self.problem = path, owner, problem


def step_name(step: int) -> str:
    """The folder name of step `step`'s copy: `step-000000000120`."""
    return f"step-{step:012d}"


def slot_name(slot: int) -> str:
    """The folder name of slot `slot`'s copy on shared storage: `slot-000003`."""
    return f"slot-{slot:06d}"


def shared_copy_dir(shared_dir: Path, step: int, slot: int) -> Path:
    """Where slot `slot`'s copy of step `step` lies on shared storage."""
    return shared_dir / "tiers" / step_name(step) / slot_name(slot)


def parse_step_name(name: str) -> int | None:
    """The step of a `step-<N:012d>` folder name; None for any other name."""
    match = _STEP.fullmatch(name)
    return int(match.group(1)) if match else None


# ---- deciding (pure) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CopyOnDisk:
    """One complete copy in a node's tier: `local` (of_node = the node) or `buddy` (kept for of_node)."""

    tier: str
    of_node: str
    step: int
    size: int


def retention_victims(copies: Iterable[CopyOnDisk], keep: int) -> list[CopyOnDisk]:
    """The copies retention removes: all but the newest `keep` steps of each (tier, of_node) group.

    The newest copy of a group is never removed, even with `keep` < 1 (the newest complete copy
    is what a resume needs)."""
    kept = max(keep, 1)
    groups: dict[tuple[str, str], list[CopyOnDisk]] = {}
    for copy in copies:
        groups.setdefault((copy.tier, copy.of_node), []).append(copy)
    victims: list[CopyOnDisk] = []
    for group in groups.values():
        victims.extend(sorted(group, key=lambda c: c.step, reverse=True)[kept:])
    return sorted(victims, key=lambda c: (c.tier, c.of_node, c.step))


def abandoned_copies(copies: Iterable[CopyOnDisk], resume_step: int | None) -> list[CopyOnDisk]:
    """The copies a resume from `resume_step` leaves behind for good: those of later steps (saved on the
    timeline the failure ended; a later save of the same step number on the new timeline must never be
    mixed with them), every copy for a fresh start (None)."""
    return sorted((c for c in copies if resume_step is None or c.step > resume_step),
                  key=lambda c: (c.tier, c.of_node, c.step))


def plan_room(copies: Sequence[CopyOnDisk], estimate: int, keep: int, budget: int) -> list[CopyOnDisk] | None:
    """Which copies to remove before a local save of about `estimate` bytes so that the tier stays
    within `budget` bytes while the new copy is written; None when it cannot fit.

    Removed are only copies retention would remove once the new copy is committed: local copies
    beyond the newest `keep - 1` (but never the newest local copy: it is the only complete one
    until the new one is), and buddy copies beyond the newest `keep` of each node."""
    local = [c for c in copies if c.tier == LOCAL]
    others = [c for c in copies if c.tier != LOCAL]
    victims = retention_victims(local, keep - 1) + retention_victims(others, keep)
    gone = set(victims)
    remaining = sum(c.size for c in copies if c not in gone)
    return victims if remaining + estimate <= budget else None


def flush_due(step: int, every: int) -> bool:
    """Whether step `step`'s copy goes to shared storage: every step when `every` is 0, else every `every`-th."""
    return every <= 0 or step % every == 0


def budget_bytes(setting: int, filesystem_bytes: int) -> int:
    """The local tier's budget: the setting, or a quarter of the filesystem when it is 0."""
    return setting if setting > 0 else filesystem_bytes // 4


def holdings_of(node: str, manifests: Iterable[CheckpointManifest], flushed: Iterable[CheckpointManifest],
                now: float, last_resume: LastResume | None = None,
                copies_refused: CopyRefusals | None = None) -> CheckpointHoldings:
    """The node's holdings: every complete copy in its tier, and every copy it wrote to shared storage
    (newest first, at most MAX_HELD of them), with the node's newest resume and what its copy server refused."""
    held = [HeldCopy(step=m.step, of_node=m.of_node, tier=m.tier, slot=m.slot, slots=m.slots,
                     written_at=m.written_at, save_seconds=m.save_seconds) for m in manifests]
    held += [HeldCopy(step=m.step, of_node=m.of_node, tier="shared", slot=m.slot, slots=m.slots,
                      written_at=m.written_at, save_seconds=m.save_seconds) for m in flushed]
    held.sort(key=lambda h: (-h.step, h.tier, h.of_node))
    return CheckpointHoldings(node=node, copies=tuple(held[:MAX_HELD]), written_at=now, last_resume=last_resume,
                              copies_refused=copies_refused)


# ---- the tier root ------------------------------------------------------------------------------

def open_tier_root(root: Path, base: Path, *, uid: int | None = None, job_id: str = "") -> Path:
    """Make (or reuse) the node's tier root `root` below `base`
    (`<base>/clusterctl-<uid>/ckpt-<run key>/<node>`: settings.tier_root); its path.  `job_id` (Slurm's) is
    noted in the run's folder (root's parent) as `.job-<id>`: the prolog never reclaims a run's tier while a
    job it notes runs on the node (healthd/stale_tiers.py).

    Every folder below `base` is made 0700 and must be a real directory of `uid`, private to it:
    TierRootError (saying what to do) when one is planted, a symlink or open to others; each is
    opened relative to the one checked before it, so none can be swapped for a symlink between the
    check and the use.  OSError when they cannot be made (a read-only or full filesystem): the caller
    saves to shared storage instead."""
    uid = os.getuid() if uid is None else uid
    parts = root.relative_to(base).parts
    os.makedirs(base, mode=0o700, exist_ok=True)
    try:
        fd = open_checked_dir(base)
    except UnsafePathError as exc:
        raise TierRootError(f"cannot keep checkpoints in {base}: {exc}; point the job's local checkpoint "
                            "directory elsewhere") from None
    try:
        path = base
        for depth, name in enumerate(parts):
            path = path / name
            _make_private(fd, name, path, uid)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
            if depth == len(parts) - 2 and job_id.isascii() and job_id.isdigit() and len(job_id) <= 20:
                _note_job(fd, job_id)
    finally:
        os.close(fd)
    return root


def _note_job(run_fd: int, job_id: str) -> None:
    try:
        os.close(os.open(f".job-{job_id}", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=run_fd))
    except OSError:
        pass  # a full tmpfs: the tier works without it, kept by its last use only


def _make_private(parent_fd: int, name: str, path: Path, uid: int) -> None:
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    problem = check_owned(info, uid=uid, kind="directory", private=True)
    if problem is not None:
        raise TierRootError(f"{path}: {problem}; refusing to keep checkpoints there (planted by another "
                            "user?): remove it, or point the job's local checkpoint directory elsewhere",
                            path, info.st_uid, problem)


def remove_tree(path: Path) -> None:
    """Remove a copy: renamed to a `.tmp-` name first, so no reader ever sees half of it."""
    trash = path.with_name(f"{TMP_PREFIX}trash-{path.name}-{os.urandom(4).hex()}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return  # removed by another thread or rank
    shutil.rmtree(trash, ignore_errors=True)


def attempt_token(environ: Mapping[str, str]) -> str:
    """Names this step's attempt in staging folders, the same in every local rank of the node: what a
    crashed attempt left (for the same step, even) is never mistaken for this one's files."""
    seed = environ.get("CLUSTERCTL_NODE_DIR") or ":".join(
        environ.get(k, "") for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID"))
    return hashlib.sha256(seed.encode()).hexdigest()[:8]


# ---- committing a copy together ----------------------------------------------------------------

def mark_done(control: Path, local_rank: int, local_ranks: int) -> bool:
    """This local rank's part is written: mark it in `control`; True when this rank is the one to commit
    the node's copy (every rank's mark is there and this rank claimed the commit).

    Each rank marks, then counts: the last to mark sees every mark.  Two that both see every mark
    race for one O_EXCL file; exactly one wins.  No lock is needed, so the same works on shared
    storage when the node's tier is unusable."""
    fd = os.open(control / f"rank-{local_rank}", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.close(fd)
    done = sum(1 for name in os.listdir(control) if name.startswith("rank-"))
    if done < local_ranks:
        return False
    try:
        os.close(os.open(control / "commit", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        return False
    return True


def publish_once(path: Path, text: str) -> tuple[str, bool]:
    """Write `text` to `path` unless another rank did first: the text that is there (all of it, never
    half) and whether it is this caller's."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    tmp.write_text(text)
    try:
        os.link(tmp, path)
        won = True
    except FileExistsError:
        won = False
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_text(), won


def commit_copy(staging: Path, final: Path, manifest: CheckpointManifest) -> CheckpointManifest:
    """Complete the copy in `staging`, whose shards `manifest` lists: the manifest written last (its
    `written_at` now), then the folder renamed to `final` (an older folder there is removed first)."""
    complete = CheckpointManifest(step=manifest.step, of_node=manifest.of_node, tier=manifest.tier,
                                  held_on=manifest.held_on, shards=manifest.shards, written_at=time.time(),
                                  save_seconds=manifest.save_seconds, slot=manifest.slot, slots=manifest.slots)
    write_checkpoint_manifest(staging / MANIFEST_NAME, complete)
    if final.exists():
        remove_tree(final)  # the same step saved again after a resume from an older one
    final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.rename(staging, final)
    fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return complete


# ---- a node's tier on disk ------------------------------------------------------------------------

class NodeTier:
    """The tier root of `node` (already opened with `open_tier_root`): its paths and what it holds."""

    def __init__(self, root: Path, node: str) -> None:
        self.root, self.node = root, node
        self._manifests: dict[Path, tuple[float, CheckpointManifest | None]] = {}

    @property
    def local_dir(self) -> Path:
        """`<root>/local`: this node's own copies."""
        return self.root / LOCAL

    def local_copy(self, step: int) -> Path:
        """This node's copy of step `step`."""
        return self.local_dir / step_name(step)

    def buddy_copy(self, of_node: str, step: int) -> Path:
        """`of_node`'s copy of step `step`, kept here for it."""
        return self.root / BUDDY / of_node / step_name(step)

    def flushed_note(self, step: int) -> Path:
        """The note that this node wrote its copy of step `step` to shared storage."""
        return self.root / FLUSHED / f"{step_name(step)}.json"

    @property
    def holdings_path(self) -> Path:
        """`<root>/holdings.json`."""
        return self.root / HOLDINGS_NAME

    @property
    def stage_lock(self) -> Path:
        """`<root>/stage.lock`."""
        return self.root / STAGE_LOCK

    @property
    def holdings_lock(self) -> Path:
        """`<root>/holdings.lock`, held while holdings.json is read and rewritten."""
        return self.root / HOLDINGS_LOCK

    def manifest(self, copy_dir: Path) -> CheckpointManifest | None:
        """The manifest of the copy in `copy_dir`, None when it is incomplete or unreadable
        (cached by the manifest's mtime: the background thread asks every poll)."""
        path = copy_dir / MANIFEST_NAME
        try:
            mtime = os.stat(path, follow_symlinks=False).st_mtime
        except OSError:
            self._manifests.pop(path, None)
            return None
        cached = self._manifests.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            manifest: CheckpointManifest | None = read_checkpoint_manifest(path)
        except (OSError, RecordError):
            manifest = None
        self._manifests[path] = (mtime, manifest)
        return manifest

    def local_copies(self) -> list[tuple[Path, CheckpointManifest]]:
        """This node's complete local copies, oldest first."""
        return [(path, m) for path in _step_dirs(self.local_dir) if (m := self.manifest(path)) is not None]

    def buddy_copies(self) -> list[tuple[Path, CheckpointManifest]]:
        """The complete copies kept here for other nodes, by node then step."""
        found: list[tuple[Path, CheckpointManifest]] = []
        for of_dir in _subdirs(self.root / BUDDY):
            found += [(path, m) for path in _step_dirs(of_dir) if (m := self.manifest(path)) is not None]
        return found

    def flushed(self) -> list[CheckpointManifest]:
        """The manifests of the copies this node wrote to shared storage (its notes), oldest first."""
        notes: list[CheckpointManifest] = []
        for path in sorted((self.root / FLUSHED).glob("step-*.json")):
            try:
                notes.append(read_checkpoint_manifest(path))
            except (OSError, RecordError):
                continue
        return notes

    def note_flushed(self, manifest: CheckpointManifest) -> None:
        """Remember that this node wrote `manifest`'s copy to shared storage (for the holdings)."""
        os.makedirs(self.root / FLUSHED, mode=0o700, exist_ok=True)
        write_checkpoint_manifest(self.flushed_note(manifest.step), manifest)

    def copies_on_disk(self) -> list[CopyOnDisk]:
        """Every complete copy in the tier, as the pure deciders take them."""
        return [CopyOnDisk(m.tier, m.of_node, m.step, m.total_bytes)
                for _, m in self.local_copies() + self.buddy_copies()]

    def remove(self, victims: Iterable[CopyOnDisk]) -> None:
        """Remove these copies (and flushed notes older than every copy kept locally)."""
        for victim in victims:
            path = self.local_copy(victim.step) if victim.tier == LOCAL else self.buddy_copy(victim.of_node,
                                                                                              victim.step)
            remove_tree(path)

    def apply_retention(self, keep: int) -> list[CopyOnDisk]:
        """Keep the newest `keep` local copies and the newest `keep` copies of each buddy; the removed ones."""
        victims = retention_victims(self.copies_on_disk(), keep)
        self.remove(victims)
        notes = sorted((self.root / FLUSHED).glob("step-*.json"))
        for note in notes[:-max(keep, 1)]:
            note.unlink(missing_ok=True)
        return victims

    def write_holdings(self, resumed: LastResume | None = None, refused: CopyRefusals | None = None, *,
                       serving: bool = False) -> CheckpointHoldings:
        """Rewrite holdings.json from what is on disk, with `resumed` as the node's newest resume (None: the
        one the file holds now: a resume is staged by whichever local rank takes stage.lock, the file is
        rewritten by the node's first rank too); the holdings written.  `serving`: this process runs the
        node's copy server, which refused `refused` (None: nothing); else the file's refusals are kept.

        The node's ranks are separate processes (the stager records the resume, local rank 0's thread
        rewrites after every change): each reads the resume the file carries and writes it back, so the
        whole rewrite holds `holdings.lock`, else a rewrite that read the file just before the stager wrote
        its resume would write the old one back, and the agent would never hear of the resume."""
        with flocked(self.holdings_lock):
            if resumed is None or not serving:
                try:
                    before = read_holdings(self.holdings_path)
                except (OSError, RecordError):
                    before = None
                if resumed is None:
                    resumed = before.last_resume if before is not None else None
                if not serving:
                    refused = before.copies_refused if before is not None else None
            holdings = holdings_of(self.node, [m for _, m in self.local_copies() + self.buddy_copies()],
                                   self.flushed(), time.time(), resumed, refused)
            write_holdings(self.holdings_path, holdings)
        return holdings

    def filesystem_bytes(self) -> int:
        """The size of the filesystem the tier lies on."""
        info = os.statvfs(self.root)
        return info.f_blocks * info.f_frsize

    def clean_stale(self, prefixes: Sequence[str], keep: Iterable[str]) -> None:
        """Remove the root's entries whose names start with one of `prefixes`, except those named in
        `keep` (what a crashed save or an earlier attempt left)."""
        kept = set(keep)
        for entry in os.scandir(self.root):
            if not entry.name.startswith(tuple(prefixes)) or entry.name in kept:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass


@contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (made 0600, never through a symlink) for the block: between the
    node's processes (flock is per open file, so between threads of one process too)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(path)
                      if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
    except OSError:
        return []


def _step_dirs(path: Path) -> list[Path]:
    return [p for p in _subdirs(path) if parse_step_name(p.name) is not None]
