"""The epilog's killing of a job's tasks still alive after it ended: only the job's own, told by its cgroup
and its user, never this hook's ancestry.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path


def _ancestors(pid: int, proc: Path) -> set[int]:
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            stat = (proc / str(pid) / "stat").read_text()
            pid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def in_job_cgroup(cgroup_text: str, job: str) -> bool:
    """`/proc/<pid>/cgroup` places the process under Slurm's `job_<id>` cgroup (v1 or v2 layout).

    Only slurmstepd puts processes there, and users cannot move theirs into it: unlike an
    environment variable, a process cannot claim it.
    """
    wanted = f"job_{job}"
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if wanted in path.split("/"):
            return True
    return False


def _real_uid(status_text: str) -> int | None:
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def kill_strays(job: str, uid: int | None, *, proc: Path = Path("/proc"),
                kill: Callable[[int, int], None] = os.kill) -> list[int]:
    """Best effort: SIGKILL tasks of the job still alive after it ended (Slurm normally kills them); their pids.

    A task is one in the job's cgroup (`in_job_cgroup`) that runs as the job's user (`uid`,
    from SLURM_JOB_UID): never a process that merely sets SLURM_JOB_ID in its environment,
    never another user's, never this hook's own ancestry (slurmd's hook runner).  Without a
    uid, or on a node whose Slurm puts jobs in no cgroup, nothing is killed.
    """
    if uid is None or not (job.isascii() and job.isdigit()):
        return []
    spared = _ancestors(os.getpid(), proc)
    killed = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            if not in_job_cgroup((entry / "cgroup").read_text(), job) or _real_uid((entry / "status").read_text()) != uid:
                continue
            kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue
        killed.append(int(entry.name))
    return killed
