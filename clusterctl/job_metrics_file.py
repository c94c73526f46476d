"""The job's metrics file in node_exporter's textfile directory: its name, where it goes, how it goes away.

One definition for the two that touch it.  The job's agent (as the job's user, on its node) writes
`clusterctl_job_<JOB>.prom` every summary (the text: `launcher/pure/job_metrics_text.py`) and
removes it when it ends, on SIGTERM too (scancel, the end of the allocation's time).  The epilog
(root, on every node of the job, after its processes are gone) removes it from the admin's directory
for an agent that could not: one SIGKILLed, or killed by the OOM killer.  Left behind, node_exporter
would export the job's last figures for ever, a job that looks alive.

Where it goes (`destination`): the job environment's `CLUSTERCTL_METRICS_TEXTFILE_DIR` when set (the
user's override; set empty, nothing is written), else `job_metrics_dir` in the node's
`/etc/clusterctl/healthd.toml` (the admins' configuration of the node, which healthd and its hooks read
whole; the agent reads this one key).  The epilog looks only in the admin's directory, never at a path
from the job's environment, and builds the name from slurmd's `SLURM_JOB_ID` only.

Who may hold the name (`claim_textfile`): the admin's directory is 1777 and node_exporter exports every
`*.prom` in it whoever owns it, so another user could create a job's file first (job ids are sequential):
under the sticky bit the job's agent could then not replace it, and forged figures would be exported under
the job's id.  The prolog (root, before the job starts) therefore claims the name for the job: it writes an
empty file under a temp name, gives it to the job's user and renames it over the name (rename by root
replaces whatever file a squatter put there, atomically: there is no moment the name is free to take).
From then on only the job's user can replace it (the agent renames its own writes over its own file).
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterctl.files import atomic_write_at, check_entry_name, owner_label, read_regular_file
from clusterctl.text import printable

TEXTFILE_DIR_ENV = "CLUSTERCTL_METRICS_TEXTFILE_DIR"
"""The job environment's variable naming the textfile directory (the user's; empty: nothing is written)."""
ADMIN_KEY = "job_metrics_dir"
"""The key of the node's healthd.toml naming it for every job of the node (the admins')."""
NODE_CONFIG = Path("/etc/clusterctl/healthd.toml")
"""The admins' configuration of a compute node (healthd/config.py reads all of it)."""
CONFIG_LIMIT = 1 << 20
"""The largest healthd.toml the agent reads (bytes): far beyond any real one."""


def textfile_name(job_id: str) -> str:
    """The job's file in the textfile directory (node_exporter reads *.prom only, so the atomic
    write's temp file, `.<name>.<pid>.<random>.tmp`, is never read half-written)."""
    return check_entry_name(f"clusterctl_job_{job_id}.prom")


def is_job_file(name: str, job_id: str) -> bool:
    """`name` is the job's file, or a temp file a write of it left (its writer killed mid-write)."""
    final = textfile_name(job_id)
    return name == final or (name.startswith(f".{final}.") and name.endswith(".tmp"))


def _shown(value: object) -> str:
    text = repr(value)  # quoted, its control characters escaped
    return text if len(text) <= 80 else text[:77] + "..."


def path_problem(value: object) -> str | None:
    """Why `value` cannot name the textfile directory (a phrase), or None: an absolute path, as text
    without control characters (the agent and the epilog run from any directory)."""
    if not isinstance(value, str) or not value:
        return "is not a path"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "holds control characters"
    if not value.startswith("/"):
        return "is not an absolute path"
    return None


@dataclass(frozen=True)
class AdminSetting:
    """What the node's healthd.toml says of the job metrics directory."""

    directory: str | None = None
    """`job_metrics_dir`, None when the key is not set (or the file is not there)."""
    problem: str = ""
    """Why the setting could not be read or used (one line), '' when it could."""


def admin_setting(data: Mapping[str, object], where: str) -> AdminSetting:
    """The `job_metrics_dir` of a parsed healthd.toml (`where`: its path, for the message)."""
    if ADMIN_KEY not in data:
        return AdminSetting()
    value = data[ADMIN_KEY]
    problem = path_problem(value)
    if problem is not None:
        return AdminSetting(problem=f"{where}: {ADMIN_KEY} = {_shown(value)} {problem}")
    assert isinstance(value, str)
    return AdminSetting(value)


def read_admin_setting(path: Path = NODE_CONFIG) -> AdminSetting:
    """The node's `job_metrics_dir` (none when there is no healthd.toml); a file that cannot be read
    or parsed is a problem, never an exception (the job goes on without the admins' directory)."""
    try:
        text = read_regular_file(path, limit=CONFIG_LIMIT).decode("utf-8")
        return admin_setting(tomllib.loads(text), str(path))
    except FileNotFoundError:
        return AdminSetting()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        return AdminSetting(problem=f"cannot read {path} ({printable(str(exc))[:200]})")


