"""clusterctl's one door to the files it keeps: whole-file writes are atomic, journals append.

Every file one process writes and another reads goes through here: `atomic_write` for whole
files (a reader sees the old or the new text, never half, even after a power cut) and
`append_json_line` / `read_json_lines` for append-only journals (a crash mid-append leaves a
torn last line, which the reader skips and reports); `read_lines` streams a file too large to
hold whole (a job's training series).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from clusterctl.errors import ClusterctlError


def fsync_directory(directory: Path) -> None:
    """Make the entries of `directory` durable (after a rename into it, or a new file in it)."""
    # rename() is durable only once the directory entry is: POSIX leaves it to an fsync of the directory.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str, *, mode: int = 0o644) -> Path:
    """Write `text` to `path` so a reader sees the old file or the new one, never half of it.

    Temp file in the same directory, fsync, rename over the target, fsync the directory.
    The temp name is created with O_EXCL|O_NOFOLLOW, so a planted file or symlink at that
    name is never written through.  Returns `path`.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's EEXIST for a parent that is a file: what is wrong is ENOTDIR
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path.parent)) from None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return path


def append_json_line(path: Path, record: dict[str, Any], *, mode: int = 0o644,
                     torn_tail: Literal["keep", "cut"] = "keep") -> None:
    """Append one JSON record as a line (O_APPEND, one write) and make it durable before returning.

    After a torn last line (a crash mid-append), `torn_tail` says what becomes of it: "keep" (a
    journal, whose reader reports a damaged line with what it may have cost) starts the record on a
    line of its own, since glued to the torn one it would be lost with it; "cut" (a series whose
    reader refuses a damaged line anywhere but last) cuts the torn bytes off first.
    """
    line = json.dumps(record, sort_keys=True) + "\n"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, mode)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            if torn_tail == "cut":
                os.ftruncate(fd, _end_of_last_whole_line(fd, size))
            else:
                line = "\n" + line
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _end_of_last_whole_line(fd: int, size: int) -> int:
    """The offset just past the file's last newline (0 when it has none), read backwards a block at a time."""
    end = size
    while end > 0:
        start = max(0, end - (64 << 10))
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


