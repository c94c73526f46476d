"""Which checkpoint tiers left on a node the prolog reclaims (pure): what the node holds → what to remove, and why.

A run's copies on a node live in `<base>/clusterctl-<uid>/ckpt-<run key>/<node>` (`CheckpointSettings.tier_root`).
`Checkpointer.close()` empties them when training is done; a job that ends otherwise (a node lost, a time
limit, cancelled) keeps them for the resume that follows, and a resubmission that lands on the same node
reads its own copy.  When no such resume comes, they would hold the node's memory (/dev/shm is tmpfs) or
disk for good.  The prolog, root on every node before a job starts, asks `stale_tiers` what to reclaim in
the admin's tier bases (healthd.toml `tier_bases`) and removes that through a door (healthd/node_tiers.py):

- a `clusterctl-<uid>` directory of **another** user than the starting job's: whole, when no process of that
  user runs on the node and no job of theirs is on it (its prolog ran and its epilog has not: its processes
  may not be up yet, or be between two steps; a note from before the node booted is a crash's leftover);
- of the **starting job's own** user: only the `ckpt-<run key>` trees not used for `tier_keep_hours` whose job
  is not running here: a resubmission of the same user keeps its fast resume, and a long job that checkpoints
  rarely keeps its tier however long it goes unchanged.  A run's tier notes the jobs that used it
  (`ckpt-<run key>/.job-<id>`, made by the checkpoint code); a job runs here while its prolog's note is there
  and its epilog has not removed it, or while a process sits in its Slurm cgroup (`…/job_<id>/…`): node-local
  facts, nothing asked of slurmctld.  A tier that notes no job (an older clusterctl's) is kept while any other
  job of its user runs here;
- what an interrupted reclaim left (`.clusterctl-reclaim-*`, a name nothing else uses).

Only the exact layout is ever removed: a real directory (never a symlink) owned by the uid its name says,
that nobody else may write.  A `clusterctl-<uid>` **planted** by another user (not root) is moved aside: renamed
in the same base to `.clusterctl-planted-<time>-<owner>-<uid>` (one rename relative to the base's fd: nothing is
followed, nothing of the planter's is read or deleted), so its uid's jobs can make their own directory again;
the moved tree is then the planter's, removed whole like any directory of theirs once nothing of theirs is on
the node.  Anything else named like a tier is left alone and said.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from clusterctl.records.healthd_job_start import JobStart

USER_DIR = re.compile(r"clusterctl-(0|[1-9][0-9]{0,9})")
"""A user's node-local directory in a tier base (clusterctl/node_dir.py, `tier_root`)."""
RUN_TREE = re.compile(r"ckpt-[0-9a-f]{16}")
"""One run's tier in a user's directory (`ckpt-<run key>`)."""
TRASH_PREFIX = ".clusterctl-reclaim-"
USER_TRASH = re.compile(r"\.clusterctl-reclaim-(0|[1-9][0-9]{0,9})-[0-9a-f]{8}")
"""A user's directory renamed by a reclaim before its removal (left behind when the prolog was stopped)."""
RUN_TRASH = re.compile(r"\.clusterctl-reclaim-ckpt-[0-9a-f]{16}-[0-9a-f]{8}")
"""A run's tier renamed by a reclaim before its removal."""
PLANTED_PREFIX = ".clusterctl-planted-"
PLANTED = re.compile(r"\.clusterctl-planted-[0-9]{1,12}-(0|[1-9][0-9]{0,9})-[0-9]{1,10}")
"""A `clusterctl-<uid>` planted by another user, moved aside by a prolog: `.clusterctl-planted-<time>-<owner>-<uid>`."""
JOB_NOTE = re.compile(r"\.job-([0-9]{1,20})")
"""In a run's tier (`ckpt-<run key>/`): a job that used it (made by the checkpoint code as the job starts)."""

DIRECTORY, SYMLINK, OTHER = "directory", "symlink", "other"
_GROUP_OR_OTHERS_WRITE = 0o022


def user_trash_name(uid: int, token: str) -> str:
    """What a user's directory is renamed to before it is removed (`token`: 8 hex digits)."""
    return f"{TRASH_PREFIX}{uid}-{token}"


def planted_name(now: float, owner: int, uid: int) -> str:
    """What a planted `clusterctl-<uid>` owned by `owner` is renamed to (`now`: epoch seconds)."""
    return f"{PLANTED_PREFIX}{int(now)}-{owner}-{uid}"


