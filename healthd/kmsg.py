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
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from clusterctl.records.healthd_kmsg_cursor import KmsgCursor

# Anchored at the start of the message: the driver's own lines begin with its prefix, while user
# text can reach the middle of kernel messages (a bad mount option echoed by a filesystem, a
# process name in a segfault line).  Only the driver prints `NVRM: ` first.
_PCI = r"(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
_XID = re.compile(r"NVRM: Xid \(" + _PCI + r"\): (?P<xid>\d{1,4})\b")
_FALLEN = re.compile(r"NVRM: GPU (?:at )?" + _PCI + r":? .*fallen off the bus", re.IGNORECASE)
KERNEL_FACILITY = 0
"""syslog facility of the kernel's own messages (LOG_KERN); /dev/kmsg never lets user space write it."""


@dataclass(frozen=True)
class KernelRecord:
    sequence: int
    message: str
    usec: int = 0
    """Microseconds since boot when the kernel logged it."""
    facility: int = KERNEL_FACILITY
    """syslog facility from the record's priority (`prio >> 3`): 0 is the kernel, 1 user space..."""

    @property
    def from_kernel(self) -> bool:
        """Logged by the kernel itself: writes to /dev/kmsg from user space carry another facility."""
        return self.facility == KERNEL_FACILITY


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
    if len(fields) < 3 or not _ascii_digits(fields[0]) or not _ascii_digits(fields[1]):
        return None
    return KernelRecord(int(fields[1]), message.rstrip("\n"), int(fields[2]) if _ascii_digits(fields[2]) else 0,
                        facility=int(fields[0]) >> 3)


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 20


def parse_gpu_event(record: KernelRecord, own_gpus: Collection[str]) -> GpuKernelEvent | None:
    """The Xid in a record, if it is the NVIDIA driver's own message about one of `own_gpus`.

    `own_gpus`: this node's GPUs' PCI addresses as NVML reports them (normalised, see
    `normalise_pci`).  Everything else is refused: a record from another facility than the
    kernel's, a message that does not start with the driver's `NVRM: ` prefix (text embedded
    in another message), an address that is not one of this node's GPUs.
    """
    if not record.from_kernel:
        return None
    if match := _XID.match(record.message):
        xid = int(match["xid"])
    elif match := _FALLEN.match(record.message):
        xid = 79
    else:
        return None
    pci = normalise_pci(match["pci"])
    return GpuKernelEvent(record.sequence, pci, xid, record.message) if pci in own_gpus else None


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

    def follow(self, stop: threading.Event, poll: float = 0.05) -> Iterator[list[KernelRecord]]:
        """Yield the new records in batches (what one read found) until `stop.is_set()`; an empty
        batch when there was nothing new for `poll` seconds.

        Batches let the caller save its position once per batch (or less often), and the
        empty batch tells it the log went quiet: a storm of lines must not turn into a storm
        of cursor writes, and a quiet log must not leave the position unsaved.
        """
        reader = RecordReader(self.path)
        try:
            while not stop.is_set():
                records = reader.available()
                if not records:
                    reader.wait(poll)
                    yield []
                    continue
                batch = [record for record in records if record.sequence > self.after]
                if batch:
                    self.after = max(record.sequence for record in batch)
                    yield batch
        finally:
            reader.close()
