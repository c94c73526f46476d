"""healthd's position in the kernel log (`<journal_dir>/kmsg.cursor`), kept across restarts.

/dev/kmsg replays everything since boot, so a restarted healthd must know where the last
one stopped (boot id + sequence number) or it acts again on Xids from days ago.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import check_header, field, header, read_json_record

KIND = "healthd-kmsg-cursor"
VERSION = 1
CURSOR_NAME = "kmsg.cursor"


@dataclass(frozen=True)
class KmsgCursor:
    """Records at or before `sequence` in boot `boot_id` were handled."""

    boot_id: str
    sequence: int

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "boot_id": self.boot_id, "sequence": self.sequence}

    @classmethod
    def from_json(cls, data: object, where: str) -> KmsgCursor:
        """Parse a stored cursor; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        return cls(field(body, "boot_id", str, where), field(body, "sequence", int, where))


def cursor_path(journal_dir: Path) -> Path:
    """Where healthd keeps its kernel-log position."""
    return journal_dir / CURSOR_NAME


def write_kmsg_cursor(journal_dir: Path, cursor: KmsgCursor) -> None:
    """Replace the cursor atomically."""
    atomic_write(cursor_path(journal_dir), json.dumps(cursor.to_json(), sort_keys=True) + "\n", mode=0o600)


def read_kmsg_cursor(journal_dir: Path) -> KmsgCursor | None:
    """The saved position; None when there is none; RecordError when it cannot be understood."""
    path = cursor_path(journal_dir)
    data = read_json_record(path, missing_ok=True)
    if data is None:
        return None
    return KmsgCursor.from_json(data, str(path))
