"""healthd's `events` thread: NVML's event wait (Xid, DBE, GPU unavailable, recovery action) → findings.

Each event is reported at once (a drain within a second of an Xid).  After a lost GPU the event
set is rebuilt without it; after another NVML error it is rebuilt a second later.  The main
thread asks `check_hang` between batches: a wait that has not returned is reported once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from clusterctl.clock import Clock
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.findings import Finding
from clusterctl.healthd.metrics import Metrics
from clusterctl.healthd.nvml import EventWatcher, GpuIsLost, NvmlDoor, NvmlError, NvmlHang, lost_gpus
from clusterctl.healthd.observed import Observed
from clusterctl.healthd.state_writer import Heartbeats

HANG_CALL = "nvmlEventSetWait"


class EventWatch:
    """The NVML event thread (`run`) and the watchdog over its wait (`check_hang`, main thread)."""

    def __init__(self, config: HealthdConfig, *, nvml: NvmlDoor, nvml_ready: Callable[[], bool], clock: Clock,
                 metrics: Metrics, beats: Heartbeats, stop: threading.Event, report: Callable[[Observed], None]) -> None:
        self.config = config
        """Replaced whole on reload (SIGHUP)."""
        self.nvml, self.nvml_ready, self.clock, self.metrics = nvml, nvml_ready, clock, metrics
        self.beats, self.stop, self.report = beats, stop, report
        self.hang_reported: set[str] = set()
        """NVML calls whose hang was reported and has not ended since (main thread only)."""

    def run(self) -> None:
        """The `events` thread: wait for NVML events until stopped, rebuilding the event set as needed."""
        watcher = EventWatcher(self.nvml)
        watched: list[int] = []
        while not self.stop.is_set():
            self.beats.beat("events")
            if not self.nvml_ready():
                self.stop.wait(0.5)
                continue
            try:
                if not watched:
                    watched = watcher.build()
                    if not watched:
                        self.stop.wait(1.0)
                        continue
                event = watcher.wait(self.config.event_wait_ms)
            except GpuIsLost:
                # Once a registered GPU is lost every wait fails at once: find it, rebuild without it.
                self.report_lost_gpus("nvml-event")
                watched = []
                self.stop.wait(0.2)
                continue
            except (NvmlError, NvmlHang) as exc:
                self.report(Observed("nvml-event", (Finding("nvml-error", "nvml-event", self.clock.now(),
                                                            detail=str(exc)),)))
                watched = []
                self.stop.wait(1.0)
                continue
            if event is None:
                continue
            now = self.clock.now()
            self.metrics.last_event.set(now)
            kind = event.kind
            identity = self.nvml.identities.get(event.gpu)
            self.report(Observed("nvml-event", (Finding(
                kind, "nvml-event", now, gpu=event.gpu if event.gpu >= 0 else None,
                uuid=identity.uuid if identity else "", xid=event.data if kind == "xid" else None,
                value=event.data if kind == "recovery-action" else None),)))

    def report_lost_gpus(self, source: str) -> None:
        """Report each GPU NVML calls lost now (none: nothing)."""
        lost = lost_gpus(self.nvml)
        now = self.clock.now()
        identities = self.nvml.identities
        found = tuple(Finding("gpu-lost", source, now, gpu=i, uuid=identities[i].uuid
                              if i in identities else "", detail="NVML_ERROR_GPU_IS_LOST") for i in lost)
        if found:
            self.report(Observed(source, found))

    def check_hang(self) -> None:
        """Main thread: report once an event wait that has not returned within its timeout (and forget
        the report once the thread goes round again)."""
        beat = self.beats.at.get("events")
        limit = self.config.event_wait_ms / 1000 + self.config.nvml_timeout
        now = self.clock.monotonic()
        if beat is not None and self.nvml_ready() and now - beat > limit:
            if HANG_CALL not in self.hang_reported:
                self.hang_reported.add(HANG_CALL)
                self.metrics.nvml_hangs.labels(HANG_CALL).inc()
                self.report(Observed("watchdog", (Finding(
                    "nvml-hang", "watchdog", self.clock.now(), value=HANG_CALL,
                    detail=f"{HANG_CALL} has not returned for {now - beat:.0f} s"),)))
        elif beat is not None and now - beat <= limit:
            self.hang_reported.discard(HANG_CALL)
