"""healthd run: watch NVML events, the kernel log and periodic checks; drain through a journal.

Threads and who owns what:
  events    NVML event wait loop (Xid, DBE, GPU unavailable, recovery action) → findings
  kmsg      kernel-log follower (NVRM Xid lines) → findings
  periodic  every check_interval: NVML samples, GPU count, host checks, node state → findings
  applier   applies journaled Slurm actions one at a time, retrying while slurmctld is away
  main      judges findings (policy), journals actions, writes the state file, feeds the watchdog

The watchdog is fed only while the main loop, the applier and the periodic loop are alive;
a hung NVML call is a finding, not a reason to die.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pynvml

from clusterctl.healthd import sdnotify
from clusterctl.healthd.checks import HostSample, Sustained, check_gpu, check_gpu_count, check_host
from clusterctl.healthd.config import ConfigError, HealthdConfig, load_config
from clusterctl.healthd.findings import Action, Finding, Verdict
from clusterctl.healthd.journal import Journal, PlannedAction
from clusterctl.healthd.kmsg import Cursor, Deduplicator, KernelLog, load_cursor, parse_gpu_event, read_boot_id, save_cursor
from clusterctl.healthd.metrics import Metrics
from clusterctl.healthd.nvml import EventWatcher, GpuIdentity, Nvml, NvmlHang, TimedCalls
from clusterctl.healthd.policy import POLICY_VERSION, drain_reason, judge
from clusterctl.slurm.nodes import NodeState, SlurmNode
from clusterctl.healthd.state_file import write_state
from clusterctl.errors import SlurmCommandError

log = logging.getLogger("healthd")

EVENT_KINDS = {
    pynvml.nvmlEventTypeXidCriticalError: "xid",
    pynvml.nvmlEventTypeDoubleBitEccError: "ecc-dbe",
    getattr(pynvml, "nvmlEventTypeGpuUnavailableError", -1): "gpu-lost",
    getattr(pynvml, "nvmlEventTypeGpuRecoveryAction", -2): "recovery-action",
}


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resume_allowed(reason: str, boot_time: float) -> bool:
    """Evidence rule for resuming our own drain once checks are clean again.

    drain-reset: clean checks are the evidence (the GPU was reset).  drain-reboot: only if
    the node booted after the drain.  drain-rma: never (the hardware must be replaced).
    """
    if Action.DRAIN_RMA.label in reason:
        return False
    if Action.DRAIN_REBOOT.label in reason:
        stamp = reason.rsplit(" ", 1)[-1]
        try:
            drained_at = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            return False
        return boot_time > drained_at
    return True


class Daemon:
    """One healthd process on one node."""

    def __init__(self, config: HealthdConfig, *, config_path: Path | None = None,
                 slurm: SlurmNode | None = None, clock: Callable[[], float] = time.time) -> None:
        self.config, self.config_path, self.clock = config, config_path, clock
        self.node = config.node_name
        self.slurm = slurm or SlurmNode(self.node)
        self.metrics = Metrics()
        self.calls = TimedCalls(config.nvml_timeout, self.metrics.observe_call)
        self.nvml = Nvml(self.calls)
        self.nvml_ready = False
        self.findings: queue.Queue[tuple[str, list[Finding]]] = queue.Queue()
        self.actions: queue.Queue[PlannedAction] = queue.Queue()
        self.applied: queue.Queue[float] = queue.Queue()  # times of drain decisions the applier finished
        config.journal_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(config.journal_dir / "actions.jsonl")
        self.history_path = config.journal_dir / "xid-history.jsonl"
        self.history: list[Finding] = self._load_history()
        self.stop = threading.Event()
        self.reload = threading.Event()
        self.heartbeat: dict[str, float] = {}
        self.event_dedup = Deduplicator(config.xid_dedup_window)
        self.kmsg_dedup = Deduplicator(config.xid_dedup_window)
        self.sustained = Sustained()
        # What the state file shows.
        self.gpu_findings: dict[str, list[dict]] = {}
        self.events: list[dict] = []
        self.alerts: list[dict] = []
        self.node_state: NodeState | None = None
        self.clean_cycles = 0
        self.drain_in_flight = False
        self.hang_reported: set[str] = set()
        self.gpu_count = 0
        self.started = clock()

    # ---- history of app-level Xids (survives restarts) ---------------------------------
    def _load_history(self) -> list[Finding]:
        out = []
        try:
            for line in self.history_path.read_text().splitlines():
                data = json.loads(line)
                data["job_ids"] = tuple(data.get("job_ids", ()))
                out.append(Finding(**data))
        except (OSError, ValueError, TypeError):
            pass
        return out

    def _remember(self, finding: Finding) -> None:
        self.history.append(finding)
        with open(self.history_path, "a") as f:
            f.write(json.dumps(asdict(finding)) + "\n")

    # ---- threads --------------------------------------------------------------------------
    def _beat(self, name: str) -> None:
        self.heartbeat[name] = time.monotonic()

    def _init_nvml(self) -> bool:
        try:
            self.nvml.init()
            self.nvml.discover()
            self.nvml_ready = True
        except (pynvml.NVMLError, NvmlHang) as exc:
            self.findings.put(("periodic", [Finding("nvml-error", "periodic", self.clock(),
                                                    detail=f"NVML unavailable: {exc}")]))
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
            except pynvml.NVMLError_GpuIsLost:
                # Once a registered GPU is lost every wait fails at once: find it, rebuild without it.
                self._report_lost_gpus("nvml-event")
                watched = []
                self.stop.wait(0.2)
                continue
            except (pynvml.NVMLError, NvmlHang) as exc:
                self.findings.put(("nvml-event", [Finding("nvml-error", "nvml-event", self.clock(), detail=str(exc))]))
                watched = []
                self.stop.wait(1.0)
                continue
            if event is None:
                continue
            self.metrics.last_event.set(self.clock())
            kind = EVENT_KINDS.get(event.event_type, "nvml-error")
            identity = self.nvml.identities.get(event.gpu)
            finding = Finding(kind, "nvml-event", self.clock(), gpu=event.gpu if event.gpu >= 0 else None,
                              uuid=identity.uuid if identity else "",
                              xid=event.data if kind == "xid" else None,
                              value=event.data if kind == "recovery-action" else None)
            if self.event_dedup.first((finding.gpu, finding.kind, finding.xid), finding.at):
                self.findings.put(("nvml-event", [finding]))

    def _report_lost_gpus(self, source: str) -> None:
        lost = []
        for index, handle in list(self.nvml.handles.items()):
            try:
                self.calls("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle)
            except pynvml.NVMLError_GpuIsLost:
                lost.append(index)
                del self.nvml.handles[index]
            except (pynvml.NVMLError, NvmlHang):
                pass
        now = self.clock()
        found = [Finding("gpu-lost", source, now, gpu=i, uuid=self.nvml.identities[i].uuid if i in
                         self.nvml.identities else "", detail="NVML_ERROR_GPU_IS_LOST") for i in lost]
        found = [f for f in found if self.event_dedup.first((f.gpu, f.kind, None), now)]
        if found:
            self.findings.put((source, found))

    def _kmsg_loop(self) -> None:
        path = self.config.kmsg
        cursor_path = self.config.journal_dir / "kmsg.cursor"
        boot_id = read_boot_id(self.config.boot_id)
        while not self.stop.is_set():
            self._beat("kmsg")
            if not path.exists():
                self.stop.wait(2.0)
                continue
            reader = KernelLog(path, boot_id, load_cursor(cursor_path))
            try:
                for record in reader.follow(self.stop):
                    self._beat("kmsg")
                    event = parse_gpu_event(record)
                    if event is not None:
                        gpu = next((i.index for i in self.nvml.identities.values() if i.pci_bus == event.pci_bus), None)
                        uuid = self.nvml.identities[gpu].uuid if gpu is not None else ""
                        finding = Finding("xid", "kmsg", self.clock(), gpu=gpu, uuid=uuid, xid=event.xid,
                                          value=event.pci_bus, detail=event.message[:200])
                        if self.kmsg_dedup.first((event.pci_bus, event.xid), finding.at):
                            self.findings.put(("kmsg", [finding]))
                    save_cursor(cursor_path, Cursor(boot_id, record.sequence))
            except OSError as exc:
                log.warning("kernel log %s: %s", path, exc)
                self.stop.wait(2.0)

    def _periodic_loop(self) -> None:
        while not self.stop.is_set():
            self._beat("periodic")
            started = time.monotonic()
            findings = self._periodic_checks()
            self.findings.put(("periodic", findings))
            self._beat("periodic")
            self.stop.wait(max(0.0, self.config.check_interval - (time.monotonic() - started)))

    def _periodic_checks(self) -> list[Finding]:
        now = self.clock()
        limits = self.config.checks
        findings: list[Finding] = []
        if not self.nvml_ready:
            self._init_nvml()
        if self.nvml_ready:
            try:
                count = self.nvml.count()
                self.gpu_count = count
                findings += check_gpu_count(count, limits, now)
                for index in range(count):  # also GPUs lost before we started: their sample says lost
                    try:
                        findings += check_gpu(self.nvml.sample(index), limits, self.sustained, now)
                    except NvmlHang as exc:
                        findings.append(Finding("nvml-hang", "periodic", now, gpu=index, value=exc.function,
                                                detail=str(exc)))
                    except pynvml.NVMLError as exc:
                        findings.append(Finding("nvml-error", "periodic", now, gpu=index, detail=str(exc)))
            except NvmlHang as exc:
                findings.append(Finding("nvml-hang", "periodic", now, value=exc.function, detail=str(exc)))
            except pynvml.NVMLError as exc:
                findings.append(Finding("nvml-error", "periodic", now, detail=str(exc)))
        findings += check_host(self._host_sample(), limits, now)
        try:
            self.node_state = self.slurm.state()
        except SlurmCommandError as exc:
            log.info("slurm unreachable for node state: %s", exc)
        return findings

    def _host_sample(self) -> HostSample:
        memory = psutil.virtual_memory()
        free: dict[str, float] = {}
        readonly: list[str] = []
        mounts = {p.mountpoint: p for p in psutil.disk_partitions(all=True)}
        for path in self.config.disk_paths:
            try:
                usage = psutil.disk_usage(path)
            except OSError:
                continue
            free[path] = usage.free / usage.total if usage.total else 1.0
            mount = mounts.get(path)
            if mount is not None and "ro" in mount.opts.split(","):
                readonly.append(path)
        return HostSample(memory.available / memory.total, free, tuple(readonly))

    def _applier_loop(self) -> None:
        backoff = 0.2
        for action in self.journal.pending():  # decided before a restart: apply now, exactly once
            self.actions.put(action)
        while not self.stop.is_set():
            self._beat("applier")
            try:
                action = self.actions.get(timeout=0.5)
            except queue.Empty:
                continue
            while not self.stop.is_set():
                try:
                    result = self._apply(action)
                    break
                except SlurmCommandError as exc:
                    self._beat("applier")
                    log.warning("slurm unreachable, will retry %s: %s", action.op, exc)
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
            else:
                return
            backoff = 0.2
            self.journal.done(action.id, result)
            self.metrics.drain_actions.labels(action.op, result).inc()
            log.info("%s node %s: %s (%s)", action.op, self.node, result, action.reason)
            if action.op == "drain":
                self.drain_in_flight = False
                self.applied.put(action.at)

    def _apply(self, action: PlannedAction) -> str:
        state = self.slurm.state()
        if action.op == "resume":
            if not state.drained_by_us:
                return "not-ours"
            if self.config.dry_run:
                return "dry-run"
            self.slurm.resume()
            return "resumed"
        if state.drained_by_someone_else:
            return "kept-other-drain"  # never overwrite an admin's (or another tool's) reason
        if state.drained_by_us:
            return "already-drained"
        partition = self.config.partition or (state.partitions[0] if state.partitions else "")
        if partition and self.config.breaker_max_share < 1:
            nodes = self.slurm.partition_nodes(partition)
            ours = [n for n in nodes if n.drained_by_us and n.name != self.node]
            if nodes and (len(ours) + 1) / len(nodes) > self.config.breaker_max_share:
                alert = {"at": utc(self.clock()), "alert": "breaker-open", "reason": action.reason,
                         "detail": f"{len(ours)} of {len(nodes)} nodes in {partition} already drained by healthd; "
                                   f"draining {self.node} would exceed {self.config.breaker_max_share:.0%}"}
                self.alerts.append(alert)
                self.metrics.breaker_open.set(1)
                log.error("breaker open: not draining %s: %s", self.node, alert["detail"])
                return "breaker-open"
        if self.config.dry_run:
            log.warning("dry run: would drain %s: %s", self.node, action.reason)
            return "dry-run"
        self.slurm.drain(action.reason)
        return "drained"

    # ---- main loop: judging -----------------------------------------------------------------
    def _judge(self, source: str, findings: list[Finding]) -> None:
        now = self.clock()
        if source == "periodic":
            self.gpu_findings = {}
        worst: tuple[Action, Finding, Verdict] | None = None
        for finding in findings:
            if finding.kind == "xid" and finding.xid is not None:
                verdict = judge(finding, self.history, self.config.policy)
                if verdict.action is Action.APP_FAULT or verdict.rule.endswith("repeated"):
                    finding = self._with_jobs(finding)
                    verdict = judge(finding, self.history, self.config.policy)
                self._remember(finding)
            else:
                verdict = judge(finding, self.history, self.config.policy)
            self.metrics.findings.labels(finding.kind, verdict.action.label).inc()
            entry = {"at": utc(finding.at), "kind": finding.what, "source": finding.source, "gpu": finding.gpu,
                     "uuid": finding.uuid, "detail": finding.detail, "action": verdict.action.label,
                     "reason": verdict.reason, "jobs": list(finding.job_ids)}
            key = str(finding.gpu) if finding.gpu is not None else "node"
            if source == "periodic":
                self.gpu_findings.setdefault(key, []).append(entry)
            elif verdict.action > Action.IGNORE:
                # "handled": healthd has acted on it (drained, or the breaker/an admin drain decided);
                # from then on the prolog leaves it to Slurm's node state and to its own direct checks.
                self.events.append({**entry, "at_ts": finding.at, "handled": False, "acknowledged": False})
                self.events = self.events[-50:]
            if finding.kind == "nvml-hang" and source != "periodic":
                log.warning("%s", finding.detail)
            if verdict.action > Action.IGNORE:
                log.info("finding %s gpu=%s via %s → %s (%s)", finding.what, finding.gpu, source,
                         verdict.action.label, verdict.reason)
            if verdict.action.drains and (worst is None or verdict.action > worst[0]):
                worst = (verdict.action, finding, verdict)
        if worst is not None:
            self.clean_cycles = 0
            _, finding, verdict = worst
            known_drained = self.node_state is not None and self.node_state.drained_by_us
            if not self.drain_in_flight and not (source == "periodic" and known_drained):
                self._plan("drain", drain_reason(finding, verdict, utc(now)), finding)
        elif source == "periodic":
            self._maybe_resume()
        self._acknowledge_if_resumed()

    def _with_jobs(self, finding: Finding) -> Finding:
        try:
            jobs = self.slurm.jobs_here()
        except SlurmCommandError:
            jobs = ()
        return Finding(**{**asdict(finding), "job_ids": jobs or ("unknown",)})

    def _plan(self, op: str, reason: str, finding: Finding | None) -> None:
        action = PlannedAction(f"{op}-{self.node}-{time.time_ns()}", op, reason, self.clock(),
                               asdict(finding) if finding else {})
        self.journal.plan(action)  # durable before anything is attempted
        if op == "drain":
            self.drain_in_flight = True
        self.actions.put(action)

    def _maybe_resume(self) -> None:
        state = self.node_state
        if not (self.config.resume_when_clean and state is not None and state.drained_by_us):
            self.clean_cycles = 0
            return
        if not resume_allowed(state.reason, psutil.boot_time()):
            return
        self.clean_cycles += 1
        if self.clean_cycles >= self.config.clean_checks:
            self.clean_cycles = 0
            self._plan("resume", state.reason, None)

    def _acknowledge_if_resumed(self) -> None:
        state = self.node_state
        if state is not None and not state.draining:
            newly = False
            for event in self.events:
                if (Action[event["action"].upper().replace("-", "_")].drains and not event["acknowledged"]
                        and event["at_ts"] < self.clock() - 1):
                    event["acknowledged"] = newly = True
            if newly:
                # The node is back in service: the same fault again is a new fault, not part of a storm.
                self.event_dedup.last.clear()
                self.kmsg_dedup.last.clear()

    # ---- state, watchdog, signals ---------------------------------------------------------
    def _state(self) -> dict:
        gpus = {}
        # GPUs lost before healthd started have no identity (NVML cannot tell it) but still get a row.
        for index in sorted(set(self.nvml.identities) | set(range(self.gpu_count))):
            identity = self.nvml.identities.get(index) or GpuIdentity(index, "", "")
            current = self.gpu_findings.get(str(index), [])
            recent = [e for e in self.events if e["gpu"] == index and not e["acknowledged"]]
            actions = [Action[e["action"].upper().replace("-", "_")] for e in current + recent]
            worst = max(actions, default=Action.IGNORE)
            self.metrics.gpu_verdict.labels(str(index)).set(int(worst))
            gpus[str(index)] = {"uuid": identity.uuid, "pci_bus": identity.pci_bus, "verdict": worst.label,
                                "findings": current + recent}
        node_level = self.gpu_findings.get("node", []) + [e for e in self.events if e["gpu"] is None
                                                           and not e["acknowledged"]]
        all_actions = [Action[g["verdict"].upper().replace("-", "_")] for g in gpus.values()]
        all_actions += [Action[e["action"].upper().replace("-", "_")] for e in node_level]
        now = self.clock()
        stale = {name: round(time.monotonic() - beat, 1) for name, beat in self.heartbeat.items()}
        return {
            "node": self.node, "pid": os.getpid(), "policy_version": POLICY_VERSION,
            "updated_at": now, "updated": utc(now), "started": utc(self.started),
            "nvml": "ok" if self.nvml_ready else "unavailable",
            "verdict": max(all_actions, default=Action.IGNORE).label,
            "gpus": gpus, "node_findings": node_level, "pending_actions": len(self.journal.pending()),
            "slurm": asdict(self.node_state) if self.node_state else None,
            "alerts": self.alerts[-20:], "loop_age_s": stale, "dry_run": self.config.dry_run,
        }

    def _loops_alive(self) -> bool:
        now = time.monotonic()
        limits = {"applier": 10.0, "periodic": self.config.check_interval + 10 * self.config.nvml_timeout + 10}
        return all(now - self.heartbeat.get(name, now) < limit for name, limit in limits.items())

    def _check_event_watcher(self) -> None:
        beat = self.heartbeat.get("events")
        limit = self.config.event_wait_ms / 1000 + self.config.nvml_timeout
        if beat is not None and self.nvml_ready and time.monotonic() - beat > limit:
            if "nvmlEventSetWait" not in self.hang_reported:
                self.hang_reported.add("nvmlEventSetWait")
                self.metrics.nvml_hangs.labels("nvmlEventSetWait").inc()
                self.findings.put(("watchdog", [Finding("nvml-hang", "watchdog", self.clock(),
                                                        value="nvmlEventSetWait",
                                                        detail=f"nvmlEventSetWait has not returned for "
                                                               f"{time.monotonic() - beat:.0f} s")]))
        elif beat is not None and time.monotonic() - beat <= limit:
            self.hang_reported.discard("nvmlEventSetWait")

    def _reload(self) -> None:
        try:
            fresh = load_config(self.config_path)
        except ConfigError as exc:  # a bad edit must not kill a running daemon: keep the old config
            log.error("config reload failed, keeping the running config: %s", exc)
            return
        self.config = fresh
        self.calls.timeout = fresh.nvml_timeout
        log.info("configuration reloaded from %s", self.config_path)

    def run(self) -> int:
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
                             ("periodic", self._periodic_loop), ("applier", self._applier_loop)):
            self._beat(name)
            threading.Thread(target=target, name=name, daemon=True).start()
        write_state(self.config.state_dir, self._state())
        sdnotify.notify("READY=1")
        last_state = 0.0
        while not self.stop.is_set():
            try:
                source, findings = self.findings.get(timeout=0.5)
                self._judge(source, findings)
                dirty = True
            except queue.Empty:
                dirty = False
            self._check_event_watcher()
            while not self.applied.empty():
                decided_at = self.applied.get()
                for event in self.events:
                    if event["at_ts"] <= decided_at + 1e-3:
                        event["handled"] = True
                dirty = True
            if self.reload.is_set():
                self.reload.clear()
                sdnotify.notify("RELOADING=1")
                self._reload()
                sdnotify.notify("READY=1")
            # Rewritten on every change, else every 5 s: readers call it fresh for max(3 intervals, 30 s).
            if dirty or time.monotonic() - last_state > 5.0:
                write_state(self.config.state_dir, self._state())
                last_state = time.monotonic()
            if self._loops_alive():
                sdnotify.notify("WATCHDOG=1")
        sdnotify.notify("STOPPING=1")
        write_state(self.config.state_dir, self._state())
        return 0