def job_note_name(job_id: str) -> str:
    """The note a job leaves in its run's tier (`job_id`: Slurm's, digits)."""
    return f".job-{job_id}"


def run_trash_name(run_tree: str, token: str) -> str:
    """What a run's tier `ckpt-<run key>` is renamed to before it is removed."""
    return f"{TRASH_PREFIX}{run_tree}-{token}"


@dataclass(frozen=True)
class Entry:
    """One directory entry as lstat saw it (a symlink is never followed)."""

    name: str
    kind: str  # DIRECTORY, SYMLINK or OTHER
    owner: int
    mode: int  # the permission bits
    last_used: float | None = None
    """A run's tier of the starting job's user: the newest modification time of any directory in it (a save,
    a buddy's copy and a holdings rewrite each rename into one); None when the door did not look."""
    jobs: tuple[str, ...] = ()
    """A run's tier of the starting job's user: the jobs it notes (`.job-<id>`), the ones that used it."""


@dataclass(frozen=True)
class UserDir:
    """An entry of a tier base named like a user's directory or a reclaim's leftover, with the entries in it
    (listed only when it is a real directory)."""

    base: str
    entry: Entry
    children: tuple[Entry, ...] = ()


@dataclass(frozen=True)
class NodeTiers:
    """What a node holds in its tier bases, and whose processes run on it."""

    dirs: tuple[UserDir, ...]
    running_uids: frozenset[int]
    """Every uid a process on the node runs as (real, effective or saved)."""
    notes: tuple[str, ...] = ()
    """Bases that could not be looked into, and why."""
    booted: float = 0.0
    """When the node booted (epoch seconds): a job-start note from before is a crash's leftover, not a job."""
    running_jobs: frozenset[str] = frozenset()
    """The Slurm job ids with a process on the node now (their cgroups)."""


@dataclass(frozen=True)
class ReclaimSettings:
    """Whose job starts, how long a run's tier of that user is kept unused, and the time now (epoch seconds)."""

    job_uid: int
    keep_seconds: float
    now: float
    job_id: str = ""
    """The starting job's id (its own note does not count as another job of its user)."""


@dataclass(frozen=True)
class Reclaim:
    """One tree to remove: `<base>/<name>` (a user's whole directory, or a leftover), or `<base>/<parent>/<name>`
    (a run's tier in the starting job's user's directory)."""

    base: str
    parent: str  # "" for an entry of the base itself
    name: str
    uid: int
    runs: int
    """The run tiers (`ckpt-*`) it holds."""
    why: str

    @property
    def path(self) -> str:
        """The tree's path, for messages."""
        return "/".join(part for part in (self.base.rstrip("/"), self.parent, self.name) if part)


@dataclass(frozen=True)
class MoveAside:
    """A `clusterctl-<uid>` another user made first, to be renamed to `new_name` in its base."""

    base: str
    name: str
    uid: int
    """The uid its name says (the user it locks out)."""
    owner: int
    """Who made it."""
    new_name: str

    @property
    def path(self) -> str:
        """The planted entry's path, for messages."""
        return f"{self.base.rstrip('/')}/{self.name}"


@dataclass(frozen=True)
class ReclaimPlan:
    """What to remove, what to move aside (planted), and what is named like a tier but is not one (said,
    never touched)."""

    reclaims: tuple[Reclaim, ...]
    left_alone: tuple[str, ...] = ()
    moves: tuple[MoveAside, ...] = ()


