"""The same Slurm cluster as the namespace testbed, as docker-compose services.

Hosts are containers of one image (compose/Dockerfile): `ctl` (the controller and login node:
munged, slurmdbd, slurmctld; clusterctl runs there), `db` (MariaDB) and one container per compute
node (slurmd, healthd, the project's prolog/epilog/HealthCheckProgram, 8 emulated GPUs through the
same emulated libnvidia-ml).  Every configuration file is rendered by clusterctl_testbed.slurm_config
from the same `Layout` as the namespace testbed, so the two cannot drift; `ComposeTestbed` is a
`Testbed` whose hosts are containers, so everything that drives a testbed (the fault commands, the
end-to-end tests) drives either.

The hosts share what a cluster shares, bind-mounted at the same paths in every container and on this
machine, and nothing else of it: the testbed's root (`/tmp/ctd/<name>`: configuration, munge's and
MariaDB's sockets, spool, logs, the epilog's job records), its shared directory beside it
(`/tmp/ctd/<name>-shared`, the cluster's home and scratch filesystem: run directories go there, and the
compose end-to-end tests' pytest temporary directories), both made by root and writable by nobody else
(clusterctl_testbed.private_root), and the checkout, read-only.  The containers run as root with
SYS_ADMIN: they never see the machine's /tmp, where other users' files are.  `db` gets the root alone.
Daemons are started into the running containers one by one (`docker exec`) and kept by their PID on
this machine, so `stop_daemon`, `restart_slurmd` and the tests' liveness checks work unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterctl_testbed import docker_engine, rootfs, slurm_config, versions
from clusterctl_testbed.cluster import NVML_SOURCE, REPO, DAEMON_PATH, Running, Testbed, build_nvml
from clusterctl_testbed.docker_engine import Engine
from clusterctl_testbed.layout import CONTROLLER, Layout
from clusterctl_testbed.private_root import ensure_private_root
from clusterctl_testbed.system import TestbedError, is_alive, kill_all, run, wait_for
from clusterctl_testbed.versions import Release

PROJECT = "ctd"
"""The compose project (container names `ctd-<host>`, network `ctd-net`)."""
DATABASE = "db"
"""The database host (MariaDB), beside the controller and the compute nodes."""
DATABASE_RELEASE = "22.05"
"""The database server is bookworm's MariaDB (10.11) whatever Slurm runs: slurmdbd 26.05 dies at
start against sid's MariaDB 11.8 (measured on the namespace testbed)."""
DOCKERFILE = REPO / "compose" / "Dockerfile"
NVML_IN_IMAGE = Path("/usr/local/nvidia/lib/libnvidia-ml.so.1")
"""In every image, outside the loader's paths: only compute nodes add its directory (the login node has
no driver, so pynvml there finds no library, as on the namespace testbed)."""
NVML_STATE_IN_IMAGE = Path("/usr/local/nvidia/nvml")
"""The emulated driver finds a node's GPU state in <its dir>/../nvml/<hostname>."""
NVML_LD_CONF = Path("/etc/ld.so.conf.d/nvidia.conf")
DEFAULT_RELEASE = "26.05"
CHECKOUT = Path(os.environ.get("CLUSTERCTL_TESTBED_CHECKOUT", str(REPO)))
"""What the containers see at the checkout's path (default: the checkout itself).  Pointing it at an
exported commit (`git archive HEAD | tar -x -C DIR`) runs the cluster on that commit's code while
the working tree changes under it."""


def compose_layout(name: str = PROJECT) -> Layout:
    """The compose testbed's layout: the namespace testbed's cluster under /tmp/ctd/<name>."""
    # namespace_prefix: the compose testbed makes no namespace per host; the prefix only has to match
    # none of the machine's namespaces (the namespace testbed's `down` removes those it matches).
    return Layout(root=Path(f"/tmp/ctd/{name}"), subnet="10.78.0", namespace_prefix=f"{name}-hosts-")


def shared_dir(layout: Layout) -> Path:
    """The cluster's shared home and scratch filesystem, `<root>-shared` beside the testbed's root.

    Every container sees it at the same path as this machine, read-write; run directories belong
    there (a directory elsewhere in /tmp does not exist inside the containers).  Outside the root, so
    `up` and `down` (which empty the root) leave what runs wrote there, as a reboot leaves /home.
    """
    return layout.root.with_name(f"{layout.root.name}-shared")


