"""Slurm reads shared by every supervisor under one runs directory.

Each supervisor polls `squeue --json` and `sinfo --json`; ten supervised runs on a login
node would ask slurmctld ten times per interval for the same answer.  The answer is kept in
a file next to the runs (written atomically, read by all) and reused while it is younger
than the poll interval, so slurmctld sees one query per interval however many runs are
supervised.  A lock makes only one supervisor refresh at a time.

The cache and its lock are per user (`<runs>/.clusterctl-<uid>/`, mode 0700): in a runs
directory several users share, another user could otherwise write a fake answer (a job
"COMPLETED", a node drained) that a supervisor would act on, or hold the lock file so that a
supervisor cannot open it.  A cache directory or file not owned by this user, or open to
others, is not trusted: the supervisor then asks Slurm itself.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from clusterctl.errors import RunError
from clusterctl.files import check_owned
from clusterctl.records.slurm_cache import CachedAnswer, cache_path, read_cached_answer, write_cached_answer
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.jobs import JobReport


def user_cache_dir(runs_root: Path, uid: int) -> Path | None:
    """This user's cache directory under a runs directory (made 0700); None when it cannot be trusted.

    Not trusted: a symlink, a file, or a directory another user made or that its group or others
    may reach (`check_owned` with `private`).
    """
    path = runs_root / f".clusterctl-{uid}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        problem = check_owned(path, uid=uid, kind="directory", private=True)
    except OSError:
        return None
    return path if problem is None else None


class SharedReads:
    """`queue()` and `nodes_json()` through a cache file shared by this user's supervisors."""

    def __init__(self, slurm: Slurm, directory: Path, max_age: float, clock: Callable[[], float],
                 uid: int | None = None) -> None:
        self.slurm, self.max_age, self.clock = slurm, max_age, clock
        self.uid = os.getuid() if uid is None else uid
        self.runs_root = directory

    @property
    def directory(self) -> Path | None:
        """The per-user cache directory (None: not trustworthy, every read goes to Slurm)."""
        return user_cache_dir(self.runs_root, self.uid)

    def _read(self, command: str, fetch: Callable[[], str]) -> str:
        directory = self.directory
        if directory is None:
            return fetch()
        fresh = self._fresh(directory, command)
        if fresh is not None:
            return fresh
        lock_path = directory / f".slurm-{command}.lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.ELOOP):
                raise RunError(f"{lock_path}: cannot open the Slurm-answer lock ({exc.strerror}); it is not this "
                               f"user's (uid {self.uid}): remove it, or point $CLUSTERCTL_RUNS elsewhere") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one refresher; the others then read its answer
            fresh = self._fresh(directory, command)
            if fresh is not None:
                return fresh
            text = fetch()
            write_cached_answer(directory, CachedAnswer(command, self.clock(), os.getpid(), text))
            return text
        finally:
            os.close(fd)

    def _fresh(self, directory: Path, command: str) -> str | None:
        try:
            if check_owned(cache_path(directory, command), uid=self.uid, kind="file") is not None:
                return None  # planted or loosened by someone else: never trust it
            cached = read_cached_answer(directory, command)
        except (OSError, RecordError):
            return None  # an answer we cannot read is a miss: ask Slurm and write one we can
        if cached is None:
            return None
        return cached.text if 0 <= cached.age(self.clock()) < self.max_age else None

    def queue(self) -> dict[str, JobReport]:
        """Every job slurmctld holds, finished ones included (one squeue per interval for all supervisors)."""
        return self.slurm.parse_queue(self._read("squeue", self.slurm.queue_json))

    def nodes_json(self) -> str:
        """`sinfo --json`, shared the same way."""
        return self._read("sinfo", self.slurm.nodes_json)
