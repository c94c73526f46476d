"""healthd run: the threads around the engine (engine.py decides; this module only moves data).

Threads and what they move:
  events    NVML event wait loop (Xid, DBE, GPU unavailable, recovery action) → inbox
  kmsg      kernel-log follower (NVRM Xid lines) → inbox; keeps the kernel-log cursor
  periodic  every check_interval: GPU and host samples (sampler.py) → inbox; Slurm's view of the node
            only every node_refresh_interval (jittered), or every drained_refresh_interval while
            it decides something (drained, events waiting for the node to be back in service)
  applier   applies journaled actions one at a time (retrying while slurmctld is away) → inbox;
            its state and loop are `Applier` (applier.py)
  main      the only owner of the engine state: steps it, journals planned actions before
            handing them to the applier, writes the state file, feeds the watchdog

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
import os
import queue
import random
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from clusterctl.clock import SYSTEM_CLOCK, Clock
from clusterctl.errors import SlurmCommandError
from clusterctl.healthd import engine, sdnotify
from clusterctl.healthd.applier import Applied, Applier
from clusterctl.healthd.checks import HostSample, Sustained, check_host
from clusterctl.healthd.config import ConfigError, HealthdConfig, load_config
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.journal import Journal, PlannedAction
from clusterctl.healthd.kmsg import KernelLog, KernelRecord, parse_gpu_event, read_boot_id
from clusterctl.healthd.metrics import Metrics
from clusterctl.healthd.nvml import (
    EventWatcher, GpuIsLost, Nvml, NvmlCalls, NvmlDoor, NvmlError, NvmlHang, TimedCalls, lost_gpus,
)
from clusterctl.healthd.policy import POLICY_VERSION
from clusterctl.healthd.sampler import sample_host, scan_gpus
from clusterctl.records.healthd_kmsg_cursor import KmsgCursor, read_kmsg_cursor, write_kmsg_cursor
from clusterctl.records.healthd_state import HealthdState, write_healthd_state
from clusterctl.records.healthd_job_start import read_job_starts
from clusterctl.records.healthd_xid_history import (
    XidSighting, append_xid_sighting, read_xid_history, rewrite_xid_history, xid_history_path,
)
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.nodes import NodeSlurm, NodeState, SlurmNode

log = logging.getLogger("healthd")

STATE_REFRESH_S = 5.0
"""The state file is rewritten on every change, else this often: readers call it fresh for max(3 intervals, 30 s)."""
BATCH = 100
"""At most this many inputs are handled between two state-file writes and watchdog feeds."""
CURSOR_SAVE_S = 1.0
"""The kernel-log cursor is saved when the log goes quiet, and at most this often while it is busy."""


@dataclass(frozen=True)
class Observed:
    """A batch of findings from one thread (periodic: with Slurm's view of the node and the GPU count)."""

    source: str
    findings: tuple[Finding, ...]
    node: NodeState | None = None
    node_at: float | None = None
    gpu_count: int | None = None


class Daemon:
    """One healthd process on one node."""

    def __init__(self, config: HealthdConfig, *, config_path: Path | None = None, slurm: NodeSlurm | None = None,
                 nvml: NvmlDoor | None = None, clock: Clock = SYSTEM_CLOCK, metrics: Metrics | None = None,
                 host_sampler: Callable[[Sequence[str]], HostSample] = sample_host,
                 boot_time: Callable[[], float] = psutil.boot_time,
                 jitter: Callable[[float, float], float] = random.uniform) -> None:
        self.config, self.config_path, self.clock = config, config_path, clock
        self.node = config.node_name
        self.slurm = slurm or SlurmNode(self.node)
        self.metrics = metrics or Metrics()
        self.calls: NvmlCalls = nvml.call if nvml is not None else TimedCalls(config.nvml_timeout, self.metrics.observe_call)
        self.nvml: NvmlDoor = nvml or Nvml(self.calls)
        self.host_sampler, self.boot_time, self.jitter = host_sampler, boot_time, jitter
        self.node_due = clock.monotonic()  # the first periodic check reads the node
        self.node_read_at = clock.monotonic()
        self.nvml_ready = False
        self.inbox: queue.Queue[Observed | Applied] = queue.Queue()
        config.journal_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(config.journal_dir / "actions.jsonl")
        try:
            self.journal.read()
        except RecordError as exc:
            self._set_aside(self.journal.path, exc, "its pending Slurm actions, if any, are not applied")
        self.settings = engine.EngineSettings.from_config(config, self.node)
        self.state = engine.restore(self._xid_history())
        self.stop = threading.Event()
        self.reload = threading.Event()
        self.heartbeat: dict[str, float] = {}
        self.hang_reported: set[str] = set()
        self.gpu_count = 0
        self.sustained = Sustained()
        self.started = clock.now()
        self.applier = Applier(config, self.settings, slurm=self.slurm, journal=self.journal, metrics=self.metrics,
                               clock=clock, jitter=jitter, stop=self.stop, beat=lambda: self._beat("applier"),
                               report=self.inbox.put)

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

    def _xid_history(self) -> tuple[XidSighting, ...]:
        try:
            sightings = read_xid_history(self.config.journal_dir)
        except RecordError as exc:  # start without it: fewer repeats recognised, never more
            self._set_aside(xid_history_path(self.config.journal_dir), exc, "earlier Xids do not count as repeats")
            return ()
        kept = engine.history_to_keep(sightings, self.config.policy, self.clock.now())
        if len(kept) < len(sightings):  # the file holds only what can still count: it stays small
            rewrite_xid_history(self.config.journal_dir, kept)
        return kept

    def _set_aside(self, path: Path, error: RecordError, consequence: str) -> None:
        # A file from another healthd version would stop every later line from being read: keep it
        # for the admin under another name and start a new one.
        aside = path.with_name(f"{path.name}.unreadable-{int(self.clock.now())}")
        os.replace(path, aside)
        log.error("%s; moved it to %s and started a new one (%s)", error, aside, consequence)

    # ---- the engine, stepped by the main thread only ---------------------------------------
    def handle(self, item: Observed | Applied) -> None:
        """Step the engine with one input and carry out its effects (journal first, then hand over)."""
        now = self.clock.now()
        if isinstance(item, Applied):
            outcome = engine.applied(self.state, item.action, item.decision, now,
                                     retry_after=self.applier.retry_after(item.decision), node=item.node)
        else:
            if item.gpu_count is not None:
                self.gpu_count = item.gpu_count
            findings = tuple(self._with_jobs(f) if engine.needs_jobs(self.state, self.settings, f) else f
                             for f in item.findings)
            outcome = engine.step(self.state, self.settings, item.source, findings, now, node=item.node,
                                  node_at=item.node_at, boot_time=self.boot_time() if item.source == "periodic" else 0.0)
            for judged in outcome.judged:
                self.metrics.findings.labels(judged.finding.kind, judged.verdict.action.label).inc()
                if judged.finding.kind == "nvml-hang" and item.source != "periodic":
                    log.warning("%s", judged.finding.detail)
                if judged.verdict.action > Action.IGNORE:
                    log.info("finding %s gpu=%s via %s → %s (%s)", judged.finding.what, judged.finding.gpu,
                             item.source, judged.verdict.action.label, judged.verdict.reason)
        self.state = outcome.state
        for effect in outcome.effects:
            if isinstance(effect, engine.Remember):
                append_xid_sighting(self.config.journal_dir, effect.sighting)
            elif isinstance(effect, (engine.Drain, engine.Resume)):
                self.journal.plan(effect.planned)  # durable before anything is attempted
                self.applier.actions.put(effect.planned)
            elif isinstance(effect, engine.RaiseAlert):
                self.metrics.breaker_open.set(1)
                log.error("breaker open: not draining %s: %s", self.node, effect.alert.detail)

    def _with_jobs(self, finding: Finding) -> Finding:
        """Attribute an app-level Xid to the one job that owned its GPU (and that job's user), or "unknown"."""
        starts, problems = read_job_starts(self.config.journal_dir)
        for problem in problems:
            log.warning("job-start note not read: %s", problem)
        try:
            running: tuple[str, ...] | None = self.slurm.jobs_here()
        except SlurmCommandError:
            running = None
        owner = engine.owner_of_gpu(finding.gpu, starts, running)
        if owner is None:
            return replace(finding, job_ids=("unknown",), users=("",))
        return replace(finding, job_ids=(owner[0],), users=(owner[1],))

    # ---- threads: data in ------------------------------------------------------------------
    def _beat(self, name: str) -> None:
        self.heartbeat[name] = self.clock.monotonic()

    def _init_nvml(self) -> bool:
        try:
            self.nvml.init()
            self.nvml.discover()
            self.nvml_ready = True
        except (NvmlError, NvmlHang) as exc:
            self.inbox.put(Observed("periodic", (Finding("nvml-unavailable", "periodic", self.clock.now(),
                                                         detail=f"NVML unavailable: {exc}"),)))
            self.nvml_ready = False
        return self.nvml_ready

    def _events_loop(self) -> None:
        watcher = EventWatcher(self.nvml)
        watched: list[int] = []
        while not self.stop.is_set():
            self._beat("events")
            if not self.nvml_ready:
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
                self._report_lost_gpus("nvml-event")
                watched = []
                self.stop.wait(0.2)
                continue
            except (NvmlError, NvmlHang) as exc:
                self.inbox.put(Observed("nvml-event", (Finding("nvml-error", "nvml-event", self.clock.now(),
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
            self.inbox.put(Observed("nvml-event", (Finding(
                kind, "nvml-event", now, gpu=event.gpu if event.gpu >= 0 else None,
                uuid=identity.uuid if identity else "", xid=event.data if kind == "xid" else None,
                value=event.data if kind == "recovery-action" else None),)))

    def _report_lost_gpus(self, source: str) -> None:
        lost = lost_gpus(self.nvml)
        now = self.clock.now()
        identities = self.nvml.identities
        found = tuple(Finding("gpu-lost", source, now, gpu=i, uuid=identities[i].uuid
                              if i in identities else "", detail="NVML_ERROR_GPU_IS_LOST") for i in lost)
        if found:
            self.inbox.put(Observed(source, found))

    def _kmsg_loop(self) -> None:
        path = self.config.kmsg
        boot_id = read_boot_id(self.config.boot_id)
        while not self.stop.is_set():
            self._beat("kmsg")
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
                    self._beat("kmsg")
                    found = self._kernel_findings(batch)
                    if found:
                        self.inbox.put(Observed("kmsg", found))
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

    def _periodic_loop(self) -> None:
        while not self.stop.is_set():
            self._beat("periodic")
            started = self.clock.monotonic()
            self.inbox.put(self.periodic_check())
            self._beat("periodic")
            self.stop.wait(max(0.0, self.config.check_interval - (self.clock.monotonic() - started)))

    def periodic_check(self) -> Observed:
        """One pass of the periodic thread: sample GPUs and host, read the node when due (and give
        back its breaker slot when it is back in service)."""
        now = self.clock.now()
        findings: list[Finding] = []
        count = None
        if not self.nvml_ready:
            self._init_nvml()
        if self.nvml_ready:
            scan = scan_gpus(self.nvml, self.config.checks, self.sustained, now, source="periodic")
            findings += scan.findings
            count = scan.count
        findings += check_host(self.host_sampler(self.config.watched_disk_paths), self.config.checks, now,
                               self.config.disk_drain_paths)
        node, node_at = None, None
        watching = engine.watching_node(self.state)  # a reference read: the main thread replaces, never mutates
        if self.clock.monotonic() >= self.node_due or (
                watching and self.clock.monotonic() - self.node_read_at >= self.config.drained_refresh_interval):
            # Besides healthd (which knows what it did), only an admin or Slurm itself changes this
            # node's state: a slow jittered read is enough, and 12,500 nodes never ask in step.
            read_from = self.clock.monotonic()
            try:
                node, node_at = self.slurm.state(), self.clock.now()
            except SlurmCommandError as exc:
                log.info("slurm unreachable for node state: %s", exc)
            if node is not None:
                self.applier.give_back_slot(node, read_from)
            self.node_read_at = self.clock.monotonic()
            interval = self.config.node_refresh_interval
            self.node_due = self.clock.monotonic() + (interval * self.jitter(0.8, 1.2) if node else
                                                      min(interval, 4 * self.config.check_interval))
        return Observed("periodic", tuple(findings), node, node_at, count)

    # ---- state file, watchdog, signals ---------------------------------------------------------
    def state_view(self) -> HealthdState:
        """What the state file shows now."""
        now = self.clock.monotonic()
        identities = {i: engine.GpuIdentityView(g.uuid, g.pci_bus) for i, g in self.nvml.identities.items()}
        view = engine.state_view(self.state, node=self.node, pid=os.getpid(), started=self.started,
                                 now=self.clock.now(), nvml_ok=self.nvml_ready, identities=identities,
                                 gpu_count=self.gpu_count, pending_actions=len(self.journal.pending()),
                                 loop_age_s={n: round(now - b, 1) for n, b in self.heartbeat.items()},
                                 dry_run=self.config.dry_run)
        for gpu in view.gpus:
            self.metrics.gpu_verdict.labels(str(gpu.index)).set(int(gpu.verdict))
        return view

    def write_state(self) -> None:
        """Replace the state file with what the engine holds now."""
        write_healthd_state(self.config.state_dir, self.state_view())

    def _loops_alive(self) -> bool:
        now = self.clock.monotonic()
        limits = {"applier": 10.0, "periodic": self.config.check_interval + 10 * self.config.nvml_timeout + 10}
        return all(now - self.heartbeat.get(name, now) < limit for name, limit in limits.items())

    def _check_event_watcher(self) -> None:
        beat = self.heartbeat.get("events")
        limit = self.config.event_wait_ms / 1000 + self.config.nvml_timeout
        now = self.clock.monotonic()
        if beat is not None and self.nvml_ready and now - beat > limit:
            if "nvmlEventSetWait" not in self.hang_reported:
                self.hang_reported.add("nvmlEventSetWait")
                self.metrics.nvml_hangs.labels("nvmlEventSetWait").inc()
                self.inbox.put(Observed("watchdog", (Finding(
                    "nvml-hang", "watchdog", self.clock.now(), value="nvmlEventSetWait",
                    detail=f"nvmlEventSetWait has not returned for {now - beat:.0f} s"),)))
        elif beat is not None and now - beat <= limit:
            self.hang_reported.discard("nvmlEventSetWait")

    def reload_config(self) -> bool:
        """Re-read the configuration (SIGHUP); a bad edit keeps the running one.  True when applied."""
        try:
            fresh = load_config(self.config_path)
        except ConfigError as exc:  # a bad edit must not kill a running daemon: keep the old config
            log.error("config reload failed, keeping the running config: %s", exc)
            return False
        self.config = fresh
        self.settings = engine.EngineSettings.from_config(fresh, self.node)
        self.applier.reconfigure(fresh, self.settings)
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
        self._init_nvml()
        log.info("healthd on %s: %d GPUs, policy %s%s", self.node, len(self.nvml.identities), POLICY_VERSION,
                 " (dry run)" if self.config.dry_run else "")
        for name, target in (("events", self._events_loop), ("kmsg", self._kmsg_loop),
                             ("periodic", self._periodic_loop), ("applier", self.applier.run)):
            self._beat(name)
            threading.Thread(target=target, name=name, daemon=True).start()
        self.write_state()
        sdnotify.notify("READY=1")
        last_state = 0.0
        while not self.stop.is_set():
            dirty = False
            try:
                item = self.inbox.get(timeout=0.5)
                for _ in range(BATCH):  # a storm is judged as a batch, then written once
                    self.handle(item)
                    dirty = True
                    item = self.inbox.get_nowait()
                else:
                    self.handle(item)
            except queue.Empty:
                pass
            self._check_event_watcher()
            if self.reload.is_set():
                self.reload.clear()
                sdnotify.notify("RELOADING=1")
                self.reload_config()
                sdnotify.notify("READY=1")
            if dirty or self.clock.monotonic() - last_state > STATE_REFRESH_S:
                self.write_state()
                last_state = self.clock.monotonic()
            if self._loops_alive():
                sdnotify.notify("WATCHDOG=1")
        sdnotify.notify("STOPPING=1")
        self.write_state()
        return 0