def stale_tiers(node: NodeTiers, job_starts: Iterable[JobStart], settings: ReclaimSettings) -> ReclaimPlan:
    """What the prolog of a job of `settings.job_uid` removes from the node (see the module's docstring).

    `job_starts` are the jobs whose prolog ran here and whose epilog has not yet (healthd's job-start notes):
    a user with one counts as present, however long ago it started (a job of days between two steps, an
    in-allocation restart, runs no process here for a while), unless it started before the node booted.
    """
    starts = [s for s in job_starts if s.start >= node.booted]
    present = set(node.running_uids)
    present.update(s.uid for s in starts if s.uid is not None)
    running = _Running(frozenset(node.running_jobs | {s.job_id for s in starts}),
                       any(s.uid == settings.job_uid and s.job_id != settings.job_id for s in starts))
    reclaims: list[Reclaim] = []
    left: list[str] = []
    moves: list[MoveAside] = []
    for found in sorted(node.dirs, key=lambda d: (d.base, d.entry.name)):
        entry = found.entry
        path = f"{found.base.rstrip('/')}/{entry.name}"
        user = USER_DIR.fullmatch(entry.name) or USER_TRASH.fullmatch(entry.name) or PLANTED.fullmatch(entry.name)
        if user is None:
            continue
        uid = int(user.group(1))
        problem = _not_a_users_directory(entry, uid)
        if problem is not None and USER_DIR.fullmatch(entry.name) and entry.owner not in (uid, 0):
            moves.append(MoveAside(found.base, entry.name, uid, entry.owner, planted_name(settings.now, entry.owner, uid)))
            continue
        if problem is not None:
            left.append(f"{path}: {problem}; left alone")
            continue
        runs = sum(1 for child in found.children if RUN_TREE.fullmatch(child.name) or RUN_TRASH.fullmatch(child.name))
        if USER_TRASH.fullmatch(entry.name):
            reclaims.append(Reclaim(found.base, "", entry.name, uid, runs, "left by an interrupted reclaim"))
        elif uid != settings.job_uid or PLANTED.fullmatch(entry.name):
            if uid not in present:
                planted = f"planted by uid {uid}, moved aside; " if PLANTED.fullmatch(entry.name) else ""
                reclaims.append(Reclaim(found.base, "", entry.name, uid, runs,
                                        f"{planted}no process of uid {uid} on this node and no job of theirs on it"))
        else:
            own, notes = _stale_runs(found, uid, settings, running)
            reclaims.extend(own)
            left.extend(notes)
    return ReclaimPlan(tuple(reclaims), tuple(left), tuple(moves))


@dataclass(frozen=True)
class _Running:
    jobs: frozenset[str]
    """Every job running on the node (the starting one too: its prolog's note is written)."""
    other_job_of_user: bool
    """A job of the starting job's user other than the starting one runs here."""


def _stale_runs(found: UserDir, uid: int, settings: ReclaimSettings,
                running: _Running) -> tuple[list[Reclaim], list[str]]:
    reclaims: list[Reclaim] = []
    left: list[str] = []
    for child in sorted(found.children, key=lambda c: c.name):
        trash = RUN_TRASH.fullmatch(child.name) is not None
        if not trash and not RUN_TREE.fullmatch(child.name):
            continue  # the user's node-local job directories and anything else of theirs: not a tier
        if child.kind != DIRECTORY or child.owner != uid:
            what = "a symlink" if child.kind == SYMLINK else "not a directory" if child.kind != DIRECTORY \
                else f"owned by uid {child.owner}"
            left.append(f"{found.base.rstrip('/')}/{found.entry.name}/{child.name}: {what}, not a run's tier of uid "
                        f"{uid}; left alone")
            continue
        if trash:
            reclaims.append(Reclaim(found.base, found.entry.name, child.name, uid, 1, "left by an interrupted reclaim"))
        elif running.jobs.intersection(child.jobs) or (not child.jobs and running.other_job_of_user):
            continue  # its job (or, noting none, maybe its job) runs here: however long unchanged, it is in use
        elif child.last_used is not None and settings.now - child.last_used >= settings.keep_seconds:
            reclaims.append(Reclaim(found.base, found.entry.name, child.name, uid, 1,
                                    f"not used for {hours(settings.now - child.last_used)} "
                                    f"(kept {hours(settings.keep_seconds)} for a resume)"))
    return reclaims, left


def _not_a_users_directory(entry: Entry, uid: int) -> str | None:
    """Why root must not remove `entry` as user `uid`'s directory; None when it may."""
    if entry.kind == SYMLINK:
        return "a symlink, not followed"
    if entry.kind != DIRECTORY:
        return "not a directory"
    if entry.owner != uid:
        return f"owned by uid {entry.owner}, not by uid {uid} (planted by another user?)"
    if entry.mode & _GROUP_OR_OTHERS_WRITE:
        return f"writable by group or others (mode {entry.mode:o})"
    return None


def hours(seconds: float) -> str:
    """`seconds` as hours for a log line: `31 h`, `1.5 h`."""
    value = seconds / 3600
    return f"{value:.0f} h" if value >= 10 else f"{value:.2g} h"


def size(n: int) -> str:
    """A byte count for a log line: `512 B`, `12.0 KB`, `3.4 GB` (powers of 1000)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
