"""Xids from the kernel log: parse NVRM lines, keep a position that survives restarts.

/dev/kmsg replays everything since boot and gives one record per read(), so a reader
must remember where it stopped (boot id + sequence number) or it acts again on Xids
from days ago — the "sticky history" bug of peers.  The path is configurable: tests
and the testbed feed a file of records in the same format.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?\): "
                  r"(?P<xid>\d+)")
_FALLEN = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?:? "
                     r".*fallen off the bus", re.IGNORECASE)


@dataclass(frozen=True)
class KernelRecord:
    sequence: int
    message: str


@dataclass(frozen=True)
class GpuKernelEvent:
    """An Xid (or "fallen off the bus", reported as Xid 79) seen in the kernel log."""

    sequence: int
    pci_bus: str  # normalised "0000:5d:00"
    xid: int
    message: str


def normalise_pci(bus_id: str) -> str:
    """`00000000:5D:00.0`, `0000:5d:00` → `0000:5d:00` (domain:bus:device, lower case)."""
    head = bus_id.split(".")[0].lower()
    domain, bus, device = head.split(":")[-3:]
    return f"{int(domain, 16):04x}:{bus}:{device}"


def parse_record(raw: str) -> KernelRecord | None:
    """A /dev/kmsg record `prio,seq,usec,flags[,...];message` (None for continuation or junk lines)."""
    header, sep, message = raw.partition(";")
    if not sep:
        return None
    fields = header.split(",")
    if len(fields) < 3 or not fields[1].isdigit():
        return None
    return KernelRecord(int(fields[1]), message.rstrip("\n"))


def parse_gpu_event(record: KernelRecord) -> GpuKernelEvent | None:
    """The Xid in a record, if any."""
    if match := _XID.search(record.message):
        return GpuKernelEvent(record.sequence, normalise_pci(match["pci"]), int(match["xid"]), record.message)
    if match := _FALLEN.search(record.message):
        return GpuKernelEvent(record.sequence, normalise_pci(match["pci"]), 79, record.message)
    return None


@dataclass(frozen=True)
class Cursor:
    """Where the reader stopped: records at or before `sequence` in boot `boot_id` were handled."""

    boot_id: str
    sequence: int


def load_cursor(path: Path) -> Cursor | None:
    try:
        data = json.loads(path.read_text())
        return Cursor(str(data["boot_id"]), int(data["sequence"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_cursor(path: Path, cursor: Cursor) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"boot_id": cursor.boot_id, "sequence": cursor.sequence}))
    os.replace(tmp, path)


def read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown"


class KernelLog:
    """Follows /dev/kmsg (or a file of records), yielding only records after the cursor."""

    def __init__(self, path: Path, boot_id: str, cursor: Cursor | None) -> None:
        self.path, self.boot_id = path, boot_id
        # A cursor from another boot means nothing: this boot's records are all new.
        self.after = cursor.sequence if cursor and cursor.boot_id == boot_id else -1

    def follow(self, stop, poll: float = 0.05) -> Iterator[KernelRecord]:
        """Yield new records until `stop.is_set()`; blocks between records."""
        is_device = self.path.is_char_device()
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        buffer = b""
        try:
            while not stop.is_set():
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    chunk = b""
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # records overwritten before we read them: carry on
                        continue
                    raise
                if not chunk:
                    if is_device:
                        select.select([fd], [], [], poll)
                    else:
                        time.sleep(poll)
                    continue
                lines = [chunk] if is_device else (buffer + chunk).split(b"\n")
                buffer = b"" if is_device else lines.pop()
                for line in lines:
                    record = parse_record(line.decode(errors="replace"))
                    if record is not None and record.sequence > self.after:
                        self.after = record.sequence
                        yield record
        finally:
            os.close(fd)


class Deduplicator:
    """Lets the first (gpu, xid) through and counts repeats within `window` seconds (Xid storms)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.last: dict[tuple[object, ...], float] = {}
        self.suppressed = 0

    def first(self, key: tuple[object, ...], now: float) -> bool:
        seen = self.last.get(key)
        if seen is not None and now - seen < self.window:
            self.suppressed += 1
            return False
        self.last[key] = now
        return True
