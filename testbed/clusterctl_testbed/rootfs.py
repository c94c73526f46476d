"""Debian root filesystems that carry one Slurm release each, built with mmdebstrap and cached.

A root filesystem holds every daemon and command of its Slurm (slurmctld, slurmd, slurmdbd,
MariaDB, munge, the clients) and a venv at `VENV` with the project installed editable, by the root
filesystem's own Python, from `SOURCE`: every testbed mounts its own checkout there, so testbeds of
one release started from different checkouts share the venv instead of reinstalling it under each
other.  It is rebuilt only when its recipe (suite, packages, mirror, RECIPE) changed; the venv
only when the project's pyproject.toml changed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from clusterctl_testbed.system import run, with_sbin
from clusterctl_testbed.versions import Release

CACHE = Path(os.environ.get("CLUSTERCTL_TESTBED_CACHE", "/var/cache/clusterctl-testbed"))
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
RECIPE = 1
"""Bump when the build steps below change in a way that needs every cached root filesystem rebuilt."""

PACKAGES = (
    "munge", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "mariadb-server-core", "mariadb-client-core",
    "python3", "python3-venv", "ca-certificates", "iproute2", "hostname", "procps",
)
VENV = Path("/opt/clusterctl")
"""Inside the root filesystem: the venv with the project installed (hooks and healthd run from it)."""
SOURCE = Path("/opt/clusterctl-src")
"""Inside the root filesystem: where each testbed's hosts see their own checkout (the venv's editable source)."""
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# pip inside the root filesystem reaches the registries like pip on this machine does.
PASSED_ENV = ("PIP_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


def _say(message: str) -> None:
    print(f"testbed: {message}", file=sys.stderr, flush=True)


def mirror_from_sources(text: str) -> str:
    """The Debian mirror (first `URIs:` of a stanza that is not the security archive)."""
    for stanza in text.split("\n\n"):
        for line in stanza.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "URIs" and "security" not in value:
                return value.split()[0]
    raise ValueError("no Debian mirror (`URIs:` line) in the apt sources")


@dataclass(frozen=True)
class Recipe:
    """Everything a root filesystem is built from: a change in any of it means rebuild."""

    suite: str
    mirror: str
    packages: tuple[str, ...] = PACKAGES
    stale_release_file: bool = False
    version: int = RECIPE

    def digest(self) -> str:
        """A stable fingerprint of the recipe, kept beside the built root filesystem."""
        return hashlib.sha256(json.dumps(self.__dict__, sort_keys=True).encode()).hexdigest()[:16]

    def mmdebstrap_argv(self, target: Path) -> list[str]:
        """The mmdebstrap command that builds this recipe into `target`."""
        argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(self.packages)}",
                '--aptopt=APT::Install-Recommends "false"']
        if self.stale_release_file:
            argv.append('--aptopt=Acquire::Check-Valid-Until "false"')
        return [*argv, self.suite, str(target), self.mirror]


def recipe_for(release: Release) -> Recipe:
    """The recipe of `release`'s root filesystem, from this machine's apt mirror."""
    if release.suite is None:
        raise ValueError(f"Slurm {release.name} runs from this machine's packages, not a root filesystem")
    try:
        mirror = mirror_from_sources(SOURCES.read_text())
    except OSError:
        mirror = "http://deb.debian.org/debian"
    return Recipe(release.suite, mirror, stale_release_file=release.stale_release_file)


def project_digest(repo: Path) -> str:
    """Fingerprint of what the venv's install depends on (the project's pyproject.toml)."""
    return hashlib.sha256((repo / "pyproject.toml").read_bytes()).hexdigest()[:16]


def _stamp(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def ensure(release: Release, repo: Path, *, cache: Path = CACHE) -> Path:
    """The root filesystem of `release` with the project's venv, building what is stale; its path."""
    recipe = recipe_for(release)
    directory = cache / recipe.suite
    directory.mkdir(parents=True, exist_ok=True)
    rootfs = directory / "rootfs"
    with open(directory / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two testbeds starting at once build once
        if _stamp(directory / "rootfs.stamp") != recipe.digest() or not rootfs.is_dir():
            _build(recipe, directory)
            (directory / "venv.stamp").unlink(missing_ok=True)
        venv_stamp = f"{recipe.digest()}-{project_digest(repo)}"
        if _stamp(directory / "venv.stamp") != venv_stamp:
            _install_project(rootfs, repo)
            (directory / "venv.stamp").write_text(venv_stamp + "\n")
    return rootfs


def _build(recipe: Recipe, directory: Path) -> None:
    if shutil.which("mmdebstrap", path=with_sbin(dict(os.environ))["PATH"]) is None:
        _say("installing mmdebstrap")
        env = {**with_sbin(dict(os.environ)), "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "mmdebstrap"], timeout=600, env=env)
    new, rootfs, old = directory / "rootfs.new", directory / "rootfs", directory / "rootfs.old"
    for stale in (new, old):
        shutil.rmtree(stale, ignore_errors=True)
    _say(f"building the {recipe.suite} root filesystem in {rootfs} (about a minute)")
    started = time.monotonic()
    run(recipe.mmdebstrap_argv(new), timeout=900)
    shutil.copyfile(CA_BUNDLE, new / CA_BUNDLE.relative_to("/"))
    resolv = new / "etc" / "resolv.conf"
    resolv.unlink(missing_ok=True)
    shutil.copyfile("/etc/resolv.conf", resolv)
    for mount_point in ("etc/slurm", "etc/clusterctl", "run/healthd"):
        (new / mount_point).mkdir(parents=True, exist_ok=True)
    if rootfs.exists():
        os.rename(rootfs, old)  # a running testbed keeps its chroot; the old tree goes once renamed
    os.rename(new, rootfs)
    shutil.rmtree(old, ignore_errors=True)
    (directory / "rootfs.stamp").write_text(recipe.digest() + "\n")
    _say(f"built {recipe.suite} in {time.monotonic() - started:.0f} s")


def run_in_root(rootfs: Path, repo: Path, argv: list[str], *, timeout: float) -> None:
    """Run `argv` chrooted into `rootfs` with this checkout, /tmp and the kernel filesystems mounted."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "LANG": "C.UTF-8", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.update({k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV)})
    run(["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", "clusterctl_testbed.holder",
         "--root", str(rootfs), "--bind", f"{repo}:{repo}", "--bind", f"{repo}:{SOURCE}", "--exec", "--", *argv], timeout=timeout, env=env)


def _install_project(rootfs: Path, repo: Path) -> None:
    _say(f"installing clusterctl from {repo} into {rootfs}{VENV} (editable, from {SOURCE})")
    shutil.rmtree(rootfs / VENV.relative_to("/"), ignore_errors=True)
    run_in_root(rootfs, repo, ["python3", "-m", "venv", str(VENV)], timeout=120)
    run_in_root(rootfs, repo, [str(VENV / "bin" / "pip"), "install", "-q", "-e", str(SOURCE)], timeout=600)
