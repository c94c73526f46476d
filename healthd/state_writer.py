"""What healthd shows outside, from the main thread: the state file and systemd's watchdog.

The state file (records/healthd_state.py) is what the engine holds plus NVML's GPUs and each
thread's heartbeat; systemd's watchdog is fed only while every watched thread goes round.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from clusterctl.clock import Clock
from clusterctl.healthd import engine, sdnotify
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.journal import Journal
from clusterctl.healthd.metrics import Metrics
from clusterctl.healthd.nvml import NvmlDoor
from clusterctl.records.healthd_state import HealthdState, write_healthd_state


class Heartbeats:
    """When each thread last went round its loop (monotonic): each thread writes its own name only."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.at: dict[str, float] = {}

    def beat(self, name: str) -> None:
        """Thread `name` is alive now."""
        self.at[name] = self.clock.monotonic()


class StateWriter:
    """The state file and the watchdog (main thread only)."""

    def __init__(self, config: HealthdConfig, *, node: str, nvml: NvmlDoor, nvml_ready: Callable[[], bool],
                 journal: Journal, metrics: Metrics, clock: Clock, beats: Heartbeats) -> None:
        self.config = config
        """Replaced whole on reload (SIGHUP)."""
        self.node, self.nvml, self.nvml_ready, self.journal = node, nvml, nvml_ready, journal
        self.metrics, self.clock, self.beats = metrics, clock, beats
        self.started = clock.now()

    def view(self, state: engine.EngineState, gpu_count: int) -> HealthdState:
        """What the state file shows now, with `state` the engine's and `gpu_count` the last periodic count."""
        now = self.clock.monotonic()
        identities = {i: engine.GpuIdentityView(g.uuid, g.pci_bus) for i, g in self.nvml.identities.items()}
        view = engine.state_view(state, node=self.node, pid=os.getpid(), started=self.started,
                                 now=self.clock.now(), nvml_ok=self.nvml_ready(), identities=identities,
                                 gpu_count=gpu_count, pending_actions=len(self.journal.pending()),
                                 loop_age_s={n: round(now - b, 1) for n, b in self.beats.at.items()},
                                 dry_run=self.config.dry_run)
        for gpu in view.gpus:
            self.metrics.gpu_verdict.labels(str(gpu.index)).set(int(gpu.verdict))
        return view

    def write(self, state: engine.EngineState, gpu_count: int) -> None:
        """Replace the state file with `view`."""
        write_healthd_state(self.config.state_dir, self.view(state, gpu_count))

    def feed_watchdog(self) -> None:
        """Tell systemd healthd is alive, unless the applier or periodic thread stopped going round."""
        if self.loops_alive():
            sdnotify.notify("WATCHDOG=1")

    def loops_alive(self) -> bool:
        """The applier and periodic threads went round within their limits."""
        now = self.clock.monotonic()
        limits = {"applier": 10.0, "periodic": self.config.check_interval + 10 * self.config.nvml_timeout + 10}
        return all(now - self.beats.at.get(name, now) < limit for name, limit in limits.items())
