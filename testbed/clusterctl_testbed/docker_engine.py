"""The Docker engine the compose testbed runs on: the user's own, or one this testbed starts.

On a user's machine (DOCKER_HOST set, or an engine answering on /var/run/docker.sock) that engine
is used and never stopped.  On a machine without one (this project's CI), `Engine.start` runs
Debian's dockerd by hand, as root, inside a network namespace of its own (`ctd-net`), with its own
data root, no default bridge and no iptables rules, so container traffic never touches the machine's
own namespace; `Engine.stop` stops it by PID and removes its data root.  Compose v2 is the
`docker-compose` plugin from Debian trixie's package, unpacked (`dpkg -x`) into the testbed's cache
when no `docker compose` is installed (bookworm has only the old Python docker-compose 1.29).
See shared/notes/docker.md for the measurements behind each choice.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterctl_testbed import rootfs
from clusterctl_testbed.system import CommandResult, TestbedError, is_alive, kill_all, run, wait_for, with_sbin

OWN_DIR = Path(os.environ.get("CLUSTERCTL_TESTBED_DOCKER_DIR", "/var/tmp/ctd"))
"""Where a testbed-started dockerd keeps its data root, exec root, socket and PID file.  Not under
/tmp, where any user may create a name first; and the data root holds overlay mounts."""
NETNS = "ctd-net"
"""The network namespace a testbed-started dockerd (and so every container network) lives in."""
SYSTEM_SOCKET = Path("/var/run/docker.sock")
COMPOSE_CACHE = rootfs.CACHE / "compose"
COMPOSE_PACKAGE_SUITE = "trixie"


def _say(message: str) -> None:
    print(f"testbed: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Engine:
    """How to reach a Docker engine, and whether this testbed started it (then it also stops it)."""

    host: str
    """The engine's address, as DOCKER_HOST takes it (unix:///...)."""
    owned: bool
    """True when the testbed started this engine (it stops it at `down`)."""

    def env(self) -> dict[str, str]:
        """The environment a docker client needs to reach this engine."""
        return {**with_sbin(dict(os.environ)), "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0"}

    def docker(self, *args: str, timeout: float = 120, check: bool = True, stdin: bytes | None = None) -> CommandResult:
        """Run `docker ARGS` against this engine."""
        argv = [docker_client(), *args]
        if stdin is None:
            return run(argv, timeout=timeout, check=check, env=self.env())
        proc = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, env=self.env())
        result = CommandResult(tuple(argv), proc.returncode, proc.stdout.decode(errors="replace"),
                               proc.stderr.decode(errors="replace"))
        if check and proc.returncode != 0:
            raise TestbedError(f"`{' '.join(argv)}` exited with {proc.returncode}: {result.stderr.strip()}")
        return result

    def compose(self, project_file: Path, project: str, *args: str, timeout: float = 300,
                check: bool = True) -> CommandResult:
        """Run `docker compose -f FILE -p PROJECT ARGS` against this engine."""
        return run([*compose_command(), "-f", str(project_file), "-p", project, *args], timeout=timeout,
                   check=check, env=self.env())


def docker_client() -> str:
    """The docker command-line client (Debian's docker.io ships /usr/bin/docker)."""
    found = shutil.which("docker", path=with_sbin(dict(os.environ))["PATH"])
    if found is None:
        raise TestbedError("no `docker` client: install Docker (on Debian: `apt-get install docker.io`)")
    return found


def _answers(host: str) -> bool:
    env = {**with_sbin(dict(os.environ)), "DOCKER_HOST": host}
    try:
        proc = subprocess.run([docker_client(), "version", "--format", "{{.Server.Version}}"], env=env,
                              capture_output=True, timeout=20)
    except (subprocess.TimeoutExpired, TestbedError):
        return False
    return proc.returncode == 0


def own_socket() -> str:
    """DOCKER_HOST of the engine this testbed starts itself."""
    return f"unix://{OWN_DIR / 'docker.sock'}"


def find() -> Engine | None:
    """An engine that is already running: the user's (DOCKER_HOST, the system socket) or ours."""
    if os.environ.get("DOCKER_HOST"):
        return Engine(os.environ["DOCKER_HOST"], owned=False)
    if SYSTEM_SOCKET.exists() and _answers(f"unix://{SYSTEM_SOCKET}"):
        return Engine(f"unix://{SYSTEM_SOCKET}", owned=False)
    pid = _own_pid()
    if pid is not None and is_alive(pid):
        return Engine(own_socket(), owned=True)
    return None


