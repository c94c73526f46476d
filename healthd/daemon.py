"""healthd run: the threads around the engine (engine.py decides; this module only moves data).

Threads and what they move:
  events    NVML event wait loop (Xid, DBE, GPU unavailable, recovery action) → inbox
  kmsg      kernel-log follower (NVRM Xid lines) → inbox; keeps the kernel-log cursor
  periodic  every check_interval: GPU and host samples (sampler.py) → inbox; Slurm's view of the node
            only every node_refresh_interval (jittered), or every drained_refresh_interval while
            it decides something (drained, events waiting for the node to be back in service)
  applier   applies journaled actions one at a time (retrying while slurmctld is away) → inbox
  diagnostics  runs the active diagnostics the engine asks for (after_failure, before_return), one at a
            time with their timeouts (diagnostic_runner.py) → inbox; the engine resumes a node it drained
            only on a before_return pass newer than the drain (return_to_service.py)
  main      this module's loop: hands each input to the engine's shell, which is the only owner
            of the engine state (steps it, journals planned actions before handing them to the
            applier); between batches checks the event wait, reloads, writes the state file and
            feeds the watchdog

Each thread's job is one class in its own module: `EventWatch` (event_watch.py), `KernelLogWatch`
(kmsg_watch.py), `PeriodicCheck` (periodic.py), `Applier` (applier.py), and on the main thread
`EngineShell` (engine_shell.py) and `StateWriter` (state_writer.py).  `Daemon` builds them around
one inbox and runs the main loop.

NVML (nvml.py) is shared by the events, kmsg, periodic and main threads: its handles and identities
are snapshots replaced whole under its own lock, never changed under a reader.

The doors are passed in (Slurm node, NVML, clock, host sampler, boot time, metrics, random), so
a test drives the daemon with fakes; the Slurm node and NVML doors are Protocols (`NodeSlurm` in
clusterctl/slurm/nodes.py, `NvmlDoor` in nvml.py), implemented for tests in tests/fakes.py.

What it asks of slurmctld (bench/fleet_bench.py, README "Fleet scale"): nothing per periodic
check; its own node with one single-node query every node_refresh_interval, every
drained_refresh_interval while the node is drained, and before each drain or resume; before a
drain, the partition's size (REQUEST_PARTITION_INFO) and, with `breaker_dir` set, a slot of the
shared ledger (no table read), else the partition's drained share (one whole-table read, a few
KB of text) after a random wait that grows with the partition; after the breaker refused, the
same fault is not tried again for breaker_retry (doubling while it stays open).
"""

from __future__ import annotations

import logging
import queue
import random
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from clusterctl.clock import SYSTEM_CLOCK, Clock
from clusterctl.healthd import engine, sdnotify
from clusterctl.healthd.applier import Applied, Applier
from clusterctl.healthd.checks import HostSample
from clusterctl.healthd.config import ConfigError, HealthdConfig, load_config
from clusterctl.healthd.diagnostic_runner import DiagnosticDoor, DiagnosticWorker, diagnostics_in_force, run_diagnostic
from clusterctl.healthd.diagnostics import Diagnostics
from clusterctl.healthd.engine_shell import EngineShell, open_journal, restored_state
from clusterctl.healthd.event_watch import EventWatch
from clusterctl.healthd.journal import Journal, PlannedAction
from clusterctl.healthd.kmsg_watch import KernelLogWatch
from clusterctl.healthd.metrics import Metrics
from clusterctl.healthd.unit_file import installed_unit_text, start_warnings
from clusterctl.healthd.nvml import Nvml, NvmlCalls, NvmlDoor, TimedCalls
from clusterctl.healthd.observed import Observed
from clusterctl.healthd.periodic import PeriodicCheck
from clusterctl.healthd.policy import POLICY_VERSION
from clusterctl.healthd.sampler import sample_host
from clusterctl.healthd.state_writer import Heartbeats, StateWriter
from clusterctl.records.healthd_diagnostic import DiagnosticResult
from clusterctl.slurm.nodes import NodeSlurm, NodeState, SlurmNode

