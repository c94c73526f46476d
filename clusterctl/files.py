"""clusterctl's one door to the files it keeps: whole-file writes are atomic, journals append.

Every file one process writes and another reads goes through here: `atomic_write` for whole
files (a reader sees the old or the new text, never half, even after a power cut) and
`append_json_line` / `read_json_lines` for append-only journals (a crash mid-append leaves a
torn last line, which the reader skips and reports).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _fsync_directory(directory: Path) -> None:
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
    path.parent.mkdir(parents=True, exist_ok=True)
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
    _fsync_directory(path.parent)
    return path


def append_json_line(path: Path, record: dict[str, Any], *, mode: int = 0o644) -> None:
    """Append one JSON record as a line and make it durable before returning (a journal)."""
    line = json.dumps(record, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class JsonLines:
    """The records of a journal, and the line numbers (1-based) that could not be read."""

    records: tuple[dict[str, Any], ...]
    unreadable_lines: tuple[int, ...] = ()
    line_count: int = 0

    @property
    def torn_tail(self) -> bool:
        """Only the last line is unreadable: a crash mid-append, expected and harmless."""
        return len(self.unreadable_lines) == 1 and self.unreadable_lines[0] == self.line_count


def read_json_lines(path: Path) -> JsonLines:
    """Every readable record of a journal (objects only); unreadable lines are skipped and counted.

    A missing file is an empty journal.  Bytes that are not UTF-8 make that line unreadable,
    not the whole file.
    """
    try:
        data = path.read_bytes()
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
    return JsonLines(tuple(records), tuple(bad), len(lines))
