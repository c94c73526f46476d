"""Bring a real multi-host Slurm cluster up and down on one machine.

Every host (controller `ctl` and compute nodes) is a network namespace plus a
holder process that owns its UTS (hostname) and mount (its own /etc/hosts,
/etc/slurm, /etc/ld.so.cache) namespaces.  Daemons run in the foreground inside
their host via `nsenter`, and are stopped by PID; everything the testbed starts
lives in one of its namespaces, so `down` finds it all with `ip netns pids`.

Which Slurm runs is chosen at `up` (clusterctl_testbed.versions): this machine's own
packages, or a Debian root filesystem (clusterctl_testbed.rootfs) every host is chrooted
into, daemons, commands, hooks and healthd alike.  The choice is kept in `<root>/run/slurm.json`
so every later command (`on`, `kill-node`, `status`) enters the same root.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import clusterctl
from clusterctl_testbed import rootfs, slurm_config, versions
from clusterctl_testbed.dcgmi_emu import write_dcgmi
from clusterctl_testbed.ib_faults import build_tree
from clusterctl_testbed.layout import CONTROLLER, Layout
from clusterctl_testbed.private_root import ensure_private_root
from clusterctl_testbed.system import (
    CommandResult, TestbedError, is_alive, kill_all, namespace_pids, power_off, namespaces, run, spawn, wait_for, with_sbin,
)
from clusterctl_testbed.versions import Release

DEBIAN_PACKAGES = (
    "munge", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "slurmrestd",
    "mariadb-server-core", "mariadb-client-core", "iproute2", "util-linux", "gcc", "libc6-dev",
)
REQUIRED_BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "slurmdbd", "sinfo", "mariadbd",
                     "mariadb-install-db", "ip", "nsenter", "unshare", "gcc", "ldconfig")
NVML_SOURCE = Path(__file__).parent / "nvml_emu" / "nvml_emu.c"
REPO = Path(clusterctl.__file__).resolve().parent.parent
"""The checkout: bound at the same path inside a root filesystem, where its venv imports from it."""
# Daemons start with a predictable environment: no job or Slurm variables leak in from the caller.
DAEMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _say(message: str) -> None:
    print(f"testbed: {message}", file=sys.stderr, flush=True)


def missing_binaries() -> list[str]:
    """Binaries the testbed needs that are not installed."""
    return [b for b in REQUIRED_BINARIES if shutil.which(b, path=DAEMON_PATH) is None]


def install_packages() -> None:
    """Install the Debian packages the testbed needs (no-op when all are present)."""
    if not missing_binaries():
        return
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs Debian packages and root to install them; run as root")
    _say(f"installing {' '.join(DEBIAN_PACKAGES)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], timeout=600, env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *DEBIAN_PACKAGES], timeout=1200, env=env)
    if missing := missing_binaries():
        raise TestbedError(f"still missing after install: {', '.join(missing)}")


@dataclass(frozen=True)
class Running:
    """Which Slurm a testbed runs (kept in `<root>/run/slurm.json` while it is up)."""

    release: str
    """The `--slurm` name: "host", "22.05", "24.05", "24.11", "26.05"."""
    rootfs: str | None
    """The root filesystem every host is chrooted into; None for this machine's own Slurm."""
    version: str = ""
    """What the running `sinfo --version` says, e.g. "slurm 24.11.5" (empty until slurmctld is up)."""
    topology: str = "tree"
    """Slurm's topology plugin on this testbed: "tree" or "block" (Layout.topology)."""
    timeouts: str = "fast"
    """Slurm's timeout profile on this testbed: "fast" or "production" (Layout.timeouts)."""


@dataclass(frozen=True)
class NodeState:
    """A compute node as `sinfo` reports it."""

    name: str
    state: str
    gres: str
    reason: str
    responding: bool = True
    """False while slurmctld flags the node not responding (`idle*` in sinfo's compact state)."""


