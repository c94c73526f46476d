"""clusterctl's one door to files it keeps: whole-file writes are atomic, journals append."""

from __future__ import annotations

import json
import os
from pathlib import Path


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so a reader sees the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def append_json_line(path: Path, record: dict) -> None:
    """Append one JSON record as a line and make it durable before returning (a journal)."""
    line = json.dumps(record, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json_lines(path: Path) -> list[dict]:
    """Every complete record of a journal; a torn last line (a crash mid-append) is ignored."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