class UnreadableFileError(OSError):
    """A file to read that is not one clusterctl can read safely: not a regular file, or too large.

    An OSError (callers that handle a file they cannot read handle this one too); `reason` is the
    phrase after the path, which readers of records turn into their RecordError.
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(errno.EINVAL, reason, str(path))
        self.path, self.reason = path, reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _open_checked(path: Path, *, limit: int, follow_symlinks: bool) -> tuple[int, int]:
    """An fd on the regular file at `path` and its size, refused as `read_regular_file` says."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise UnreadableFileError(path, "a symlink, not a regular file; refusing to follow it") from None
        raise UnreadableFileError(path, f"cannot read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            what = "a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) \
                else "not a regular file"
            raise UnreadableFileError(path, f"{what}, where clusterctl expects a regular file; move it away")
        if info.st_size > limit:
            raise UnreadableFileError(path, f"{info.st_size} bytes, more than the {limit} this reader accepts; "
                                            "it is not a file clusterctl wrote (move it away)")
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def read_regular_file(path: Path, *, limit: int, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file at `path`, never more than `limit` of them.

    Opened with O_NONBLOCK (a FIFO planted where a file should be must not block the reader),
    and refused with UnreadableFileError when it is not a regular file (a directory, a FIFO, a
    device) or holds more than `limit` bytes (checked while reading too: a file growing under
    the reader is not read past it).  Without `follow_symlinks`, a symlink is refused (O_NOFOLLOW).
    FileNotFoundError for a missing file; other OSErrors become UnreadableFileError.
    """
    fd, _ = _open_checked(path, limit=limit, follow_symlinks=follow_symlinks)
    try:
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UnreadableFileError(path, f"grew past the {limit} bytes this reader accepts while being read")
        return b"".join(chunks)
    except UnreadableFileError:
        raise
    except OSError as exc:
        raise UnreadableFileError(path, f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_lines(path: Path, *, limit: int, follow_symlinks: bool = True) -> Generator[bytes, None, None]:
    """The lines of the regular file at `path`, one at a time (each with its newline, the last maybe
    without): for files too large to hold whole.  Refused as `read_regular_file` refuses, at the first
    line; the lines stop at `limit` bytes (the size it had when opened: a file growing meanwhile is
    read as it was then, and a line being written past it is not seen half)."""
    fd, size = _open_checked(path, limit=limit, follow_symlinks=follow_symlinks)
    with os.fdopen(fd, "rb", buffering=1 << 20) as stream:
        left = size
        try:
            for line in stream:
                if len(line) >= left:
                    yield line[:left]
                    return
                left -= len(line)
                yield line
        except OSError as exc:
            raise UnreadableFileError(path, f"cannot read: {exc.strerror}") from None


def read_tail(path: Path, size: int, *, limit: int, follow_symlinks: bool = True) -> tuple[int, bytes]:
    """The last `size` bytes of the regular file at `path` (all of it when smaller), and the offset they
    start at; refused as `read_regular_file` refuses (a file of more than `limit` bytes too)."""
    fd, length = _open_checked(path, limit=limit, follow_symlinks=follow_symlinks)
    try:
        start = max(0, length - size)
        return start, os.pread(fd, length - start, start)
    except OSError as exc:
        raise UnreadableFileError(path, f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


JOURNAL_LIMIT = 256 << 20
"""The largest journal read (bytes): years of a run's events, far from what a reader can hold."""


@dataclass(frozen=True)
class JsonLines:
    """The records of a journal, and the line numbers (1-based) that could not be read."""

    records: tuple[dict[str, Any], ...]
    unreadable_lines: tuple[int, ...] = ()
    line_count: int = 0
    unreadable_text: tuple[bytes, ...] = ()
    """The bytes of each unreadable line (in `unreadable_lines` order), to say what was lost."""

    @property
    def torn_tail(self) -> bool:
        """Only the last line is unreadable: a crash mid-append, expected and harmless."""
        return len(self.unreadable_lines) == 1 and self.unreadable_lines[0] == self.line_count


def read_json_lines(path: Path, *, limit: int = JOURNAL_LIMIT) -> JsonLines:
    """Every readable record of a journal (objects only); unreadable lines are skipped and counted.

    A missing file is an empty journal.  Bytes that are not UTF-8 make that line unreadable,
    not the whole file.  UnreadableFileError for a directory, FIFO or device at `path`, or a file
    larger than `limit`.
    """
    try:
        data = read_regular_file(path, limit=limit)
    except FileNotFoundError:
        return JsonLines(())
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, raw in enumerate(lines, start=1):
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            bad.append(number)
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            bad.append(number)
    return JsonLines(tuple(records), tuple(bad), len(lines), tuple(lines[n - 1] for n in bad))


# ---- writing into a directory other users may reach (root's records on shared storage) -----------

class UnsafePathError(ClusterctlError):
    """A directory root was to write into is not safe (writable by others, planted, a symlink)."""

    exit_code = 11


def _writable_by_others(st: os.stat_result) -> bool:
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def check_owned(target: Path | os.stat_result, *, uid: int, kind: Literal["file", "directory"],
                root_may_own: bool = False, private: bool = False) -> str | None:
    """Why `target` cannot be trusted as written only by user `uid`; None when it can.

    The one rule for a file or directory whose content clusterctl acts on although others could
    reach the place it lies in (a shared runs directory, the epilog's records, the breaker's
    directory on shared storage):

    - it is what the caller expects, a regular file or a real directory, and never a symlink
      (a Path is read with lstat; pass `os.fstat` of an fd opened with O_NOFOLLOW instead);
    - its owner is `uid`, or root when `root_may_own` (a record root wrote is as good as one of
      `uid`'s: root can write anything anyway);
    - neither its group nor others may write it;
    - with `private`, its group and others have no access at all (a directory made 0700).

    The answer is the first rule broken, as a phrase to put after the path and a colon; callers
    turn it into their own error (or skip what it is about).  OSError from lstat is the caller's.
    """
    info = os.lstat(target) if isinstance(target, Path) else target
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return "a symlink, not a real " + kind
    if kind == "file" and not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if kind == "directory" and not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    if info.st_uid != uid and not (root_may_own and info.st_uid == 0):
        return f"owned by uid {info.st_uid} (mode {mode:o}), not by uid {uid}{' or root' if root_may_own else ''}"
    if _writable_by_others(info):
        return f"writable by group or others (mode {mode:o})"
    if private and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"open to group or others (mode {mode:o}), not private to its owner"
    return None


def owner_label(uid: int) -> str:
    """`uid 65534 (nobody)` for a message naming who owns something; `uid 65534` when it has no name here."""
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def check_entry_name(name: str) -> str:
    """`name` if it is one plain directory entry (no `/`, not `.`/`..`, no NUL); else UnsafePathError."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or len(name) > 255:
        raise UnsafePathError(f"{name!r} is not a plain file name")
    return name


def open_checked_dir(path: Path) -> int:
    """An O_DIRECTORY fd on `path` (its last component not a symlink), refused when others could swap its entries.

    Others may write to it only with the sticky bit set (like /tmp): then they cannot rename
    or delete entries they do not own.  Close the fd when done.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise UnsafePathError(f"{path}: cannot open as a directory ({exc.strerror}); "
                              "it must be a real directory, not a symlink") from None
    st = os.fstat(fd)
    if _writable_by_others(st) and not st.st_mode & stat.S_ISVTX:
        os.close(fd)
        raise UnsafePathError(f"{path}: writable by group or others without the sticky bit "
                              f"(mode {stat.S_IMODE(st.st_mode):o}); make it 0755, or 1777 with the sticky bit")
    return fd


def open_owned_subdir(dir_fd: int, name: str, *, where: str, mode: int = 0o755) -> int:
    """Create (or reuse) directory `name` inside the checked directory `dir_fd`; an O_DIRECTORY fd on it.

    Reused only when it is a real directory owned by the same user as `dir_fd`'s directory
    and writable by nobody else: a directory (or symlink) planted there by another user is
    refused with UnsafePathError.  `where` names the parent in messages.  Close the fd when done.
    """
    check_entry_name(name)
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:  # ELOOP (a symlink), ENOTDIR (a file)
        raise UnsafePathError(f"{where}/{name}: not a real directory ({exc.strerror}); refusing to write "
                              "into it (planted by someone else?)") from None
    problem = check_owned(os.fstat(fd), uid=os.fstat(dir_fd).st_uid, kind="directory")
    if problem is not None:
        os.close(fd)
        raise UnsafePathError(f"{where}/{name}: {problem}; it must belong to the owner of {where} with no write for "
                              "others: refusing to write into it (planted by someone else?)")
    return fd


def atomic_write_at(dir_fd: int, name: str, text: str, *, mode: int = 0o644) -> None:
    """`atomic_write` relative to an open directory: nothing on the way is looked up by path again.

    The temp file is created with O_EXCL|O_NOFOLLOW inside `dir_fd` and renamed over `name`
    there (a symlink planted at `name` is replaced, never followed), then the directory is
    fsynced.  Use with `open_checked_dir` / `open_owned_subdir` for directories others can reach.
    """
    check_entry_name(name)
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.fsync(dir_fd)