# ---- the compose file (pure) ----------------------------------------------------------------

@dataclass(frozen=True)
class Images:
    """The image every host of a release runs, and the database's."""

    slurm: str
    database: str
    base: str = "debian:trixie-slim"
    """The Dockerfile's BASE for a user's machine (compose builds when the image is missing)."""
    database_base: str = "debian:bookworm-slim"
    """The database's BASE: bookworm's MariaDB 10.11 (see DATABASE_RELEASE)."""


def database_address(layout: Layout) -> str:
    """The database host's address (the controller is .2, compute nodes .11 on)."""
    return f"{layout.subnet}.3"


def compose_file(layout: Layout, images: Images, *, project: str = PROJECT, repo: Path = REPO,
                 shared: Path | None = None, checkout: Path | None = None) -> dict[str, object]:
    """The compose project of `layout`: one service per host, one internal network.

    Each host mounts only what it needs (see the module docstring): the testbed's root; on the Slurm
    hosts also `shared` (default `shared_dir(layout)`), the checkout read-only at `repo` and at the
    root filesystem's source path, and the Slurm configuration read-only; on compute nodes their own
    GPU state, /run/healthd and /etc/clusterctl.
    """
    network = f"{project}-net"
    checkout = checkout or repo
    shared = shared or shared_dir(layout)
    # The root holds every socket, spool, log and PID file the daemons write: read-write.
    root = [f"{layout.root}:{layout.root}"]
    slurm_host = [*root, f"{shared}:{shared}", f"{checkout}:{repo}:ro", f"{checkout}:{rootfs.SOURCE}:ro",
                  f"{layout.etc}:/etc/slurm:ro"]
    addresses = {host: layout.address(host) for host in layout.hosts} | {DATABASE: database_address(layout)}
    extra_hosts = [f"{host}:{address}" for host, address in addresses.items()]

    def service(host: str, image: str, volumes: list[str], base: str = images.base) -> dict[str, object]:
        return {
            "image": image,
            "build": {"context": str(repo), "dockerfile": "compose/Dockerfile",
                      "args": {"BASE": base, "REPO": str(repo)}},
            "container_name": f"{project}-{host}",
            "hostname": host,
            "init": True,
            # Not privileged: this machine's root lacks CAP_SYS_RESOURCE, and a privileged container
            # asks for every capability (runc: "unable to apply caps").
            "cap_add": ["SYS_ADMIN", "SYS_PTRACE", "SYS_NICE"],
            "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
            "networks": {network: {"ipv4_address": addresses[host]}},
            "extra_hosts": extra_hosts,
            "volumes": volumes,
        }

    # The database host runs MariaDB alone: its data, socket and log are under the root.
    services = {DATABASE: service(DATABASE, images.database, root, images.database_base),
                CONTROLLER: service(CONTROLLER, images.slurm, slurm_host)}
    for node in layout.nodes:
        services[node] = service(node, images.slurm, [
            *slurm_host,
            # The emulated driver only reads its state; the testbed's `inject` writes it from outside.
            f"{layout.nvml_dir / node}:{NVML_STATE_IN_IMAGE / node}:ro",
            f"{layout.host_dir(node) / 'run-healthd'}:/run/healthd",
            f"{layout.host_dir(node) / 'etc-clusterctl'}:/etc/clusterctl:ro",
            f"{nvidia_ld_conf(layout)}:{NVML_LD_CONF}:ro",
        ])
    return {
        "name": project,
        "services": services,
        "networks": {network: {"name": network, "driver": "bridge", "internal": True,
                               "ipam": {"config": [{"subnet": f"{layout.subnet}.0/24"}]}}},
    }


def nvidia_ld_conf(layout: Layout) -> Path:
    """The loader configuration compute nodes get: the emulated driver's directory."""
    return layout.root / "etc" / "nvidia-ld.conf"


