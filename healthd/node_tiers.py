"""The prolog's door to the checkpoint tiers left on its node: what the tier bases hold, whose processes run
here, and the removal of what `stale_tiers` (pure) says to reclaim.

Root acts here in directories users write (/dev/shm, /tmp), so nothing is looked up through a path a user
could plant: each base is opened with O_NOFOLLOW and must be root's (others may write it only with the
sticky bit); every entry below is found relative to its directory's fd and checked with lstat (a real
directory, owned by the uid its name says, nobody else may write it) again just before it is removed; a
tree is first renamed to a `.clusterctl-reclaim-*` name (a job of that user starting meanwhile makes a new
directory and never sees half of the old one; a prolog stopped halfway leaves a name the next one finishes),
then removed depth first, each directory opened with O_NOFOLLOW relative to its parent's fd (a symlink is
unlinked, never followed), until the prolog's time is up: the rest keeps its trash name for the next prolog
(a user who fills a tier with millions of files cannot make every job start wait).  A tree holding a mount
point is left alone.  A `clusterctl-<uid>` another user planted is moved aside with one rename relative to
the base's fd (`move_aside`), checked again with lstat just before and after (a swap meanwhile is put back).
No Slurm, no shared storage: the cost is the listing, and the removal of the bytes.

Which jobs run on the node (`RunningJobs`, `JobCgroups`): the Slurm job ids in the cgroup paths of the node's
processes (`/proc/<pid>/cgroup`, `…/job_<id>/…`): only slurmstepd puts processes there, users cannot move
theirs in, it holds for cgroup v1 and v2 and wherever the hierarchy is mounted, and it costs one read per
process on the node and nothing on slurmctld (nor slurmd).  With `PrologFlags=Contain` every job of the node
has its extern step's process there for its whole life; without it a job between two steps has none, which is
why the prolog's job-start notes count too (healthd/stale_tiers.py).
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Protocol

from clusterctl.files import check_owned
from clusterctl.healthd.stale_tiers import (
    DIRECTORY, JOB_NOTE, OTHER, PLANTED, PLANTED_PREFIX, RUN_TREE, SYMLINK, TRASH_PREFIX, USER_DIR, USER_TRASH, Entry,
    MoveAside, NodeTiers, Reclaim, UserDir, run_trash_name, user_trash_name,
)

MAX_ENTRIES = 10_000
"""Entries of a user's directory listed at most (a clusterctl user's holds a few: its runs and jobs)."""
MAX_WALK = 10_000
"""Directories of one run's tier looked at for its last use at most (one holds tens); past it, unknown: kept."""
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Removed:
    """What one removal came to: the bytes it freed, and what went wrong (None: the tree is gone)."""

    freed_bytes: int
    error: str | None = None


class TierDoor(Protocol):
    """What the prolog asks of its node about the checkpoint tiers there."""

    def look(self, job_uid: int) -> NodeTiers:
        """The tier bases' user directories (with the runs' last use in `job_uid`'s) and the uids running here."""
        ...

    def remove(self, reclaim: Reclaim, seconds: float) -> Removed:
        """Remove one tree `stale_tiers` chose, checking it again first, for at most `seconds` (what is left
        keeps its trash name for the next prolog); never raises for the tree's sake."""
        ...

    def running_uids(self) -> frozenset[int]:
        """Every uid a process on this node runs as, now."""
        ...

    def move_aside(self, move: MoveAside) -> str | None:
        """Rename a planted `clusterctl-<uid>` to `move.new_name` in its base, checking it again first; None when
        done, else why not (never raises for the entry's sake)."""
        ...


class RunningJobs(Protocol):
    """Which Slurm jobs have a process on this node now."""

    def job_ids(self) -> frozenset[str]:
        """Their job ids (digits)."""
        ...


_JOB_CGROUP = re.compile(r"job_([0-9]{1,20})")


