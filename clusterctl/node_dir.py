"""A step's node-local directory: where the ranks of one node leave what only that node reads.

Runs inside the job, on every node (the rank wrapper of `clusterctl.launcher.job` makes it).
The ranks' progress reports (`clusterctl.progress.beat`) go to `$CLUSTERCTL_NODE_DIR/progress/`
instead of the job directory on shared storage: a tmpfs rewrite per rank per second costs the
node nothing and the parallel filesystem nothing, whatever the job's size.  The node's reporter
(`clusterctl.launcher.job.reporter`) reads them there and sends one report per node to the agent.

    <base>/clusterctl-<uid>/<job id>/<launch>/<node>

`<base>` is $CLUSTERCTL_NODE_TMP when set, else /dev/shm when it is a writable directory (RAM:
nothing reaches a disk), else $TMPDIR or /tmp.  `clusterctl-<uid>` is private to the user (0700):
on a /tmp shared with other users, one of them could plant it first, as a symlink to somewhere
of theirs or a directory they own, and read or steer what the ranks write; such a directory is
refused (the one ownership rule: `clusterctl.files.check_owned`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from clusterctl.errors import ClusterctlError
from clusterctl.files import UnsafePathError, check_entry_name, check_owned, open_checked_dir

NODE_DIR_ENV = "CLUSTERCTL_NODE_DIR"
"""The step's node-local directory, set by the rank wrapper for the training program and the reporter."""
NODE_TMP_ENV = "CLUSTERCTL_NODE_TMP"
"""Where node-local directories are made, instead of /dev/shm (a site whose /dev/shm is small or shared)."""
SHARED_MEMORY = Path("/dev/shm")


def node_tmp_base(environ: Mapping[str, str]) -> Path:
    """The folder node-local directories are made in: $CLUSTERCTL_NODE_TMP, /dev/shm, $TMPDIR or /tmp."""
    chosen = environ.get(NODE_TMP_ENV)
    if chosen:
        return Path(chosen)
    if SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK | os.X_OK):
        return SHARED_MEMORY
    return Path(environ.get("TMPDIR") or "/tmp")


def node_dir_path(job_id: str, launch: str, node: str, environ: Mapping[str, str], *, uid: int | None = None) -> Path:
    """Where `node_dir` makes (or made) the node-local directory of step `launch` of job `job_id` on `node`;
    nothing is made or checked (a reader, such as the stacks command, then finds it there or not)."""
    return node_tmp_base(environ) / f"clusterctl-{os.getuid() if uid is None else uid}" / job_id / launch / node


def node_dir(job_id: str, launch: str, node: str, environ: Mapping[str, str], *, uid: int | None = None) -> Path:
    """Make (or reuse) the node-local directory of step `launch` of job `job_id` on `node`; its path.

    `<base>/clusterctl-<uid>` is created 0700 and must be a real directory owned by `uid` (default:
    this process's) and private to it; the folders below it are made 0700 too.  ClusterctlError
    saying what is wrong (and what to do) when it cannot be made or is not ours.
    """
    uid = os.getuid() if uid is None else uid
    base = node_tmp_base(environ)
    for what, value in (("job id", job_id), ("launch", launch), ("node", node)):
        try:
            check_entry_name(value)
        except UnsafePathError:
            raise ClusterctlError(f"cannot make a node-local directory: the {what} {value!r} is not a plain "
                                  "file name") from None
    mine = f"clusterctl-{uid}"
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)  # $CLUSTERCTL_NODE_TMP may name one to make
    except OSError as exc:
        raise ClusterctlError(f"cannot make {base}: {exc.strerror}; set {NODE_TMP_ENV} to a node-local "
                              "directory you may write") from None
    try:
        base_fd = open_checked_dir(base)
    except UnsafePathError as exc:
        raise ClusterctlError(f"cannot make a node-local directory in {base}: {exc}; set {NODE_TMP_ENV} to a "
                              "node-local directory of yours") from None
    try:
        try:
            os.mkdir(mine, 0o700, dir_fd=base_fd)
        except FileExistsError:
            pass
        info = os.stat(mine, dir_fd=base_fd, follow_symlinks=False)
        problem = check_owned(info, uid=uid, kind="directory", private=True)
        if problem is None and not stat.S_ISDIR(info.st_mode):
            problem = "not a directory"
    except OSError as exc:
        raise ClusterctlError(f"cannot make {base / mine}: {exc.strerror}; set {NODE_TMP_ENV} to a node-local "
                              "directory you may write") from None
    finally:
        os.close(base_fd)
    if problem is not None:
        raise ClusterctlError(f"{base / mine}: {problem}; refusing to keep this job's node-local files there "
                              f"(planted by another user?): remove it, or set {NODE_TMP_ENV} to another "
                              "node-local directory")
    path = node_dir_path(job_id, launch, node, environ, uid=uid)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ClusterctlError(f"cannot make {path}: {exc.strerror}") from None
    return path
