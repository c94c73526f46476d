"""The testbed's root directory: made fresh by root, owned by root, never reached through a link.

The testbed runs as root on shared machines and keeps its state under fixed paths in /tmp
(/tmp/ctb, /tmp/ctd/<name>), where any user can create a name first.  A symlink planted there
would make `up` write, and `down` delete, wherever it points; a directory planted there would
hand its owner the cluster's configuration, keys and hooks.  So the root (and each missing
ancestor) is made with mkdir, which never follows a link and fails on an existing name, and
whatever is found at the path is checked with lstat before anything is written into it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from clusterctl.files import check_owned
from clusterctl_testbed.system import TestbedError

ROOT_MODE = 0o755
"""Root writes, everybody reads: the jobs' users read slurm.conf under it (srun, sbatch), as on a real
cluster.  Only its owner may write it."""


def root_problem(path: Path, uid: int) -> str | None:
    """Why the directory at `path` cannot be the testbed's root (owned by `uid`); None when it can."""
    return check_owned(path, uid=uid, kind="directory")


def ensure_private_root(path: Path, *, uid: int | None = None) -> Path:
    """Make (or check) the testbed's root at `path`; TestbedError when what is there is not safe.

    The root, each missing ancestor, and each ancestor inside a directory others may write (/tmp)
    are made or checked alike: kept only when a real directory (not a symlink), owned by `uid`
    (default: this process's user, root) and writable by nobody else.  Returns `path`.
    """
    owner = os.geteuid() if uid is None else uid
    path = Path(os.path.abspath(path))
    for directory in [*reversed(path.parents), path][1:]:  # from the top, "/" left out
        exposed = os.stat(directory.parent).st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if directory == path or exposed or not os.path.lexists(directory):
            _make_or_check(directory, owner)
    return path


def _make_or_check(path: Path, owner: int) -> None:
    try:
        os.mkdir(path, ROOT_MODE)
        os.chmod(path, ROOT_MODE, follow_symlinks=False)  # whatever the umask took away
    except FileExistsError:
        pass
    except OSError as exc:
        raise TestbedError(f"{path}: cannot make the testbed's root ({exc.strerror})") from None
    problem = root_problem(path, owner)
    if problem is not None:
        raise TestbedError(f"{path}: {problem}; the testbed runs as root and will not keep its state there. Remove "
                           "it, or set CLUSTERCTL_TESTBED_DIR to a directory only root can write")
