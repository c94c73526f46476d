"""healthd's memory of Xids seen on this node (`<journal_dir>/xid-history.jsonl`), across restarts.

Appended by the daemon for every Xid it judges; read back by the next daemon, so an
application-level Xid repeated on one GPU across different jobs is still recognised after
a restart (the policy drains only on such repeats).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import append_json_line, atomic_write, read_json_lines
from clusterctl.records.versioned import check_header, field, header, number_field, strings_field

KIND = "healthd-xid"
VERSION = 1
XID_HISTORY_NAME = "xid-history.jsonl"

_OPTIONAL_INT = (int, type(None))


@dataclass(frozen=True)
class XidSighting:
    """One Xid: when, on which GPU, from which source, and the jobs running then."""

    at: float  # seconds since the epoch
    xid: int
    source: str  # "nvml-event", "kmsg"
    gpu: int | None = None
    uuid: str = ""
    job_ids: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    """The uid of the job's user, when known (older lines have none)."""

    def to_json(self) -> dict[str, Any]:
        """One line as stored."""
        return {**header(KIND, VERSION), "at": self.at, "xid": self.xid, "source": self.source, "gpu": self.gpu,
                "uuid": self.uuid, "job_ids": list(self.job_ids), "users": list(self.users)}

    @classmethod
    def from_json(cls, data: object, where: str) -> XidSighting:
        """Parse one line; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        return cls(number_field(body, "at", where), field(body, "xid", int, where),
                   field(body, "source", str, where), field(body, "gpu", _OPTIONAL_INT, where),
                   field(body, "uuid", str, where), strings_field(body, "job_ids", where),
                   # `users` came later within version 1: optional, and older readers ignore it.
                   strings_field(body, "users", where, default=()))


def xid_history_path(journal_dir: Path) -> Path:
    """Where healthd keeps its Xid history."""
    return journal_dir / XID_HISTORY_NAME


def append_xid_sighting(journal_dir: Path, sighting: XidSighting) -> None:
    """Append one sighting durably."""
    append_json_line(xid_history_path(journal_dir), sighting.to_json())


def read_xid_history(journal_dir: Path) -> tuple[XidSighting, ...]:
    """Every sighting (a torn last line is skipped); RecordError for a line not understood."""
    path = xid_history_path(journal_dir)
    return tuple(XidSighting.from_json(r, f"{path}: record {n}")
                 for n, r in enumerate(read_json_lines(path).records, start=1))


def rewrite_xid_history(journal_dir: Path, sightings: Sequence[XidSighting]) -> None:
    """Replace the history with `sightings` (atomically): how the daemon keeps it to the policy window."""
    atomic_write(xid_history_path(journal_dir),
                 "".join(json.dumps(s.to_json(), sort_keys=True) + "\n" for s in sightings))
