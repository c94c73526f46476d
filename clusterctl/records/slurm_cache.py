"""One Slurm answer shared by the supervisors of a runs directory: `<runs>/.slurm-<name>.json`.

Written by whichever supervisor refreshed it (atomically, under a lock), read by all the
others while it is fresh.  A cache entry this clusterctl cannot read (damaged, or written by a
newer clusterctl) is refused with a RecordError; the shared reader treats that as a miss and
asks Slurm itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import RecordError, check_header, field, header, number_field

KIND = "slurm-cache"
VERSION = 1


@dataclass(frozen=True)
class CachedAnswer:
    """A Slurm command's output (`text`), when it was asked (`at`, epoch seconds) and by which process."""

    command: str  # "squeue", "sinfo"
    at: float
    pid: int
    text: str

    def age(self, now: float) -> float:
        """Seconds since Slurm was asked (negative when `now` is earlier: another host's clock)."""
        return now - self.at

    def to_json(self) -> dict[str, Any]:
        """The file's JSON."""
        return {**header(KIND, VERSION), "command": self.command, "at": self.at, "pid": self.pid, "text": self.text}

    @classmethod
    def from_json(cls, data: object, where: str) -> CachedAnswer:
        """Parse a cache entry; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        return cls(command=field(body, "command", str, where), at=number_field(body, "at", where),
                   pid=field(body, "pid", int, where), text=field(body, "text", str, where))


def cache_path(directory: Path, command: str) -> Path:
    """Where the shared answer of `command` is kept."""
    return directory / f".slurm-{command}.json"


def write_cached_answer(directory: Path, answer: CachedAnswer) -> Path:
    """Write the entry atomically (readers see the old answer or the new one); its path."""
    return atomic_write(cache_path(directory, answer.command), json.dumps(answer.to_json()))


def read_cached_answer(directory: Path, command: str) -> CachedAnswer | None:
    """The shared answer of `command`; None when there is none yet, RecordError when it is not readable."""
    path = cache_path(directory, command)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordError(str(path), f"not a readable JSON record ({exc.__class__.__name__})") from None
    return CachedAnswer.from_json(parsed, str(path))