__all__ = ["Applied", "Daemon", "Observed"]

log = logging.getLogger("healthd")

STATE_REFRESH_S = 5.0
"""The state file is rewritten on every change, else this often: readers call it fresh for max(3 intervals, 30 s)."""
BATCH = 100
"""At most this many inputs are handled between two state-file writes and watchdog feeds."""


class Daemon:
    """One healthd process on one node: its threads' parts around one inbox, and the main loop."""

    def __init__(self, config: HealthdConfig, *, config_path: Path | None = None, slurm: NodeSlurm | None = None,
                 nvml: NvmlDoor | None = None, clock: Clock = SYSTEM_CLOCK, metrics: Metrics | None = None,
                 host_sampler: Callable[[Sequence[str]], HostSample] = sample_host,
                 boot_time: Callable[[], float] = psutil.boot_time,
                 jitter: Callable[[float, float], float] = random.uniform,
                 diagnostic_door: DiagnosticDoor = run_diagnostic,
                 diagnostics: Callable[[HealthdConfig], Diagnostics] = diagnostics_in_force) -> None:
        self.config, self.config_path, self.clock = config, config_path, clock
        node = config.node_name
        slurm = slurm or SlurmNode(node)
        self.metrics = metrics or Metrics()
        self.calls: NvmlCalls = nvml.call if nvml is not None else TimedCalls(config.nvml_timeout, self.metrics.observe_call)
        door: NvmlDoor = nvml or Nvml(self.calls)
        self.inbox: queue.Queue[Observed | Applied | DiagnosticResult] = queue.Queue()
        journal = open_journal(config, clock)
        self.diagnostics_in_force = diagnostics
        settings = engine.EngineSettings.from_config(config, node, diagnostics(config))
        state = restored_state(config, clock)
        self.stop = threading.Event()
        self.diagnostics = DiagnosticWorker(diagnostic_door, stop=self.stop, report=self.inbox.put)
        self.reload = threading.Event()
        self.beats = Heartbeats(clock)
        self.applier = Applier(config, settings, slurm=slurm, journal=journal, metrics=self.metrics,
                               clock=clock, jitter=jitter, stop=self.stop, beat=lambda: self.beats.beat("applier"),
                               report=self.inbox.put)
        self.shell = EngineShell(config, settings, state, journal=journal, applier=self.applier, slurm=slurm,
                                 metrics=self.metrics, clock=clock, boot_time=boot_time,
                                 run_diagnostic=lambda level, spec: self.diagnostics.requests.put((level, spec)))
        self.periodic = PeriodicCheck(
            config, nvml=door, slurm=slurm, clock=clock, host_sampler=host_sampler, jitter=jitter,
            # a reference read: the main thread replaces the engine state, never mutates it
            watching_node=lambda: engine.watching_node(self.shell.state), give_back_slot=self.applier.give_back_slot,
            beats=self.beats, stop=self.stop, report=self.inbox.put)
        self.events = EventWatch(config, nvml=door, nvml_ready=lambda: self.periodic.nvml_ready, clock=clock,
                                 metrics=self.metrics, beats=self.beats, stop=self.stop, report=self.inbox.put)
        self.kernel_log = KernelLogWatch(config, nvml=door, clock=clock, beats=self.beats, stop=self.stop,
                                         report=self.inbox.put)
        self.status = StateWriter(config, node=node, nvml=door, nvml_ready=lambda: self.periodic.nvml_ready,
                                  journal=journal, metrics=self.metrics, clock=clock, beats=self.beats)

    @property
    def journal(self) -> Journal:
        """The action journal (planned and applied Slurm actions)."""
        return self.shell.journal

    @property
    def settings(self) -> engine.EngineSettings:
        """What the engine decides with now."""
        return self.shell.settings

    @property
    def actions(self) -> queue.Queue[PlannedAction]:
        """Planned actions handed to the applier, not yet applied (the applier's queue)."""
        return self.applier.actions

    @property
    def applied_node(self) -> NodeState | None:
        """The node as the applier's last call left it (None: not known)."""
        return self.applier.applied_node

    def apply(self, action: PlannedAction) -> engine.ApplyDecision:
        """Apply one planned action now, on the calling thread (Applier.apply)."""
        return self.applier.apply(action)

    def handle(self, item: Observed | Applied | DiagnosticResult) -> None:
        """Step the engine with one input and carry out its effects, on the calling thread (EngineShell.handle)."""
        self.shell.handle(item)

    def write_state(self) -> None:
        """Replace the state file with what the engine holds now."""
        self.status.write(self.shell.state, self.shell.gpu_count)

    def reload_config(self) -> bool:
        """Re-read the configuration (SIGHUP); a bad edit keeps the running one.  True when applied."""
        try:
            fresh = load_config(self.config_path)
        except ConfigError as exc:  # a bad edit must not kill a running daemon: keep the old config
            log.error("config reload failed, keeping the running config: %s", exc)
            return False
        self.config = fresh
        self.shell.reconfigure(fresh, engine.EngineSettings.from_config(fresh, self.shell.settings.node,
                                                                        self.diagnostics_in_force(fresh)))
        self.applier.reconfigure(fresh, self.shell.settings)
        self.periodic.config = self.events.config = self.kernel_log.config = self.status.config = fresh
        if isinstance(self.calls, TimedCalls):
            self.calls.timeout = fresh.nvml_timeout
        log.info("configuration reloaded from %s", self.config_path)
        return True

    def run(self) -> int:
        """Start the threads and run the main loop until SIGTERM/SIGINT; 0."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        signal.signal(signal.SIGHUP, lambda *_: self.reload.set())
        try:
            self.metrics.serve(self.config.metrics)
        except OSError as exc:
            log.warning("metrics not served on %s: %s", self.config.metrics, exc)
        for warning in start_warnings(self.config, installed_unit_text()):
            log.warning("%s", warning)
        self.periodic.connect_nvml()
        log.info("healthd on %s: %d GPUs, policy %s%s", self.shell.settings.node, len(self.periodic.nvml.identities),
                 POLICY_VERSION, " (dry run)" if self.config.dry_run else "")
        for line in self.shell.settings.diagnostics.describe():
            log.info("%s", line)
        for name, target in (("events", self.events.run), ("kmsg", self.kernel_log.run),
                             ("periodic", self.periodic.run), ("applier", self.applier.run)):
            self.beats.beat(name)
            threading.Thread(target=target, name=name, daemon=True).start()
        # No heartbeat: a diagnostic run is bounded by its own timeout and may take a quarter of an hour.
        threading.Thread(target=self.diagnostics.run, name="diagnostics", daemon=True).start()
        self.write_state()
        sdnotify.notify("READY=1")
        last_state = 0.0
        while not self.stop.is_set():
            dirty = False
            try:
                item = self.inbox.get(timeout=0.5)
                for _ in range(BATCH):  # a storm is judged as a batch, then written once
                    self.shell.handle(item)
                    dirty = True
                    item = self.inbox.get_nowait()
                else:
                    self.shell.handle(item)
            except queue.Empty:
                pass
            self.events.check_hang()
            if self.reload.is_set():
                self.reload.clear()
                sdnotify.notify("RELOADING=1")
                self.reload_config()
                sdnotify.notify("READY=1")
            if dirty or self.clock.monotonic() - last_state > STATE_REFRESH_S:
                self.write_state()
                last_state = self.clock.monotonic()
            self.status.feed_watchdog()
        sdnotify.notify("STOPPING=1")
        self.write_state()
        return 0