class JobCgroups:
    """`RunningJobs` from the cgroups of the node's processes (`<proc>/<pid>/cgroup`; see the module docstring)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc

    def job_ids(self) -> frozenset[str]:
        found: set[str] = set()
        try:
            pids = [entry.name for entry in os.scandir(self.proc) if entry.name.isdigit()]
        except OSError:
            return frozenset()
        for pid in pids:
            try:
                text = (self.proc / pid / "cgroup").read_text(encoding="ascii", errors="replace")
            except OSError:
                continue  # gone meanwhile
            for line in text.splitlines():
                for part in line.split(":", 2)[-1].split("/"):
                    if (match := _JOB_CGROUP.fullmatch(part)) is not None:
                        found.add(match.group(1))
        return frozenset(found)


def process_uids() -> frozenset[int]:
    """Every uid a process on this node runs as: real, effective and saved (psutil, from /proc)."""
    import psutil  # here: the hooks that never ask (the epilog, HealthCheckProgram) do not pay its 17 ms import

    uids: set[int] = set()
    for process in psutil.process_iter(["uids"]):
        found = process.info.get("uids")
        if found is not None:
            uids.update((found.real, found.effective, found.saved))
    return frozenset(uids)


def boot_time(proc_stat: str = "/proc/stat") -> float:
    """When this node booted (epoch seconds, the kernel's `btime`); 0.0 when it cannot be read (every note
    then counts as a job's)."""
    try:
        with open(proc_stat, encoding="ascii", errors="replace") as lines:
            for line in lines:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


class LocalTiers:
    """The `TierDoor` of this node: `bases` are the admin's tier bases (healthd.toml `tier_bases`);
    `running_uids` reads the process table (`process_uids` unless a test gives its own)."""

    def __init__(self, bases: Sequence[str], running_uids: Callable[[], frozenset[int]] = process_uids,
                 booted: Callable[[], float] = boot_time, jobs: RunningJobs | None = None) -> None:
        self.bases = tuple(bases)
        self.running_uids = running_uids
        self.booted = booted
        self.jobs = jobs or JobCgroups()

    def look(self, job_uid: int) -> NodeTiers:
        notes: list[str] = []
        found: list[UserDir] = []
        for base in self.bases:
            try:
                base_fd = _open_base(base)
            except FileNotFoundError:
                continue  # a base this node does not have (a local disk some nodes lack)
            except _NotABase as exc:
                notes.append(str(exc))
                continue
            try:
                found.extend(_user_dirs(base, base_fd, job_uid))
            except OSError as exc:
                notes.append(f"{base}: cannot be listed ({exc.strerror}); its checkpoint tiers are not reclaimed")
            finally:
                os.close(base_fd)
        return NodeTiers(tuple(found), self.running_uids(), tuple(notes), self.booted(), self.jobs.job_ids())

    def move_aside(self, move: MoveAside) -> str | None:
        try:
            base_fd = _open_base(move.base)
        except (OSError, _NotABase) as exc:
            return str(exc)
        try:
            return _move_planted(base_fd, move)
        except OSError as exc:
            return f"not moved ({exc.strerror or exc})"
        finally:
            os.close(base_fd)

    def remove(self, reclaim: Reclaim, seconds: float) -> Removed:
        try:
            base_fd = _open_base(reclaim.base)
        except (OSError, _NotABase) as exc:
            return Removed(0, str(exc))
        parent_fd = base_fd
        try:
            if reclaim.parent:
                parent_fd = os.open(reclaim.parent, _OPEN_DIR, dir_fd=base_fd)
                problem = _not_owned(os.fstat(parent_fd), reclaim.uid, no_others=True)
                if problem is not None:
                    return Removed(0, f"{reclaim.base}/{reclaim.parent}: {problem}; left alone")
            return _remove_tree(parent_fd, reclaim, time.monotonic() + seconds)
        except OSError as exc:
            return Removed(0, f"{exc.strerror or exc}")
        finally:
            if parent_fd != base_fd:
                os.close(parent_fd)
            os.close(base_fd)


class _NotABase(Exception):
    pass


def _open_base(base: str) -> int:
    """An fd on tier base `base`: a real directory of root's, others may write it only with the sticky bit."""
    try:
        # The admin's path, their links resolved (/dev/shm is a link to /run/shm on some systems); the directory
        # it names must be root's all the same.
        fd = os.open(os.path.realpath(base), _OPEN_DIR)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _NotABase(f"{base}: not a real directory ({exc.strerror}); its checkpoint tiers are not reclaimed") \
            from None
    info = os.fstat(fd)
    if info.st_uid != 0 or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
        os.close(fd)
        raise _NotABase(f"{base}: owned by uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}: a tier base must "
                        "be root's, writable by others only with the sticky bit (like /dev/shm); its checkpoint "
                        "tiers are not reclaimed")
    return fd


def _entry(name: str, info: os.stat_result, last_used: float | None = None, jobs: tuple[str, ...] = ()) -> Entry:
    kind = DIRECTORY if stat.S_ISDIR(info.st_mode) else SYMLINK if stat.S_ISLNK(info.st_mode) else OTHER
    return Entry(name, kind, info.st_uid, stat.S_IMODE(info.st_mode), last_used, jobs)


def _user_dirs(base: str, base_fd: int, job_uid: int) -> list[UserDir]:
    found = []
    with os.scandir(base_fd) as entries:
        names = list(islice((e.name for e in entries
                             if e.name.startswith(("clusterctl-", TRASH_PREFIX, PLANTED_PREFIX))), MAX_ENTRIES))
    for name in sorted(names):
        match = USER_DIR.fullmatch(name) or USER_TRASH.fullmatch(name) or PLANTED.fullmatch(name)
        if match is None:
            continue
        try:
            info = os.stat(name, dir_fd=base_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        children: tuple[Entry, ...] = ()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == int(match.group(1)):
            children = _children(base_fd, name, info, look_into=USER_DIR.fullmatch(name) is not None
                                 and info.st_uid == job_uid)
        found.append(UserDir(base, _entry(name, info), children))
    return found


def _children(base_fd: int, name: str, info: os.stat_result, *, look_into: bool) -> tuple[Entry, ...]:
    """The entries of a user's directory; with `look_into`, each run tier's last use."""
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=base_fd)
    except OSError:
        return ()
    try:
        if not os.path.samestat(info, os.fstat(fd)):
            return ()  # swapped since it was looked at: the next prolog sees it again
        children = []
        with os.scandir(fd) as entries:
            for count, child in enumerate(entries):
                if count >= MAX_ENTRIES:
                    break
                try:
                    child_info = child.stat(follow_symlinks=False)
                except OSError:
                    continue
                last_used: float | None = None
                jobs: tuple[str, ...] = ()
                if look_into and stat.S_ISDIR(child_info.st_mode) and RUN_TREE.fullmatch(child.name):
                    last_used, jobs = _last_used(fd, child.name, child_info)
                children.append(_entry(child.name, child_info, last_used, jobs))
        return tuple(children)
    finally:
        os.close(fd)


def _last_used(parent_fd: int, name: str, info: os.stat_result) -> tuple[float | None, tuple[str, ...]]:
    """The newest modification time of a directory in the tree, None when it cannot be told (too many
    directories, another filesystem mounted inside); and the jobs its top notes (`.job-<id>`)."""
    newest = info.st_mtime
    jobs: list[str] = []
    try:
        for count, (_path, _dirs, files, fd) in enumerate(os.fwalk(name, dir_fd=parent_fd, follow_symlinks=False)):
            inner = os.fstat(fd)
            if count == 0:
                jobs = sorted(m.group(1) for f in files[:MAX_ENTRIES] if (m := JOB_NOTE.fullmatch(f)) is not None)
            if count >= MAX_WALK or inner.st_dev != info.st_dev:
                return None, tuple(jobs)
            newest = max(newest, inner.st_mtime)
    except OSError:
        return None, tuple(jobs)
    return newest, tuple(jobs)


def _not_owned(info: os.stat_result, uid: int, *, no_others: bool) -> str | None:
    if no_others:
        return check_owned(info, uid=uid, kind="directory")
    if stat.S_ISLNK(info.st_mode):
        return "a symlink, not a real directory"
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    if info.st_uid != uid:
        return f"owned by uid {info.st_uid} (mode {stat.S_IMODE(info.st_mode):o}), not by uid {uid}"
    return None


def _move_planted(base_fd: int, move: MoveAside) -> str | None:
    """Rename the planted entry (still not of `move.uid`'s, still `move.owner`'s) to its new name, relative to
    the base's fd: rename moves the entry itself, a symlink included, and reads nothing inside it.  A swap
    between the check and the rename (the planter removed it and the user made their own) is put back."""
    info = os.stat(move.name, dir_fd=base_fd, follow_symlinks=False)
    if info.st_uid != move.owner or info.st_uid in (move.uid, 0):
        return f"now owned by uid {info.st_uid}; left alone"
    try:
        os.stat(move.new_name, dir_fd=base_fd, follow_symlinks=False)
        return f"{move.new_name} exists already; left for the next job's prolog"
    except FileNotFoundError:
        pass
    os.rename(move.name, move.new_name, src_dir_fd=base_fd, dst_dir_fd=base_fd)
    if not os.path.samestat(info, os.stat(move.new_name, dir_fd=base_fd, follow_symlinks=False)):
        try:
            os.rename(move.new_name, move.name, src_dir_fd=base_fd, dst_dir_fd=base_fd)
        except OSError:
            pass  # the user's own directory under the planted name: reclaimed in time like theirs, never read
        return "replaced while it was being moved; put back"
    return None


def _remove_tree(parent_fd: int, reclaim: Reclaim, deadline: float) -> Removed:
    """Check the tree again, rename it to its trash name, remove it: all relative to `parent_fd`, until
    `deadline` (time.monotonic): a tree a user filled with millions of files must not hold every job start."""
    info = os.stat(reclaim.name, dir_fd=parent_fd, follow_symlinks=False)
    problem = _not_owned(info, reclaim.uid, no_others=not reclaim.parent)
    if problem is not None:
        return Removed(0, f"{problem}; left alone")
    trash = reclaim.name
    if not reclaim.name.startswith(TRASH_PREFIX):
        token = os.urandom(4).hex()
        trash = run_trash_name(reclaim.name, token) if reclaim.parent else user_trash_name(reclaim.uid, token)
        os.rename(reclaim.name, trash, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        if not os.path.samestat(info, os.stat(trash, dir_fd=parent_fd, follow_symlinks=False)):
            return Removed(0, f"replaced while it was being removed; left alone as {trash}")
    return _remove_walk(parent_fd, trash, info, deadline)


def _remove_walk(parent_fd: int, name: str, info: os.stat_result, deadline: float) -> Removed:
    """Remove the directory `name` (of `info`) in `parent_fd` depth first, every step relative to an fd opened
    without following a symlink (a link is unlinked, never followed); bytes counted as each file's last link
    goes.  A directory on another filesystem (a mount inside) is left alone with what holds it; at `deadline`
    the rest stays under its trash name, which the next prolog finishes."""
    freed = 0
    stack: list[tuple[int, int, str]] = []  # (fd of a directory being emptied, its parent's fd, its name there)
    try:
        stack.append((os.open(name, _OPEN_DIR, dir_fd=parent_fd), parent_fd, name))
        if not os.path.samestat(info, os.fstat(stack[0][0])):
            return Removed(0, f"replaced while it was being removed; left alone as {name}")
        while stack:
            fd = stack[-1][0]
            descended = False
            with os.scandir(fd) as entries:
                for entry in entries:
                    if time.monotonic() >= deadline:
                        return Removed(freed, f"out of time; the rest is left as {name} for the next job's prolog")
                    held = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(held.st_mode):
                        if held.st_dev != info.st_dev:
                            return Removed(freed, f"another filesystem is mounted inside ({name}/…/{entry.name}); "
                                                  "left alone")
                        stack.append((os.open(entry.name, _OPEN_DIR, dir_fd=fd), fd, entry.name))
                        descended = True
                        break
                    os.unlink(entry.name, dir_fd=fd)
                    if held.st_nlink <= 1:
                        freed += held.st_blocks * 512
            if descended:
                continue
            emptied, parent, entry_name = stack.pop()
            os.close(emptied)
            os.rmdir(entry_name, dir_fd=parent)
        return Removed(freed)
    except OSError as exc:
        return Removed(freed, f"not removed whole ({exc.strerror or exc})")
    finally:
        for fd, _parent, _name in stack:
            os.close(fd)
