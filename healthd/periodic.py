"""healthd's `periodic` thread: every check_interval, GPU and host samples (sampler.py), the IB/RoCE ports
(checks/network.py) and the shared-storage probe (checks/storage.py: at this node's slot in every
storage_interval_s, its last result in between) → findings.

Slurm's view of the node is read only every node_refresh_interval (jittered), or every
drained_refresh_interval while healthd decides something about it (drained, events waiting for
the node to be back in service); each read also gives back the node's breaker slot once it is in
service again.  This thread (and the start) connects NVML, and again after it was unavailable.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from clusterctl.clock import Clock
from clusterctl.errors import SlurmCommandError
from clusterctl.healthd.checks import HostSample, Sustained, check_host
from clusterctl.healthd.checks.network import NetworkMemory, NicSample, check_network, read_nics
from clusterctl.healthd.checks.pcie import check_nic_links
from clusterctl.healthd.checks.storage import StorageProbe
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.findings import Finding
from clusterctl.healthd.nvml import NvmlDoor, NvmlError, NvmlHang
from clusterctl.healthd.observed import Observed
from clusterctl.healthd.sampler import scan_gpus
from clusterctl.healthd.state_writer import Heartbeats
from clusterctl.slurm.nodes import NodeSlurm, NodeState

log = logging.getLogger("healthd")


class PeriodicCheck:
    """The periodic thread (`run`, one pass: `check`) and NVML's connection (`nvml_ready`)."""

    def __init__(self, config: HealthdConfig, *, nvml: NvmlDoor, slurm: NodeSlurm, clock: Clock,
                 host_sampler: Callable[[Sequence[str]], HostSample], jitter: Callable[[float, float], float],
                 watching_node: Callable[[], bool], give_back_slot: Callable[[NodeState, float], None],
                 beats: Heartbeats, stop: threading.Event, report: Callable[[Observed], None],
                 nic_sampler: Callable[[HealthdConfig], NicSample] | None = None,
                 storage: StorageProbe | None = None) -> None:
        self.config = config
        """Replaced whole on reload (SIGHUP)."""
        self.nvml, self.slurm, self.clock, self.host_sampler, self.jitter = nvml, slurm, clock, host_sampler, jitter
        self.watching_node, self.give_back_slot = watching_node, give_back_slot
        self.beats, self.stop, self.report = beats, stop, report
        self.sustained = Sustained()
        self.nic_sampler = nic_sampler or (lambda config: read_nics(config.ib_root, config.ib_devices))
        self.network = NetworkMemory()
        self.storage = storage or StorageProbe(clock.monotonic, node=config.node_name)
        self.node_due = clock.monotonic()  # the first periodic check reads the node
        """Monotonic time the node is read next (sooner while `watching_node`)."""
        self.node_read_at = clock.monotonic()
        self.nvml_ready = False
        """NVML answered its last init: written by the start and this thread, read by the others."""

    def connect_nvml(self) -> bool:
        """Initialise NVML and discover the GPUs; report NVML unavailable when it fails.  True when ready."""
        try:
            self.nvml.init()
            self.nvml.discover()
            self.nvml_ready = True
        except (NvmlError, NvmlHang) as exc:
            self.report(Observed("periodic", (Finding("nvml-unavailable", "periodic", self.clock.now(),
                                                      detail=f"NVML unavailable: {exc}"),)))
            self.nvml_ready = False
        return self.nvml_ready

    def run(self) -> None:
        """The `periodic` thread: one `check` every check_interval until stopped."""
        while not self.stop.is_set():
            self.beats.beat("periodic")
            started = self.clock.monotonic()
            self.report(self.check())
            self.beats.beat("periodic")
            self.stop.wait(max(0.0, self.config.check_interval - (self.clock.monotonic() - started)))

    def check_network(self, now: float) -> list[Finding]:
        """The IB/RoCE ports and the NICs' PCIe links (nothing on a node without them)."""
        nics = self.nic_sampler(self.config)
        return [*check_network(nics, self.config.checks, self.network, now), *check_nic_links(nics.links, now)]

    def check(self) -> Observed:
        """One pass of the periodic thread: sample GPUs and host, read the node when due (and give
        back its breaker slot when it is back in service)."""
        now = self.clock.now()
        findings: list[Finding] = []
        count = None
        if not self.nvml_ready:
            self.connect_nvml()
        if self.nvml_ready:
            scan = scan_gpus(self.nvml, self.config.checks, self.sustained, now, source="periodic")
            findings += scan.findings
            count = scan.count
        findings += check_host(self.host_sampler(self.config.watched_disk_paths), self.config.checks, now,
                               self.config.disk_drain_paths)
        findings += self.check_network(now)
        findings += self.storage.check(self.config.storage_paths, self.config.checks, now)
        node, node_at = None, None
        watching = self.watching_node()
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
                self.give_back_slot(node, read_from)
            self.node_read_at = self.clock.monotonic()
            interval = self.config.node_refresh_interval
            self.node_due = self.clock.monotonic() + (interval * self.jitter(0.8, 1.2) if node else
                                                      min(interval, 4 * self.config.check_interval))
        return Observed("periodic", tuple(findings), node, node_at, count)
