"""healthd's `kmsg` thread: follows the kernel log (kmsg.py) and reports the driver's Xid lines about
this node's own GPUs; keeps the kernel-log cursor, so a restart reads on from where it stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from clusterctl.clock import Clock
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.findings import Finding
from clusterctl.healthd.kmsg import KernelLog, KernelRecord, parse_gpu_event, read_boot_id
from clusterctl.healthd.nvml import NvmlDoor
from clusterctl.healthd.observed import Observed
from clusterctl.healthd.state_writer import Heartbeats
from clusterctl.records.healthd_kmsg_cursor import KmsgCursor, read_kmsg_cursor, write_kmsg_cursor
from clusterctl.records.versioned import RecordError

log = logging.getLogger("healthd")

CURSOR_SAVE_S = 1.0
"""The kernel-log cursor is saved when the log goes quiet, and at most this often while it is busy."""


class KernelLogWatch:
    """The kernel-log follower thread (`run`)."""

    def __init__(self, config: HealthdConfig, *, nvml: NvmlDoor, clock: Clock, beats: Heartbeats,
                 stop: threading.Event, report: Callable[[Observed], None]) -> None:
        self.config = config
        """Replaced whole on reload (SIGHUP); the log's path and boot id are read once, at start."""
        self.nvml, self.clock, self.beats, self.stop, self.report = nvml, clock, beats, stop, report

    def run(self) -> None:
        """The `kmsg` thread: follow the log until stopped, saving its cursor as it goes."""
        path = self.config.kmsg
        boot_id = read_boot_id(self.config.boot_id)
        while not self.stop.is_set():
            self.beats.beat("kmsg")
            # Kernel lines count only about this node's own GPUs, which NVML names: until it has,
            # the log is left unread (and its position unmoved) rather than read blind.
            if not path.exists() or not self.nvml.identities:
                self.stop.wait(2.0)
                continue
            try:
                cursor = read_kmsg_cursor(self.config.journal_dir)
            except RecordError as exc:
                log.error("kernel-log cursor not read, reading this boot's log from its start: %s", exc)
                cursor = None
            reader = KernelLog(path, boot_id, cursor)
            saved_at, unsaved = self.clock.monotonic(), None
            try:
                for batch in reader.follow(self.stop):
                    self.beats.beat("kmsg")
                    found = self._kernel_findings(batch)
                    if found:
                        self.report(Observed("kmsg", found))
                    unsaved = batch[-1].sequence if batch else unsaved
                    # The position is saved once the log goes quiet, and at most every CURSOR_SAVE_S
                    # during a storm: replaying a few lines after a crash is harmless (de-duplicated).
                    if unsaved is not None and (not batch or self.clock.monotonic() - saved_at > CURSOR_SAVE_S):
                        write_kmsg_cursor(self.config.journal_dir, KmsgCursor(boot_id, unsaved))
                        saved_at, unsaved = self.clock.monotonic(), None
            except OSError as exc:
                log.warning("kernel log %s: %s", path, exc)
                self.stop.wait(2.0)
            if unsaved is not None:
                write_kmsg_cursor(self.config.journal_dir, KmsgCursor(boot_id, unsaved))

    def _kernel_findings(self, batch: Sequence[KernelRecord]) -> tuple[Finding, ...]:
        """The driver's Xid lines about this node's own GPUs in `batch` (forged or foreign lines are not)."""
        own = {identity.pci_bus: identity for identity in self.nvml.identities.values()}
        found = []
        for record in batch:
            event = parse_gpu_event(record, own)
            if event is not None:
                gpu = own[event.pci_bus]
                found.append(Finding("xid", "kmsg", self.clock.now(), gpu=gpu.index, uuid=gpu.uuid, xid=event.xid,
                                     value=event.pci_bus, detail=event.message[:200]))
        return tuple(found)