def _own_pid() -> int | None:
    try:
        return int((OWN_DIR / "dockerd.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def ensure() -> Engine:
    """The engine to use: a running one, else dockerd started here (installed with apt if missing)."""
    engine = find()
    if engine is not None:
        return engine
    return start()


def start() -> Engine:
    """Start Debian's dockerd in its own network namespace with its own data root; its Engine."""
    if os.geteuid() != 0:
        raise TestbedError("no Docker engine is running and starting one needs root; start Docker, or run as root")
    if shutil.which("dockerd", path=with_sbin(dict(os.environ))["PATH"]) is None:
        _say("installing docker.io")
        started = time.monotonic()
        env = {**with_sbin(dict(os.environ)), "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "docker.io"], timeout=900, env=env)
        _say(f"installed docker.io in {time.monotonic() - started:.0f} s")
    started = time.monotonic()
    OWN_DIR.mkdir(parents=True, exist_ok=True)
    if NETNS not in run(["ip", "netns", "list"], check=False, timeout=10).stdout.split():
        run(["ip", "netns", "add", NETNS])
        run(["ip", "-n", NETNS, "link", "set", "lo", "up"])
    socket = OWN_DIR / "docker.sock"
    socket.unlink(missing_ok=True)
    # nsenter, not `ip netns exec` (that remounts /sys and dockerd then finds no cgroup mounts);
    # unshare --mount: the overlay mounts of every container stay out of the machine's mount table.
    argv = ["unshare", "--mount", "--propagation", "slave", "--",
            "nsenter", f"--net=/run/netns/{NETNS}", "--",
            "dockerd", f"--data-root={OWN_DIR / 'data'}", f"--exec-root={OWN_DIR / 'exec'}",
            f"--pidfile={OWN_DIR / 'dockerd.pid'}", f"--host=unix://{socket}",
            "--iptables=false", "--ip6tables=false", "--bridge=none"]
    with open(OWN_DIR / "dockerd.log", "ab") as log:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                         env=with_sbin(dict(os.environ)))
    engine = Engine(own_socket(), owned=True)
    wait_for(lambda: socket.exists() and _answers(engine.host), timeout=60, interval=0.2,
             what=f"dockerd (see {OWN_DIR / 'dockerd.log'})")
    _say(f"dockerd up in {time.monotonic() - started:.1f} s (namespace {NETNS}, data root {OWN_DIR / 'data'})")
    return engine


def stop(engine: Engine) -> None:
    """Stop a dockerd this testbed started (by PID), its containerd, and remove its state; a no-op
    for the user's engine."""
    if not engine.owned:
        return
    pid = _own_pid()
    if pid is not None and is_alive(pid):
        kill_all([pid], grace=15)
    # containerd and the shims dockerd started live in the testbed's network namespace.
    leftovers = [int(p) for p in run(["ip", "netns", "pids", NETNS], check=False, timeout=10).stdout.split()
                 if p.isdigit()]
    kill_all(leftovers)
    run(["ip", "netns", "del", NETNS], check=False, timeout=10)
    shutil.rmtree(OWN_DIR, ignore_errors=True)


def compose_command() -> list[str]:
    """How to run Compose v2: `docker compose` when installed, else trixie's plugin from the cache."""
    probe = subprocess.run([docker_client(), "compose", "version"], capture_output=True, timeout=30,
                           env=with_sbin(dict(os.environ)))
    if probe.returncode == 0:
        return [docker_client(), "compose"]
    return [str(_cached_compose())]


def _cached_compose() -> Path:
    binary = COMPOSE_CACHE / "docker-compose"
    if binary.exists():
        return binary
    if os.geteuid() != 0:
        raise TestbedError("Compose v2 is not installed: install the docker-compose-plugin (or run as root)")
    _say(f"fetching Compose v2 from Debian {COMPOSE_PACKAGE_SUITE}'s docker-compose package")
    work = COMPOSE_CACHE / "apt"
    shutil.rmtree(work, ignore_errors=True)
    (work / "lists" / "partial").mkdir(parents=True)
    (work / "cache" / "archives" / "partial").mkdir(parents=True)
    try:
        mirror = rootfs.mirror_from_sources(rootfs.SOURCES.read_text())
    except OSError:
        mirror = "http://deb.debian.org/debian"
    (work / "sources.list").write_text(f"deb {mirror} {COMPOSE_PACKAGE_SUITE} main\n")
    options = _apt_options(work)
    run(["apt-get", *options, "update", "-qq"], timeout=300)
    download = subprocess.run(["apt-get", *options, "download", "docker-compose"], cwd=work,
                              capture_output=True, text=True, timeout=300, env=with_sbin(dict(os.environ)))
    debs = sorted(work.glob("docker-compose_*.deb"))
    if download.returncode != 0 or not debs:
        raise TestbedError(f"could not download trixie's docker-compose: {download.stderr.strip()}")
    run(["dpkg", "-x", str(debs[-1]), str(work / "x")], timeout=120)
    shutil.copy2(work / "x" / "usr" / "libexec" / "docker" / "cli-plugins" / "docker-compose", binary)
    shutil.rmtree(work, ignore_errors=True)
    return binary


def _apt_options(work: Path) -> Sequence[str]:
    # apt reads a trixie index of its own: the machine's apt state is left alone.
    return ["-o", f"Dir::Etc::SourceList={work / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State::Lists={work / 'lists'}", "-o", f"Dir::Cache={work / 'cache'}",
            "-o", "Dir::State::status=/dev/null"]
