"""What the testbed cluster looks like: hosts, addresses, switches and file locations.

Pure data: nothing here touches the machine.  Everything that starts a daemon or
creates a namespace reads its paths and names from a `Layout`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path(os.environ.get("CLUSTERCTL_TESTBED_DIR", "/tmp/ctb"))
"""Where the testbed keeps everything. Kept short: unix socket paths must stay under 108 bytes."""

CONTROLLER = "ctl"
"""The controller host, which doubles as the login node (slurmctld, slurmdbd, MariaDB, munged)."""


@dataclass(frozen=True)
class Layout:
    """A testbed cluster: compute nodes under leaf switches under one spine, plus a controller."""

    root: Path = DEFAULT_ROOT
    leaves: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("leaf1", ("node1", "node2")),
        ("leaf2", ("node3", "node4")),
    )
    spine: str = "spine"
    gpus_per_node: int = 8
    cpus_per_node: int = 16
    subnet: str = "10.77.0"
    """First three octets of a /24 that exists only inside the testbed's namespaces."""
    namespace_prefix: str = "ctb-"
    healthd: bool = True
    """Run healthd on every compute node, as the systemd unit would."""
    healthd_interval: float = 2.0
    """healthd's periodic-check interval on the testbed (short, so tests see periodic findings quickly)."""
    breaker_max_share: float = 0.5
    topology: str = "tree"
    """Slurm's topology plugin: "tree" (the leaves as switches under the spine) or "block" (each
    leaf a block, as in an NVLink-domain cluster; topology/block needs Slurm 23.11 or newer)."""
    nic_link_layer: str = "InfiniBand"
    """Each node's emulated NICs (ib_faults.py): "InfiniBand" ports, or "Ethernet" for RoCE ports with their
    `hw_counters` and netdev statistics (the `roce-*` faults need these)."""
    timeouts: str = "fast"
    """Slurm's node and kill timeouts (clusterctl_testbed.slurm_config.TIMEOUTS): "fast" (5/2/5 s, the
    suite's) or "production" (Slurm's defaults, 300/10/30 s, what a real cluster runs)."""

    @property
    def nodes(self) -> tuple[str, ...]:
        """Compute nodes in leaf order."""
        return tuple(node for _, members in self.leaves for node in members)

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every host of the testbed: the controller first, then the compute nodes."""
        return (CONTROLLER, *self.nodes)

    def address(self, host: str) -> str:
        """The host's IPv4 address on the testbed network."""
        if host == CONTROLLER:
            return f"{self.subnet}.2"
        return f"{self.subnet}.{11 + self.nodes.index(host)}"

    def namespace(self, host: str) -> str:
        """Name of the host's network namespace (as listed by `ip netns`)."""
        return f"{self.namespace_prefix}{host}"

    def leaf_of(self, node: str) -> str:
        """The leaf switch a compute node hangs under."""
        for leaf, members in self.leaves:
            if node in members:
                return leaf
        raise KeyError(node)

    # ---- files -------------------------------------------------------------
    @property
    def etc(self) -> Path:
        """Bind-mounted over /etc/slurm inside every testbed host."""
        return self.root / "etc" / "slurm"

    @property
    def hosts_file(self) -> Path:
        """Bind-mounted over /etc/hosts inside every testbed host."""
        return self.root / "etc" / "hosts"

    @property
    def ld_cache(self) -> Path:
        """Bind-mounted over /etc/ld.so.cache on compute nodes so libnvidia-ml.so.1 resolves there."""
        return self.root / "etc" / "ld.so.cache"

    @property
    def lib_dir(self) -> Path:
        """Holds the emulated libnvidia-ml.so.1."""
        return self.root / "lib"

    @property
    def nvml_dir(self) -> Path:
        """Per-node GPU state and event files read by the emulated NVML (`nvml/<node>/`)."""
        return self.root / "nvml"

    @property
    def dev_dir(self) -> Path:
        """Character devices standing in for /dev/nvidia[0-7] in gres.conf."""
        return self.root / "dev"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def spool_dir(self) -> Path:
        return self.root / "spool"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.sock"

    @property
    def mysql_dir(self) -> Path:
        return self.root / "mysql"

    @property
    def mysql_socket(self) -> Path:
        return self.root / "mysql.sock"

    def host_dir(self, host: str) -> Path:
        """Files private to one host: bound over /run/healthd and /etc/clusterctl there."""
        return self.root / "hosts" / host

    @property
    def pid_file(self) -> Path:
        """JSON map of every process the testbed started: name -> PID."""
        return self.run_dir / "pids.json"