def to_yaml(value: object, indent: int = 0) -> str:
    """A small YAML writer for the compose file (mappings, lists, strings, numbers, booleans)."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:\n{to_yaml(item, indent + 1)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, dict) and item:
                body = to_yaml(item, indent + 1).lstrip()
                lines.append(f"{pad}- {body}")
            else:
                lines.append(f"{pad}- {_scalar(item)}")
        return "\n".join(lines)
    return pad + _scalar(value)


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(str(value))  # a JSON string is a YAML string


def image_tag(release: Release, digest: str) -> str:
    """The image of a release built from a given recipe digest, e.g. `ctd-slurm:24.11-1a2b3c4d`."""
    return f"{PROJECT}-slurm:{release.name}-{digest}"


# ---- the testbed -----------------------------------------------------------------------------

class ComposeTestbed(Testbed):
    """A `Testbed` whose hosts are compose services on a Docker engine (see the module docstring)."""

    def __init__(self, layout: Layout | None = None, hooks: slurm_config.Hooks | None = None,
                 *, project: str = PROJECT) -> None:
        super().__init__(layout or compose_layout(project), hooks)
        # A layout from compose_layout(name) names its project; any other gets `project`.
        self.project = self.layout.root.name if layout is not None and self.layout.root.parent == Path("/tmp/ctd") \
            else project

    # ---- the engine and the containers ----------------------------------------------------
    @property
    def _engine_file(self) -> Path:
        return self.layout.run_dir / "engine.json"

    def engine(self) -> Engine:
        """The Docker engine this testbed runs on (an error when none is running)."""
        try:
            return Engine(**json.loads(self._engine_file.read_text()))
        except (OSError, ValueError, TypeError):
            found = docker_engine.find()
            if found is None:
                raise TestbedError("the compose testbed is not up (no Docker engine); "
                                   "`clusterctl-testbed compose up` first") from None
            return found

    @property
    def compose_path(self) -> Path:
        """The rendered compose file of the running testbed."""
        return self.layout.root / "compose.yaml"

    def container(self, host: str) -> str:
        """The container that is `host`."""
        return f"{self.project}-{host}"

    @property
    def network(self) -> str:
        return f"{self.project}-net"

    def _exec_prefix(self, host: str, *, cwd: str, env: dict[str, str], detach: bool = False) -> list[str]:
        engine = self.engine()
        argv = [docker_engine.docker_client(), "-H", engine.host, "exec", "-d" if detach else "-i", "-w", cwd]
        for key, value in env.items():
            argv += ["-e", f"{key}={value}"]
        return [*argv, self.container(host)]

    def enter(self, host: str, *, cwd: str = "/", machine_root: bool = False) -> list[str]:
        """The argv prefix that runs a command inside `host`'s container: its namespaces (PID too, so
        PIDs a daemon wrote there mean the same) and root, this process's environment, and killed when
        the caller is (`docker exec` would leave it running)."""
        # --root/--wd without argument: the container's root and cwd; then env -C enters `cwd`, which
        # names the same directory in the container when it is in the checkout, the shared directory or
        # the testbed's root (bound at their paths); elsewhere in /tmp it does not exist there.
        chdir = [] if cwd == "/" else ["env", "-C", cwd]
        return ["nsenter", "-t", str(self.holder(host)), "--net", "--uts", "--ipc", "--mount", "--pid",
                "--root", "--wd", "--", "setpriv", "--pdeathsig", "KILL", "--", *chdir]

    def _start(self, name: str, host: str, argv: Sequence[str], env: dict[str, str] | None = None,
               **_: object) -> int:
        """Start a daemon inside `host`; its PID on this machine (kept like the namespace testbed's)."""
        pid_file = self._inner_pid_file(name)
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.unlink(missing_ok=True)
        log = self.layout.log_dir / f"{name.replace(':', '-')}.out"
        base = {"PATH": f"{self.bindir}:{DAEMON_PATH}", "HOME": "/root", "LANG": "C.UTF-8"}
        script = f'echo $$ > {pid_file}; exec "$@" >> {log} 2>&1'
        run([*self._exec_prefix(host, cwd="/", env={**base, **(env or {})}, detach=True),
             "sh", "-c", script, "sh", *argv], timeout=30, env=self.engine().env())
        wait_for(lambda: _read_int(pid_file) is not None, timeout=15, what=f"{name} to start in {host}")
        pid = self._host_pid(host, _read_int(pid_file) or 0)
        self._record(name, pid)
        return pid

    def _inner_pid_file(self, name: str) -> Path:
        # Written by the daemon's shell inside the container just before it execs the daemon.
        return self.layout.run_dir / "cpid" / name.replace(":", "-")

    def start_healthd(self, node: str) -> None:
        """Start healthd on a node as its systemd unit would (no-op if the layout has none)."""
        if not self.layout.healthd:
            return
        name = f"healthd:{node}"
        pid = self._start(name, node, [str(self.bindir / "healthd"), "run", "--config", "/etc/clusterctl/healthd.toml"])
        inner = _read_int(self._inner_pid_file(name))
        # Like systemd's Type=notify: started means ready (its first state file, with its own PID).
        state = self.layout.host_dir(node) / "run-healthd" / "state.json"
        wait_for(lambda: f'"pid": {inner},' in _read(state) or not is_alive(pid), timeout=30,
                 what=f"healthd on {node} (see {self.layout.log_dir}/healthd-{node}.out)")
        if not is_alive(pid):
            raise TestbedError(f"healthd on {node} exited; see {self.layout.log_dir}/healthd-{node}.out")

    def _host_pid(self, host: str, inner: int) -> int:
        """This machine's PID of the process `inner` inside `host`'s container."""
        init = self._pids().get(f"holder:{host}", 0)
        namespace = _pid_namespace(init)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or _pid_namespace(int(entry.name)) != namespace:
                continue
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("NSpid:") and line.split()[-1] == str(inner):
                    return int(entry.name)
        raise TestbedError(f"process {inner} of {host} not found on this machine")

    def _record_containers(self, hosts: Sequence[str]) -> None:
        # A container's init stands for the namespace testbed's holder: alive while the host is up.
        engine = self.engine()
        out = engine.docker("inspect", "-f", "{{.Name}} {{.State.Pid}}",
                            *(self.container(h) for h in hosts), timeout=30).stdout
        pids = dict(line.lstrip("/").split() for line in out.splitlines() if line.strip())
        for host in hosts:
            pid = int(pids.get(self.container(host), "0"))
            if pid <= 0:
                raise TestbedError(f"container {self.container(host)} is not running")
            self._record(f"holder:{host}", pid)

    # ---- lifecycle ----------------------------------------------------------------------------
    def up(self, *, timeout: float = 90, slurm: str | None = None, slurm_source: str | None = None) -> None:
        """Start the cluster as compose services and wait until every node is idle; no-op if up.
        (`slurm_source` is not used: the compose testbed runs the releases Debian packages.)"""
        name = slurm or DEFAULT_RELEASE
        release = versions.release(versions.RELEASES["22.05"].name if name == versions.HOST else name)
        if release.built_from_source:
            # Its images would come from Debian's packages of the suite, which hold another Slurm.
            raise TestbedError(f"Slurm {release.name} is built from source, which the compose testbed does not do "
                               f"yet; run it on the namespaces testbed (`clusterctl-testbed up --slurm {release.name}`)")
        if self.is_up():
            if self.running().release != release.name:
                raise TestbedError(f"the compose testbed runs Slurm {self.running().release}, not "
                                   f"{release.name}; `clusterctl-testbed compose down` first")
            print("testbed: already up", flush=True)
            return
        try:
            slurm_config.check_topology(self.layout, release.version)
            slurm_config.timeouts(self.layout.timeouts)
        except ValueError as exc:
            raise TestbedError(str(exc)) from None
        started = time.monotonic()
        # Before anything is written into them (the image's extra files go under the root).
        ensure_private_root(self.layout.root)
        ensure_private_root(shared_dir(self.layout))
        database_release = versions.release(DATABASE_RELEASE)
        engine = docker_engine.ensure()
        if engine.owned:
            # No registry here: the images start from the cached mmdebstrap root filesystems.
            root = str(rootfs.ensure(release, REPO))
            images = Images(self._image(engine, release, Path(root)),
                            self._image(engine, database_release, rootfs.ensure(database_release, REPO)),
                            base=f"debian:{release.suite}-slim")
        else:
            root = f"image from debian:{release.suite}-slim"
            images = Images(self._registry_image(engine, release), self._registry_image(engine, database_release),
                            base=f"debian:{release.suite}-slim")
        self.down(quiet=True, keep_engine=True)
        self.layout.run_dir.mkdir(parents=True, exist_ok=True)
        self._engine_file.write_text(json.dumps(engine.__dict__))
        self._set_running(Running(release.name, root, topology=self.layout.topology, timeouts=self.layout.timeouts))
        self._write_files(release)
        nvidia_ld_conf(self.layout).write_text(f"{NVML_IN_IMAGE.parent}\n")
        self.compose_path.write_text(to_yaml(compose_file(self.layout, images, project=self.project,
                                                                 checkout=CHECKOUT)) + "\n")
        engine.compose(self.compose_path, self.project, "up", "-d", "--no-build", "--quiet-pull", timeout=300)
        self._record_containers((DATABASE, *self.layout.hosts))
        for node in self.layout.nodes:
            self.run_on(node, ["ldconfig"], timeout=60)  # the driver's directory into the node's loader cache
        self._start_munge()
        self._start_database()
        self._start_controller()
        version = self.run_on(CONTROLLER, ["sinfo", "--version"], timeout=15).stdout.strip()
        self._set_running(Running(release.name, root, version, self.layout.topology, self.layout.timeouts))
        for node in self.layout.nodes:
            self._start_slurmd(node)
            self.start_healthd(node)
        self.wait_nodes_idle(timeout=timeout)
        print(f"testbed: compose up in {time.monotonic() - started:.1f} s ({version}): "
              f"{', '.join(self.layout.nodes)} idle", flush=True)

    def _image(self, engine: Engine, release: Release, root: Path) -> str:
        """The release's image, imported from its root filesystem and built from compose/Dockerfile
        when this engine does not have it yet."""
        stamps = "".join(_read(root.parent / stamp) for stamp in ("rootfs.stamp", "venv.stamp"))
        digest = hashlib.sha256((stamps + DOCKERFILE.read_text() + NVML_SOURCE.read_text()).encode()).hexdigest()[:12]
        tag = image_tag(release, digest)
        if engine.docker("image", "inspect", tag, check=False, timeout=30).returncode == 0:
            return tag
        started = time.monotonic()
        base = f"{PROJECT}-base:{release.suite}-{digest}"
        # The emulated driver goes into the base where a driver install would put it: the root
        # filesystem has no compiler, and compose/Dockerfile compiles it only where there is one.
        extra = self.layout.root / "image-extra"
        build_nvml(extra / NVML_IN_IMAGE.relative_to("/"))
        tar = subprocess.Popen(["tar", "-c", "-C", str(root), ".", "-C", str(extra),
                                f"./{NVML_IN_IMAGE.relative_to('/')}"], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imported = subprocess.run([docker_engine.docker_client(), "import", "-", base], stdin=tar.stdout,
                                  capture_output=True, text=True, timeout=600, env=engine.env())
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise TestbedError(f"importing {root} as {base} failed: {imported.stderr.strip()}")
        imported_in = time.monotonic() - started
        engine.docker("build", "-q", "-f", str(DOCKERFILE), "--build-arg", f"BASE={base}",
                      "--build-arg", f"REPO={REPO}", "-t", tag, str(REPO), timeout=900)
        print(f"testbed: image {tag}: imported in {imported_in:.1f} s, built in "
              f"{time.monotonic() - started - imported_in:.1f} s", flush=True)
        return tag

    def _registry_image(self, engine: Engine, release: Release) -> str:
        """The release's image built from `debian:<suite>-slim` (a user's machine, with a registry)."""
        digest = hashlib.sha256((DOCKERFILE.read_text() + NVML_SOURCE.read_text()).encode()).hexdigest()[:12]
        tag = image_tag(release, digest)
        if engine.docker("image", "inspect", tag, check=False, timeout=30).returncode != 0:
            print(f"testbed: building {tag} from debian:{release.suite}-slim (a few minutes, once)", flush=True)
            engine.docker("build", "-q", "-f", str(DOCKERFILE), "--build-arg", f"BASE=debian:{release.suite}-slim",
                          "--build-arg", f"REPO={REPO}", "-t", tag, str(REPO), timeout=1800)
        return tag

    def _write_files(self, release: Release) -> None:
        try:
            super()._write_files(release)
        except TestbedError:
            if shutil.which("mungekey") is not None:
                raise
            # No munge on this machine (a user's laptop): a munge key is random bytes.
            key = self.layout.munge_dir / "munge.key"
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)

    def _start_database(self) -> None:
        layout = self.layout
        self.run_on(DATABASE, ["mariadb-install-db", "--no-defaults", f"--datadir={layout.mysql_dir}",
                               "--user=root", "--skip-test-db", "--auth-root-authentication-method=socket"],
                    timeout=120)
        # slurmdbd reaches MariaDB through its socket on the shared filesystem, as on the namespace
        # testbed: slurmdbd.conf is the same file (StorageHost=localhost, MYSQL_UNIX_PORT).
        self._start("mariadbd", DATABASE, [
            "mariadbd", "--no-defaults", f"--datadir={layout.mysql_dir}", f"--socket={layout.mysql_socket}",
            "--user=root", "--skip-networking", f"--log-error={layout.log_dir / 'mariadb.log'}",
            f"--pid-file={layout.run_dir / 'mariadbd.pid'}", "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M", "--skip-log-bin",
        ])
        wait_for(layout.mysql_socket.exists, timeout=30, what="MariaDB's socket")
        self._start("slurmdbd", CONTROLLER, ["slurmdbd", "-D"], env={"MYSQL_UNIX_PORT": str(layout.mysql_socket)})
        wait_for(lambda: "started" in _read(layout.log_dir / "slurmdbd.log"), timeout=30,
                 what=f"slurmdbd (see {layout.log_dir}/slurmdbd.log)")

    def is_up(self) -> bool:
        """True when every container and every daemon the testbed started is alive."""
        pids = self._pids()
        return f"holder:{DATABASE}" in pids and is_alive(pids[f"holder:{DATABASE}"]) and super().is_up()

    def down(self, *, quiet: bool = False, keep_engine: bool = False) -> None:
        """Remove the compose project, stop the Docker engine if the testbed started it, and remove
        the runtime state (the last run's logs stay in `<root>/log`)."""
        engine = docker_engine.find()
        removed = 0
        if engine is not None:
            if self.compose_path.exists():
                engine.compose(self.compose_path, self.project, "down", "--timeout", "2", "--volumes",
                               timeout=180, check=False)
            leftover = engine.docker("ps", "-aq", "--filter", f"name=^{self.project}-", check=False).stdout.split()
            if leftover:
                engine.docker("rm", "-f", *leftover, check=False, timeout=120)
            removed = len(leftover)
            if engine.owned and not keep_engine:
                docker_engine.stop(engine)
        kill_all([p for p in self._pids().values() if is_alive(p)])
        super().down(quiet=True)
        if not quiet:
            stopped = "" if engine is None or not engine.owned or keep_engine else "; stopped dockerd"
            print(f"testbed: compose down{stopped}" + (f" (removed {removed} stray containers)" if removed else ""),
                  flush=True)

    # ---- faults --------------------------------------------------------------------------------
    def kill_node(self, node: str) -> None:
        """Power a node off: kill its container (slurmd, healthd, jobs: every process in it)."""
        self._check_node(node)
        self.engine().docker("kill", self.container(node), timeout=60)

    def boot_node(self, node: str) -> None:
        """Power a killed node back on: the container starts again, then slurmd and healthd."""
        self._check_node(node)
        if is_alive(self._pids().get(f"holder:{node}", 0)):
            raise TestbedError(f"{node} is running; `kill-node {node}` first")
        self.engine().docker("start", self.container(node), timeout=60)
        self._record_containers((node,))
        self.run_on(node, ["ldconfig"], timeout=60)
        self._start_slurmd(node)
        self.start_healthd(node)

    def _connected(self, node: str) -> bool:
        out = self.engine().docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", self.container(node)).stdout
        return self.network in json.loads(out or "{}")

    def cut_link(self, node: str) -> None:
        """Unplug the node's network cable (`docker network disconnect`; its processes keep running)."""
        self._check_node(node)
        self.engine().docker("network", "disconnect", "--force", self.network, self.container(node))

    def heal_link(self, node: str) -> None:
        """Plug the node's cable back in, with its address (a no-op when it is connected)."""
        self._check_node(node)
        if not is_alive(self._pids().get(f"holder:{node}", 0)) or self._connected(node):
            return
        self.engine().docker("network", "connect", "--ip", self.layout.address(node), self.network,
                             self.container(node))

    def status(self) -> dict[str, object]:
        """As `Testbed.status`, plus the Docker engine and the compose file."""
        info = super().status()
        engine = docker_engine.find()
        info["engine"] = None if engine is None else engine.__dict__
        info["compose_file"] = str(self.compose_path)
        info["shared"] = str(shared_dir(self.layout))
        return info


def _pid_namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
