"""Xids from the kernel log: parse NVRM lines, keep a position that survives restarts.

/dev/kmsg replays everything since boot and gives one record per read(), so a reader
must remember where it stopped (boot id + sequence number) or it acts again on Xids
from days ago — the "sticky history" bug of peers.  The path is configurable: tests
and the testbed feed a file of records in the same format.
"""

from __future__ import annotations

import errno
import os
import re
import select
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from clusterctl.records.healthd_kmsg_cursor import KmsgCursor

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?\): "
                  r"(?P<xid>\d+)")
_FALLEN = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?:? "
                     r".*fallen off the bus", re.IGNORECASE)


@dataclass(frozen=True)
class KernelRecord:
    sequence: int
    message: str
    usec: int = 0
    """Microseconds since boot when the kernel logged it."""


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
    return KernelRecord(int(fields[1]), message.rstrip("\n"), int(fields[2]) if fields[2].isdigit() else 0)


def parse_gpu_event(record: KernelRecord) -> GpuKernelEvent | None:
    """The Xid in a record, if any."""
    if match := _XID.search(record.message):
        return GpuKernelEvent(record.sequence, normalise_pci(match["pci"]), int(match["xid"]), record.message)
    if match := _FALLEN.search(record.message):
        return GpuKernelEvent(record.sequence, normalise_pci(match["pci"]), 79, record.message)
    return None


def read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown"


class RecordReader:
    """Reads whatever kernel records are available now, without blocking.

    /dev/kmsg gives one record per read() and EPIPE when records were overwritten before
    they were read; a file of records (tests, the testbed) is read line by line.
    """

    def __init__(self, path: Path) -> None:
        self.is_device = path.is_char_device()
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.buffer = b""

    def available(self) -> list[KernelRecord]:
        records = []
        while True:
            try:
                chunk = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before we read them: carry on
                    continue
                raise
            if not chunk:
                break
            lines = [chunk] if self.is_device else (self.buffer + chunk).split(b"\n")
            self.buffer = b"" if self.is_device else lines.pop()
            for line in lines:
                record = parse_record(line.decode(errors="replace"))
                if record is not None:
                    records.append(record)
        return records

    def wait(self, seconds: float) -> None:
        """Until more may be there: select() on the device, a short sleep on a file."""
        if self.is_device:
            select.select([self.fd], [], [], seconds)
        else:
            time.sleep(seconds)

    def close(self) -> None:
        os.close(self.fd)


class KernelLog:
    """Follows /dev/kmsg (or a file of records), yielding only records after the cursor."""

    def __init__(self, path: Path, boot_id: str, cursor: KmsgCursor | None) -> None:
        self.path, self.boot_id = path, boot_id
        # A cursor from another boot means nothing: this boot's records are all new.
        self.after = cursor.sequence if cursor and cursor.boot_id == boot_id else -1

    def follow(self, stop: threading.Event, poll: float = 0.05) -> Iterator[KernelRecord]:
        """Yield new records until `stop.is_set()`; blocks between records."""
        reader = RecordReader(self.path)
        try:
            while not stop.is_set():
                records = reader.available()
                if not records:
                    reader.wait(poll)
                for record in records:
                    if record.sequence > self.after:
                        self.after = record.sequence
                        yield record
        finally:
            reader.close()