def _describe(node: NodeState) -> str:
    """A node's state as sinfo shows it, with the reason when there is one ("drained, reason: ...")."""
    state = node.state + ("" if node.responding else " (not responding)")
    return f"{state}, reason: {node.reason}" if node.reason and node.reason != "none" else state


class Testbed:
    """Handle on the testbed described by a `Layout` (all state lives in its files)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, layout: Layout | None = None, hooks: slurm_config.Hooks | None = None) -> None:
        self.layout = layout or Layout()
        self._hooks = hooks

    # ---- which Slurm ------------------------------------------------------------
    @property
    def _running_file(self) -> Path:
        return self.layout.run_dir / "slurm.json"

    def running(self) -> Running:
        """Which Slurm this testbed runs (or last ran; the default when it never ran)."""
        try:
            return Running(**json.loads(self._running_file.read_text()))
        except (OSError, ValueError, TypeError):
            return Running(versions.HOST, None)

    def _set_running(self, running: Running) -> None:
        self.layout.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._running_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(running.__dict__, indent=1))
        os.replace(tmp, self._running_file)

    @property
    def bindir(self) -> Path:
        """Where the project's commands (clusterctl, healthd, the hooks) are, as seen on the hosts."""
        if self.running().rootfs is not None:
            return rootfs.VENV / "bin"
        return Path(sys.executable).parent

    @property
    def python(self) -> Path:
        """The Python that runs the project's code on the hosts."""
        return self.bindir / "python"

    @property
    def user_python(self) -> Path | None:
        """This checkout's Python (its virtualenv, with PyTorch where installed) as a training program
        on the hosts runs it, as a user's environment on shared storage would be; None on a root
        filesystem when that Python lives under /usr (this machine's own, which cannot be lent to
        another Debian release without replacing the root filesystem's own /usr)."""
        if self.running().rootfs is not None and lendable_python_prefix() is None:
            return None
        return Path(sys.executable)

    @property
    def hooks(self) -> slurm_config.Hooks:
        """The hook commands wired into slurm.conf (the project's installed ones unless given)."""
        if self._hooks is not None:
            return self._hooks
        if self.running().rootfs is not None:
            b = self.bindir
            return slurm_config.Hooks(b / "clusterctl-prolog", b / "clusterctl-epilog", b / "clusterctl-healthcheck")
        return default_hooks()

    def host_env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """`env` (default: this process's) as a command on a host should get it: inside a root
        filesystem, PATH leads to its venv and system directories, not to this machine's."""
        env = with_sbin(dict(os.environ if env is None else env))
        if self.running().rootfs is None:
            return env
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONHOME", None)
        return {**env, "PATH": f"{self.bindir}:{DAEMON_PATH}"}

    # ---- process bookkeeping ------------------------------------------------
    def _pids(self) -> dict[str, int]:
        try:
            return json.loads(self.layout.pid_file.read_text())
        except (OSError, ValueError):
            return {}

    def _record(self, name: str, pid: int) -> None:
        pids = self._pids()
        pids[name] = pid
        tmp = self.layout.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(pids, indent=1, sort_keys=True))
        os.replace(tmp, self.layout.pid_file)

    def holder(self, host: str) -> int:
        """PID of the process owning `host`'s namespaces; error if the host is not up."""
        pid = self._pids().get(f"holder:{host}")
        if pid is None or not is_alive(pid):
            raise TestbedError(f"host {host} is not running; `clusterctl-testbed up` (or `boot {host}`) first")
        return pid

    def enter(self, host: str, *, cwd: str = "/", machine_root: bool = False) -> list[str]:
        """The argv prefix that runs a command inside `host` (with `machine_root`, from this
        machine's root filesystem even when the host runs from a root filesystem of its own)."""
        # nsenter, not `ip netns exec`: the latter remounts /sys and hides the cgroup mounts.
        # Entering a mount namespace resets the cwd to /, hence --wd.
        # --root (no argument): the holder's root, i.e. the host's root filesystem when it has one.
        # Inside a root filesystem, --wd=DIR would open DIR on this machine before entering, outside
        # the host's root (sbatch and srun then fail: "getcwd failed"): a bare --wd takes the holder's
        # cwd, its root, and `env -C` changes to DIR once inside (the checkout and /tmp are bound there).
        if self.running().rootfs is not None and not machine_root:
            chdir = [] if cwd == "/" else ["env", "-C", cwd]
            return ["nsenter", "-t", str(self.holder(host)), "--net", "--uts", "--mount", "--root", "--wd", "--",
                    *chdir]
        return ["nsenter", "-t", str(self.holder(host)), "--net", "--uts", "--mount", f"--wd={cwd}", "--"]

    def run_on(self, host: str, argv: Sequence[str], *, timeout: float = 60, check: bool = True,
               env: dict[str, str] | None = None, cwd: str = "/") -> CommandResult:
        """Run a command inside `host` and wait for it."""
        return run([*self.enter(host, cwd=cwd), *argv], timeout=timeout, check=check, env=self.host_env(env))

    def _start(self, name: str, host: str, argv: Sequence[str], env: dict[str, str] | None = None,
               *, machine_root: bool = False) -> int:
        path = DAEMON_PATH if self.running().rootfs is None or machine_root else f"{self.bindir}:{DAEMON_PATH}"
        base = {"PATH": path, "HOME": "/root", "LANG": "C.UTF-8"}
        pid = spawn([*self.enter(host, machine_root=machine_root), *argv],
                    self.layout.log_dir / f"{name.replace(':', '-')}.out",
                    env={**base, **(env or {})})
        self._record(name, pid)
        return pid

    # ---- lifecycle ------------------------------------------------------------
    def is_up(self) -> bool:
        """True when every daemon the testbed started is alive."""
        pids = self._pids()
        expected = {f"holder:{h}" for h in self.layout.hosts} | {"munged", "mariadbd", "slurmdbd", "slurmctld"}
        expected |= {f"slurmd:{n}" for n in self.layout.nodes}
        if self.layout.healthd:
            expected |= {f"healthd:{n}" for n in self.layout.nodes}
        return expected <= pids.keys() and all(is_alive(pids[name]) for name in expected)

    def up(self, *, timeout: float = 60, slurm: str | None = None, slurm_source: str | None = None) -> None:
        """Start the cluster from scratch and wait until every node is idle; no-op if it is up.

        `slurm` picks the release (clusterctl_testbed.versions.RELEASES; default: the newest,
        versions.DEFAULT); a testbed already up with another release is an error, not silently reused.
        `slurm_source` names SchedMD's source for a release built from it (a git directory, a tarball
        or a URL; clusterctl_testbed.slurm_source), needed only the first time it is built.
        """
        try:
            release = versions.release(slurm or versions.DEFAULT)
        except ValueError as exc:
            raise TestbedError(str(exc)) from None
        if slurm_source and not release.built_from_source:
            _say(f"Slurm {release.name} comes from Debian's packages; --slurm-source is used only by releases "
                 f"built from source ({', '.join(r.name for r in versions.RELEASES.values() if r.built_from_source)})")
        if self.is_up():
            running = self.running()
            if (running.release, running.topology, running.timeouts) != (
                    release.name, self.layout.topology, self.layout.timeouts):
                raise TestbedError(f"the testbed at {self.layout.root} runs Slurm {running.release} with the "
                                   f"{running.topology} topology and {running.timeouts} timeouts, not "
                                   f"{release.name} with {self.layout.topology} and {self.layout.timeouts}; "
                                   "`clusterctl-testbed down` first")
            _say("already up")
            return
        if os.geteuid() != 0:
            raise TestbedError("the testbed creates namespaces and runs Slurm daemons: run it as root")
        try:
            slurm_config.check_topology(self.layout, release.version)
            slurm_config.timeouts(self.layout.timeouts)
        except ValueError as exc:
            raise TestbedError(str(exc)) from None
        ensure_private_root(self.layout.root)  # before anything is written into it, or removed from it
        install_packages()
        root = rootfs.ensure(release, REPO, slurm_source_given=slurm_source) if release.uses_rootfs else None
        self.down(quiet=True)
        started = time.monotonic()
        self._set_running(Running(release.name, None if root is None else str(root), topology=self.layout.topology,
                                  timeouts=self.layout.timeouts))
        self._write_files(release)
        self._build_nvml()
        self._network()
        self._start_holder(CONTROLLER)
        self._build_ld_cache()
        for node in self.layout.nodes:
            self._start_holder(node)
        self._start_munge()
        self._start_database()
        self._start_controller()
        version = self.run_on(CONTROLLER, ["sinfo", "--version"], timeout=15).stdout.strip()
        self._set_running(Running(release.name, None if root is None else str(root), version, self.layout.topology,
                                  self.layout.timeouts))
        for node in self.layout.nodes:
            self._start_slurmd(node)
            self.start_healthd(node)
        self.wait_nodes_idle(timeout=timeout)
        _say(f"up in {time.monotonic() - started:.1f} s ({version}): {', '.join(self.layout.nodes)} idle")

    def down(self, *, quiet: bool = False) -> None:
        """Stop everything the testbed started and remove its namespaces and runtime state.

        Logs of the last run stay in `<root>/log` until the next `up`.
        """
        mine = [ns for ns in namespaces() if ns.startswith(self.layout.namespace_prefix)]
        pids = sorted({p for ns in mine for p in namespace_pids(ns)} | {
            p for p in self._pids().values() if is_alive(p)})
        kill_all(pids)
        # A daemon may fork after the list was taken (slurmd its prolog or epilog, as it is told to
        # stop): such a child would outlive the testbed and write its record into the next one, where
        # job ids start at 1 again.  Killed until the namespaces hold nothing.
        power_off(lambda: [p for ns in mine for p in namespace_pids(ns)])
        for ns in mine:
            run(["ip", "netns", "del", ns], check=False, timeout=10)
        # Everything but the last run's logs: job ids restart at 1, so any record left behind
        # (spool, job-health records, healthd journals) would be mistaken for the new run's.
        # Never through a root someone else planted (a symlink to /etc would empty /etc).
        if os.path.lexists(self.layout.root):
            ensure_private_root(self.layout.root)
        if self.layout.root.is_dir():
            for child in self.layout.root.iterdir():
                if child.name != "log":
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
        if not quiet:
            _say(f"down: stopped {len(pids)} processes, removed {len(mine)} namespaces")

    # ---- bring-up steps ------------------------------------------------------
    def _write_files(self, release: Release) -> None:
        layout = self.layout
        shutil.rmtree(layout.log_dir, ignore_errors=True)
        for path in (layout.etc, layout.run_dir, layout.log_dir, layout.spool_dir / "ctld", layout.lib_dir,
                     layout.dev_dir, layout.munge_dir, layout.mysql_dir):
            path.mkdir(parents=True, exist_ok=True)
        metrics = slurm_config.job_metrics_dir(layout)
        metrics.mkdir(exist_ok=True)
        metrics.chmod(0o1777)  # as an admin makes it: every job's user writes its file there (docs/admins-guide.md)
        for node in layout.nodes:
            (layout.spool_dir / node).mkdir(parents=True, exist_ok=True)
            for sub in ("run-healthd", "etc-clusterctl", "lib-healthd"):
                (layout.host_dir(node) / sub).mkdir(parents=True, exist_ok=True)
            (layout.host_dir(node) / "etc-clusterctl" / "healthd.toml").write_text(
                slurm_config.healthd_toml(layout, node))
            node_dir = layout.nvml_dir / node
            node_dir.mkdir(parents=True, exist_ok=True)
            (node_dir / "events").touch()
            (node_dir / "kmsg").touch()
            build_tree(node_dir / "sysroot", layout.gpus_per_node, layout.nic_link_layer)  # ib_root: a NIC per GPU
            write_dcgmi(node_dir)  # the node's dcgmi, run by healthd's [diagnostics] (dcgmi_emu.py)
        files = {
            layout.etc / "slurm.conf": slurm_config.slurm_conf(layout, self.hooks, release.version),
            layout.etc / "topology.conf": slurm_config.topology_conf(layout),
            layout.etc / "gres.conf": slurm_config.gres_conf(layout),
            layout.etc / "cgroup.conf": slurm_config.cgroup_conf(release.version),
            layout.etc / "slurmdbd.conf": slurm_config.slurmdbd_conf(layout),
            layout.hosts_file: slurm_config.hosts_file(layout),
            layout.root / "etc" / "ld.so.conf": slurm_config.ld_so_conf(layout),
        }
        for path, text in files.items():
            path.write_text(text)
        (layout.etc / "slurmdbd.conf").chmod(0o600)  # slurmdbd refuses a config others can read
        for i in range(layout.gpus_per_node):
            # gres.conf File= must name character devices; /dev/null is one.
            (layout.dev_dir / f"nvidia{i}").symlink_to("/dev/null")
        # The munge key must be private to its owner or munged refuses to start.
        os.chmod(layout.munge_dir, 0o700)
        run(["mungekey", "--create", f"--keyfile={layout.munge_dir / 'munge.key'}", "--force"], timeout=30)

    def _build_nvml(self) -> None:
        build_nvml(self.layout.lib_dir / "libnvidia-ml.so.1")

    def _build_ld_cache(self) -> None:
        # A per-host ld.so.cache that knows the emulated driver: compute nodes find
        # libnvidia-ml.so.1 like a real driver install, with no LD_LIBRARY_PATH.  Built on the
        # controller: inside a root filesystem it must list that system's libraries, not this one's.
        self.run_on(CONTROLLER, ["ldconfig", "-X", "-C", str(self.layout.ld_cache),
                                 "-f", str(self.layout.root / "etc" / "ld.so.conf")], timeout=60)

    def _network(self) -> None:
        layout = self.layout
        ctl = layout.namespace(CONTROLLER)
        run(["ip", "netns", "add", ctl])
        run(["ip", "-n", ctl, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", ctl, "addr", "add", f"{layout.address(CONTROLLER)}/24", "dev", "br0"])
        run(["ip", "-n", ctl, "link", "set", "br0", "up"])
        for node in layout.nodes:
            ns = layout.namespace(node)
            run(["ip", "netns", "add", ns])
            run(["ip", "link", "add", f"v-{node}", "netns", ctl, "type", "veth", "peer", "name", "eth0", "netns", ns])
            run(["ip", "-n", ctl, "link", "set", f"v-{node}", "master", "br0", "up"])
            run(["ip", "-n", ns, "addr", "add", f"{layout.address(node)}/24", "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def _start_holder(self, host: str) -> None:
        layout = self.layout
        root = self.running().rootfs
        binds = [f"{layout.hosts_file}:/etc/hosts", f"{layout.etc}:/etc/slurm"]
        if root is not None:
            binds.append(f"{REPO}:{REPO}")
            binds.append(f"{REPO}:{rootfs.SOURCE}")  # the venv in the root filesystem imports the project from here
            if (prefix := lendable_python_prefix()) is not None:
                binds.append(f"{prefix}:{prefix}")  # this checkout's venv (`user_python`) runs on it
        if host != CONTROLLER:
            binds.append(f"{layout.ld_cache}:/etc/ld.so.cache")
            # Each node's own /run/healthd and /etc/clusterctl, where a real install keeps them;
            # the mount points are created empty on this machine if missing.
            for sub, target in (("run-healthd", "/run/healthd"), ("etc-clusterctl", "/etc/clusterctl")):
                if root is None:
                    Path(target).mkdir(parents=True, exist_ok=True)
                binds.append(f"{layout.host_dir(host) / sub}:{target}")
        argv = ["nsenter", f"--net=/run/netns/{layout.namespace(host)}", "--",
                "unshare", "--uts", "--mount", "--propagation", "private", "--",
                sys.executable, "-m", "clusterctl_testbed.holder", "--hostname", host]
        if root is not None:
            argv += ["--root", root]
        for bind in binds:
            argv += ["--bind", bind]
        log = open(layout.log_dir / f"holder-{host}.out", "ab")
        env = {"PATH": DAEMON_PATH, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                start_new_session=True, env=env)
        log.close()
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        line = proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            raise TestbedError(f"host {host} did not come up; see {layout.log_dir}/holder-{host}.out")
        self._record(f"holder:{host}", proc.pid)

    def _start_munge(self) -> None:
        m = self.layout.munge_dir
        self._start("munged", CONTROLLER, [
            "munged", "-F", "--force", f"--socket={self.layout.munge_socket}", f"--key-file={m / 'munge.key'}",
            f"--log-file={self.layout.log_dir / 'munged.log'}", f"--pid-file={m / 'munged.pid'}",
            f"--seed-file={m / 'munged.seed'}",
        ])
        wait_for(self.layout.munge_socket.exists, timeout=10, what="munged's socket")

    def _start_database(self) -> None:
        layout = self.layout
        # The database server is this machine's MariaDB (bookworm's 10.11) whatever Slurm runs:
        # slurmdbd 26.05 with sid's MariaDB 11.8 server dies at start ("Number of columns in result
        # set exceeds maximum allowed number of columns" from `select @var := concat('')`, measured),
        # with 10.11 it starts.  slurmdbd itself and its client library stay the release's own.
        run([*self.enter(CONTROLLER, machine_root=True),
             "mariadb-install-db", "--no-defaults", f"--datadir={layout.mysql_dir}",
             "--user=root", "--skip-test-db", "--auth-root-authentication-method=socket"],
            timeout=120, env=with_sbin(dict(os.environ)))
        self._start("mariadbd", CONTROLLER, [
            "mariadbd", "--no-defaults", f"--datadir={layout.mysql_dir}", f"--socket={layout.mysql_socket}",
            "--user=root", "--skip-networking", f"--log-error={layout.log_dir / 'mariadb.log'}",
            f"--pid-file={layout.run_dir / 'mariadbd.pid'}", "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M", "--skip-log-bin",
        ], machine_root=True)
        wait_for(layout.mysql_socket.exists, timeout=30, what="MariaDB's socket")
        # MYSQL_UNIX_PORT: libmariadb's default socket, so StorageHost=localhost reaches our server.
        self._start("slurmdbd", CONTROLLER, ["slurmdbd", "-D"], env={"MYSQL_UNIX_PORT": str(layout.mysql_socket)})
        wait_for(lambda: "started" in _read(layout.log_dir / "slurmdbd.log"), timeout=30,
                 what=f"slurmdbd (see {layout.log_dir}/slurmdbd.log)")

    def _start_controller(self) -> None:
        self._start("slurmctld", CONTROLLER, ["slurmctld", "-D"])
        wait_for(lambda: "is UP" in self.run_on(CONTROLLER, ["scontrol", "ping"], check=False, timeout=10).stdout,
                 timeout=30, what=f"slurmctld (see {self.layout.log_dir}/slurmctld.log)", interval=0.1)

    def _start_slurmd(self, node: str) -> None:
        self._start(f"slurmd:{node}", node, ["slurmd", "-D"])

    def start_healthd(self, node: str) -> None:
        """Start healthd on a node as its systemd unit would (no-op if the layout has none)."""
        if self.layout.healthd:
            healthd = self.bindir / "healthd"
            pid = self._start(f"healthd:{node}", node,
                              [str(healthd), "run", "--config", "/etc/clusterctl/healthd.toml"])
            # Like systemd's Type=notify: started means ready (its first state file is written).
            state = self.layout.host_dir(node) / "run-healthd" / "state.json"
            wait_for(lambda: f'"pid": {pid},' in _read(state) or not is_alive(pid), timeout=30,
                     what=f"healthd on {node} (see {self.layout.log_dir}/healthd-{node}.out)")
            if not is_alive(pid):
                raise TestbedError(f"healthd on {node} exited; see {self.layout.log_dir}/healthd-{node}.out")

    def stop_daemon(self, name: str) -> None:
        """Stop one daemon the testbed started (e.g. "slurmctld", "healthd:node3") by PID."""
        pid = self._pids().get(name)
        if pid is None:
            raise TestbedError(f"no daemon {name!r}; known: {', '.join(sorted(self._pids()))}")
        kill_all([pid])

    def start_controller(self) -> None:
        """Start slurmctld again after `stop_daemon("slurmctld")` (its state is kept)."""
        self._start_controller()
    # ---- looking --------------------------------------------------------------
    def nodes(self) -> list[NodeState]:
        """Every compute node's state, GRES and reason, from `sinfo` on the controller."""
        # %E (the reason) last: it is free text and may hold the separator.
        out = self.run_on(CONTROLLER, ["sinfo", "-h", "-N", "-o", "%N|%T|%G|%t|%E"], timeout=15).stdout
        states = []
        for line in out.splitlines():
            name, state, gres, compact, reason = line.split("|", 4)
            states.append(NodeState(name, state, gres, reason, not compact.endswith("*")))
        return states

    def wait_nodes(self, predicate: Callable[[NodeState], bool], *, nodes: Sequence[str] | None = None,
                   timeout: float, what: str) -> None:
        """Wait until `predicate` holds for every listed node (default: all)."""
        wanted = set(nodes or self.layout.nodes)
        last: dict[str, NodeState] = {}

        def ok() -> bool:
            try:
                current = {n.name: n for n in self.nodes() if n.name in wanted}
            except TestbedError:
                return False
            last.clear()
            last.update(current)
            return current.keys() == wanted and all(predicate(n) for n in current.values())

        try:
            wait_for(ok, timeout=timeout, what=what, interval=0.2)
        except TestbedError as error:
            # Say where each node was stuck: a timeout alone does not tell a drain from a slow boot.
            seen = "; ".join(f"{name}: {_describe(last[name]) if name in last else 'not listed'}"
                             for name in sorted(wanted))
            raise TestbedError(f"{error} (last seen: {seen})") from None

    def wait_nodes_idle(self, *, nodes: Sequence[str] | None = None, timeout: float = 60) -> None:
        # `sinfo -t idle` also lists inval, drained and idle* nodes: compare %T exactly.
        self.wait_nodes(lambda n: n.state == "idle" and n.responding, nodes=nodes, timeout=timeout,
                        what="nodes to be idle and responding")

    def status(self) -> dict[str, object]:
        """Which daemons are alive, and the nodes' states when the controller answers."""
        pids = self._pids()
        daemons = {name: {"pid": pid, "alive": is_alive(pid)} for name, pid in sorted(pids.items())}
        nodes: list[dict[str, str]] = []
        if pids and self.is_up():
            nodes = [n.__dict__ for n in self.nodes()]
        return {"root": str(self.layout.root), "up": self.is_up(), "slurm": self.running().__dict__,
                "bindir": str(self.bindir), "daemons": daemons, "nodes": nodes}

    def back_in_service(self, *, faulted: bool, timeout: float = 90) -> None:
        """Wait until every compute node is idle and responding, resuming drained or down ones on the way.

        `faulted`: a fault was cleared just now. healthd acts asynchronously: a drain may land after the
        caller's job ended, and until healthd has seen a healed GPU (or a resume) its state still holds the
        fault, so the next job's prolog would refuse the node. Then the nodes must stay in service for two
        healthd cycles (it re-reads a node it drained only every drained_refresh_interval, the testbed's
        check interval, then judges what it read) before this returns.
        """
        settle = faulted
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.nodes()
            if all(n.state == "idle" and n.responding for n in nodes):
                if not settle:
                    return
                settle = False
                time.sleep(2 * self.layout.healthd_interval + 1)
                continue  # look again: healthd may have drained anew from what it still saw
            if time.monotonic() > deadline:
                raise TestbedError(f"nodes not back in service within {timeout:.0f} s: {nodes}")
            for node in nodes:
                if node.state.startswith("drain") or node.state.startswith("down"):
                    self.run_on(CONTROLLER, ["scontrol", "update", f"NodeName={node.name}", "State=RESUME"],
                                check=False)
                    settle = True
            time.sleep(0.5)

    # ---- faults ---------------------------------------------------------------
    def _check_node(self, node: str) -> None:
        if node not in self.layout.nodes:
            raise TestbedError(f"no compute node {node!r}; the testbed has {', '.join(self.layout.nodes)}")

    def kill_node(self, node: str) -> None:
        """Power a node off: kill every process in its namespaces (slurmd, jobs, daemons, holder) and take
        its link down.  The network namespace itself survives (boot_node reuses it), and without its link
        down its kernel would still answer on the node's address (a refused connection, as from a machine
        that is up), which no powered-off machine does."""
        self._check_node(node)
        power_off(lambda: namespace_pids(self.layout.namespace(node)))
        self.cut_link(node)

    def boot_node(self, node: str) -> None:
        """Power a killed node back on: new holder, new slurmd (its network namespace survived)."""
        self._check_node(node)
        pids = self._pids()
        if is_alive(pids.get(f"holder:{node}", 0)):
            raise TestbedError(f"{node} is running; `kill-node {node}` first")
        self.heal_link(node)
        self._start_holder(node)
        self._start_slurmd(node)
        self.start_healthd(node)

    def cut_link(self, node: str) -> None:
        """Unplug the node's network cable (its processes keep running)."""
        self._check_node(node)
        run(["ip", "-n", self.layout.namespace(CONTROLLER), "link", "set", f"v-{node}", "down"])

    def heal_link(self, node: str) -> None:
        """Plug the node's cable back in."""
        self._check_node(node)
        run(["ip", "-n", self.layout.namespace(CONTROLLER), "link", "set", f"v-{node}", "up"])

    def restart_slurmd(self, node: str) -> None:
        """Restart only slurmd on a node; its running jobs keep their processes."""
        self._check_node(node)
        pid = self._pids().get(f"slurmd:{node}")
        if pid:
            kill_all([pid])
        self._start_slurmd(node)

    def nvml_dir(self, node: str) -> Path:
        """The directory holding the node's emulated GPU state."""
        self._check_node(node)
        return self.layout.nvml_dir / node


def build_nvml(target: Path, *, header_dir: Path | None = None) -> None:
    """Compile the emulated libnvidia-ml.so.1 (against NVIDIA's nvml.h when `header_dir` is given)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    argv = ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-fvisibility=hidden",
            "-Wl,-soname,libnvidia-ml.so.1", "-o", str(target), str(NVML_SOURCE), "-lpthread"]
    if header_dir is not None:
        argv[1:1] = ["-DNVML_EMU_REAL_HEADER", f"-I{header_dir}"]
    run(argv, timeout=120)


def lendable_python_prefix(base_prefix: str | None = None) -> Path | None:
    """The installation a Python runs from (`base_prefix`, default this one's `sys.base_prefix`) when it
    can be bound into a root filesystem at the same path (self-contained, as pyenv's; not under /usr)."""
    prefix = Path(sys.base_prefix if base_prefix is None else base_prefix).resolve()
    if prefix == Path("/") or prefix.is_relative_to("/usr") or not (prefix / "lib").is_dir():
        return None
    return prefix


def default_hooks() -> slurm_config.Hooks:
    """The project's installed hook commands (absolute paths: Slurm gives hooks no PATH)."""
    bindir = Path(sys.executable).parent

    def find(name: str) -> Path:
        path = bindir / name
        if not path.exists():
            found = shutil.which(name)
            if found is None:
                raise TestbedError(f"{name} is not installed; `pip install -e .` in the checkout first")
            path = Path(found)
        return path.absolute()

    return slurm_config.Hooks(find("clusterctl-prolog"), find("clusterctl-epilog"), find("clusterctl-healthcheck"))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