@dataclass(frozen=True)
class Destination:
    """Where the agent writes the job's file: `directory` (None: nowhere), named by `source`, and
    `problem`, one line for the agent's log when a setting was there but cannot be used."""

    directory: Path | None
    source: str = ""
    problem: str = ""


def destination(environ: Mapping[str, str], admin: AdminSetting) -> Destination:
    """The user's CLUSTERCTL_METRICS_TEXTFILE_DIR when the job's environment sets it (empty: none),
    else the admins' job_metrics_dir, else nowhere."""
    if TEXTFILE_DIR_ENV in environ:
        value = environ[TEXTFILE_DIR_ENV]
        if not value:
            return Destination(None, TEXTFILE_DIR_ENV)
        problem = path_problem(value)
        if problem is not None:
            return Destination(None, TEXTFILE_DIR_ENV, f"{TEXTFILE_DIR_ENV}={_shown(value)} {problem}: "
                                                        "the job's metrics are not exported (name node_exporter's "
                                                        "--collector.textfile.directory)")
        return Destination(Path(value), TEXTFILE_DIR_ENV)
    source = f"{ADMIN_KEY} in {NODE_CONFIG}"
    if admin.problem:
        return Destination(None, source, f"{admin.problem}: the job's metrics are not exported (the admins' "
                                         f"setting; {TEXTFILE_DIR_ENV} in the job's environment overrides it)")
    if admin.directory is None:
        return Destination(None)
    return Destination(Path(admin.directory), source)


def directory_problem(directory: Path) -> str | None:
    """Why this process cannot write the job's file into `directory` (a phrase), or None."""
    try:
        if not directory.is_dir():
            return "does not exist" if not directory.exists() else "is not a directory"
    except OSError as exc:
        return f"cannot be looked at ({exc.strerror})"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"is not writable by this job (uid {os.getuid()})"
    return None


def write_textfile(directory: Path, job_id: str, text: str) -> None:
    """Replace the job's file in `directory` with `text`, atomically (temp file, rename)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        atomic_write_at(fd, textfile_name(job_id), text)
    finally:
        os.close(fd)


def remove_textfile(directory: Path, job_id: str, *, follow_symlinks: bool = True) -> list[str]:
    """Remove the job's file from `directory`, and any temp file a killed write of it left; the names
    removed (none: it was not there).  Every name is removed relative to one directory fd and unlink
    never follows a symlink, so a link planted at the job's name is removed, not what it points to.
    Without `follow_symlinks` (root), `directory` itself must be a real directory, not a symlink
    (its parents are the admin's path).  OSError when the directory cannot be opened."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(directory, flags)
    try:
        removed = []
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries if is_job_file(entry.name, job_id)]
        # The real file first: a name planted beside it (a directory called like a temp file) must not keep
        # a killed job's figures exported for ever.
        for name in sorted(names, key=lambda n: n != textfile_name(job_id)):
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                continue  # gone already, or not a file this removes (a directory planted under its name)
            removed.append(name)
        return removed
    finally:
        os.close(fd)


def claim_textfile(directory: Path, job_id: str, uid: int, gid: int) -> str | None:
    """Root, before the job starts: make the job's file in the admin's `directory` an empty one owned by
    `uid`:`gid` (mode 0644), replacing whatever another user created at that name first; what was
    replaced ("a file of uid N", ...) or None.  Relative to `directory` opened without following a symlink
    there; the temp file is made with O_EXCL|O_NOFOLLOW.  A directory planted at the name is renamed aside
    (`.clusterctl-planted-<name>-<random>`, which node_exporter does not read).  OSError when the directory
    cannot be opened or written."""
    name = textfile_name(job_id)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        try:
            found = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            found = None
        replaced = None
        if found is not None and found.st_uid != uid:
            kind = "a directory" if stat.S_ISDIR(found.st_mode) else "a symlink" if stat.S_ISLNK(found.st_mode) \
                else "a file"
            replaced = f"{kind} of {owner_label(found.st_uid)}"
        if found is not None and stat.S_ISDIR(found.st_mode):
            os.rename(name, f".clusterctl-planted-{name}-{os.urandom(4).hex()}", src_dir_fd=fd, dst_dir_fd=fd)
        elif found is not None and found.st_uid == uid and stat.S_ISREG(found.st_mode):
            return None  # the job's own already (a requeued job's prolog again)
        tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        try:
            os.fchown(out, uid, gid)
            os.fchmod(out, 0o644)
        finally:
            os.close(out)
        try:
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError:
            os.unlink(tmp, dir_fd=fd)
            raise
        return replaced
    finally:
        os.close(fd)
