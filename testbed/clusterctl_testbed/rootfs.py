"""Debian root filesystems that carry one Slurm release each, built with mmdebstrap and cached.

A root filesystem holds every daemon and command of its Slurm (slurmctld, slurmd, slurmdbd,
MariaDB, munge, the clients) and a venv at `VENV` with the project installed editable, by the root
filesystem's own Python, from `SOURCE`: every testbed mounts its own checkout there, so testbeds of
one release started from different checkouts share the venv instead of reinstalling it under each
other.  It is rebuilt only when its recipe (suite, packages, mirror, RECIPE; for a release built
from source, its tag and configure arguments) changed; the venv only when the project's
pyproject.toml changed.

A release Debian does not ship (versions.Release.source_tag) gets the same root filesystem without
Debian's Slurm packages but with what builds Slurm (the compiler and the -dev packages SchedMD's own
debian/control names), and Slurm is built inside it from SchedMD's tree at that tag
(clusterctl_testbed.slurm_source): `./configure` with Debian's paths, `make`, `make install` into
/usr, niced, output in `build.log` beside the root filesystem.  Its stamp records the tag, the
commit and how long the build took.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clusterctl_testbed import slurm_source
from clusterctl_testbed.system import CommandResult, TestbedError, run, run_logged, with_sbin
from clusterctl_testbed.versions import Release, parse_version, tag_version

CACHE = Path(os.environ.get("CLUSTERCTL_TESTBED_CACHE", "/var/cache/clusterctl-testbed"))
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
RECIPE = 1
"""Bump when the build steps below change in a way that needs every cached root filesystem rebuilt."""

PACKAGES = (
    "munge", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "mariadb-server-core", "mariadb-client-core",
    "python3", "python3-venv", "ca-certificates", "iproute2", "hostname", "procps",
)
SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd")
"""Debian's Slurm, left out where Slurm is built from source."""
BUILD_PACKAGES = (
    "gcc", "g++", "make", "libc6-dev", "pkg-config",
    # What SchedMD's debian/control builds with, less what the testbed never uses (GTK's sview,
    # IPMI, HDF5, RRD, PMIx, Kafka, perl): json-c, http-parser, libyaml and libjwt give the
    # data_parser and serializer plugins behind `--json`/`--yaml` and slurmrestd; MariaDB's client
    # library the accounting_storage/mysql plugin slurmdbd loads.
    "libmunge-dev", "libmariadb-dev", "libjson-c-dev", "libhttp-parser-dev", "libyaml-dev", "libjwt-dev",
    "libdbus-1-dev", "liblua5.3-dev", "libhwloc-dev", "libpam0g-dev", "libreadline-dev", "libcurl4-openssl-dev",
    "liblz4-dev",
)
CONFIGURE_ARGS = (
    # The paths of Debian's packages the testbed relies on: every host sees its slurm.conf at
    # /etc/slurm; the state, spool and log paths are all in slurm.conf.
    "--prefix=/usr", "--sysconfdir=/etc/slurm", "--localstatedir=/var", "--runstatedir=/run",
    "--disable-debug",
    # Named, so that configure fails at once when one is missing instead of quietly building
    # a Slurm without --json, slurmrestd or slurmdbd's MariaDB plugin.
    "--with-munge", "--with-mysql_config=/usr/bin", "--with-json", "--with-http-parser", "--with-yaml",
    "--with-jwt", "--with-hwloc", "--with-lz4", "--with-lua",
    # The testbed's slurmd all share one machine and so one munged: a step's launch credential,
    # forwarded from node to node, reaches that munged again and SchedMD's code refuses it as
    # replayed ("_verify_signature: failed decode", "Header lengths are longer than data received":
    # every multi-node step failed) unless built for several slurmd on one machine.  Debian's packages
    # accept the replay with a patch of their own.  Its other effects: slurmstepd's and syslog's name
    # carry the node's ("slurmstepd-node1"), and the cluster's flags say MULTIPLE_SLURMD.
    "--enable-multiple-slurmd",
)
BUILD_DIR = Path("/usr/src/slurm")
"""Inside the root filesystem: where SchedMD's tree is unpacked and built (removed once installed)."""
PLUGIN_DIR = Path("/usr/lib/slurm")
"""Inside the root filesystem: where `make install` puts the plugins (--prefix=/usr: $libdir/slurm)."""
REQUIRED_PLUGINS = (
    "auth_munge", "accounting_storage_slurmdbd", "accounting_storage_mysql", "select_cons_tres", "gres_gpu",
    "topology_tree", "serializer_json", "serializer_yaml", "auth_jwt", "data_parser_v*",
)
"""Plugins a source build must have made (a trailing * is any version): the testbed's slurm.conf and
slurmdbd.conf load the first ones, `--json` and slurmrestd the last four."""
BUILD_MINUTES_HERE = 5
"""configure + make + make install of 24.05 on this project's 2-core machine, niced, while other work
ran: 4.8 min (median of 5 builds on 26 Nov 2026, 4.1-5.5 min)."""
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
class SourceBuild:
    """How a release Debian does not ship is built from SchedMD's source."""

    release: str
    """The release's name ("24.05")."""
    tag: str
    """SchedMD's git tag ("slurm-24-05-8-1")."""
    configure_args: tuple[str, ...] = CONFIGURE_ARGS


@dataclass(frozen=True)
class BuildStep:
    """One command of a source build, run inside the root filesystem."""

    what: str
    argv: tuple[str, ...]
    timeout: float


@dataclass(frozen=True)
class Recipe:
    """Everything a root filesystem is built from: a change in any of it means rebuild."""

    suite: str
    mirror: str
    packages: tuple[str, ...] = PACKAGES
    stale_release_file: bool = False
    version: int = RECIPE
    source: SourceBuild | None = None
    """Slurm built from SchedMD's source instead of Debian's packages; None for Debian's."""

    def digest(self) -> str:
        """A stable fingerprint of the recipe, kept beside the built root filesystem."""
        fields = asdict(self)
        if fields["source"] is None:
            del fields["source"]  # the fingerprint of a packaged release is what it was before source builds
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def name(self) -> str:
        """The cache directory's name: the suite, or for a source build the suite and the release
        ("bookworm-slurm-24.05"), so that it never replaces the suite's own packaged root filesystem."""
        return self.suite if self.source is None else f"{self.suite}-slurm-{self.source.release}"

    def build_steps(self, jobs: int) -> tuple[BuildStep, ...]:
        """The commands that build and install Slurm inside the root filesystem, in order (none for
        Debian's packages).  Niced: the build shares the machine with whatever else runs on it."""
        if self.source is None:
            return ()
        in_tree = ("nice", "-n", "19", "env", "-C", str(BUILD_DIR))
        return (
            BuildStep("configure", (*in_tree, "./configure", *self.source.configure_args), 1800),
            BuildStep("make", (*in_tree, "make", f"-j{jobs}"), 5400),
            BuildStep("make install", (*in_tree, "make", "install"), 1800),
            BuildStep("ldconfig", ("ldconfig",), 120),
        )

    def mmdebstrap_argv(self, target: Path) -> list[str]:
        """The mmdebstrap command that builds this recipe into `target`."""
        argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(self.packages)}",
                '--aptopt=APT::Install-Recommends "false"']
        if self.stale_release_file:
            argv.append('--aptopt=Acquire::Check-Valid-Until "false"')
        return [*argv, self.suite, str(target), self.mirror]


def source_packages() -> tuple[str, ...]:
    """The packages of a root filesystem whose Slurm is built from source: the usual ones without
    Debian's Slurm, and what builds it."""
    return (*(p for p in PACKAGES if p not in SLURM_PACKAGES), *BUILD_PACKAGES)


def recipe_for(release: Release, mirror: str | None = None) -> Recipe:
    """The recipe of `release`'s root filesystem, from `mirror` (default: this machine's apt mirror)."""
    if release.suite is None:
        raise ValueError(f"Slurm {release.name} runs from this machine's packages, not a root filesystem")
    if mirror is None:
        try:
            mirror = mirror_from_sources(SOURCES.read_text())
        except OSError:
            mirror = "http://deb.debian.org/debian"
    if release.source_tag is None:
        return Recipe(release.suite, mirror, stale_release_file=release.stale_release_file)
    return Recipe(release.suite, mirror, source_packages(), release.stale_release_file,
                  source=SourceBuild(release.name, release.source_tag))


def cached_root(release: Release, *, cache: Path | None = None) -> Path:
    """Where `release`'s root filesystem is (or will be) cached."""
    recipe = recipe_for(release, mirror="any")  # the directory's name does not depend on the mirror
    return (CACHE if cache is None else cache) / recipe.name / "rootfs"


def missing_plugins(installed: Iterable[str]) -> list[str]:
    """The REQUIRED_PLUGINS that are not among the plugin directory's file names."""
    stems = {name.removesuffix(".so") for name in installed if name.endswith(".so")}
    return [p for p in REQUIRED_PLUGINS
            if not (any(s.startswith(p[:-1]) for s in stems) if p.endswith("*") else p in stems)]


def build_position(lines: list[str]) -> str:
    """Where a build is, from the last lines of its output: the directory make last entered
    ("in src/plugins/serializer/json"), else the file last compiled, else the last line, shortened."""
    for line in reversed(lines):
        match = re.search(r"Entering directory '([^']*)'", line)
        if match is not None:
            inside = match[1].removeprefix(str(BUILD_DIR)).strip("/")
            return f"in {inside or 'the top directory'}"
    for line in reversed(lines):
        match = re.search(r" -c (\S+\.c)\b", line)
        if match is not None:
            return f"compiling {match[1]}"
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last if len(last) <= 80 else last[:77] + "..."


STAMP_FORMAT = 1


@dataclass(frozen=True)
class BuiltSlurm:
    """A Slurm built from source, as its root filesystem's stamp records it."""

    tag: str
    commit: str | None
    """The commit the tag names; None when built from a tarball."""
    source: str
    """Where the tree came from (a git directory, a URL, or a tarball with its sha256)."""
    version: str
    """What the built `slurmctld -V` says ("slurm 24.05.8")."""
    build_seconds: float
    """Wall time of configure, make and make install."""


@dataclass(frozen=True)
class Stamp:
    """What a cached root filesystem was built from (`rootfs.stamp` beside it)."""

    recipe: str
    """The recipe's digest: a root filesystem whose recipe has another is rebuilt."""
    slurm: BuiltSlurm | None = None
    format: int = field(default=STAMP_FORMAT)

    def render(self) -> str:
        """The stamp's text (JSON)."""
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"


def read_stamp(text: str) -> Stamp | None:
    """The stamp in `text`; None (the root filesystem counts as stale and is rebuilt) for anything this
    reader does not understand: another format, a broken file.  A bare digest is a stamp written
    before stamps were records."""
    text = text.strip()
    if text and all(c in "0123456789abcdef" for c in text):
        return Stamp(text)
    try:
        data = json.loads(text)
        if data.get("format") != STAMP_FORMAT:
            return None
        slurm = data.get("slurm")
        return Stamp(str(data["recipe"]), None if slurm is None else BuiltSlurm(**slurm))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def project_digest(repo: Path) -> str:
    """Fingerprint of what the venv's install depends on (the project's pyproject.toml)."""
    return hashlib.sha256((repo / "pyproject.toml").read_bytes()).hexdigest()[:16]


def _stamp(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def ensure(release: Release, repo: Path, *, cache: Path = CACHE, slurm_source_given: str | None = None) -> Path:
    """The root filesystem of `release` with the project's venv, building what is stale; its path.

    `slurm_source_given`: where a release built from source gets SchedMD's tree (a git directory,
    a tarball or a URL; slurm_source.choose_source; default: $CLUSTERCTL_SLURM_SOURCE, else
    SchedMD's repository), used only when it must be built."""
    recipe = recipe_for(release)
    directory = cache / recipe.name
    directory.mkdir(parents=True, exist_ok=True)
    rootfs = directory / "rootfs"
    with open(directory / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two testbeds starting at once build once
        stamp = read_stamp(_stamp(directory / "rootfs.stamp"))
        if stamp is None or stamp.recipe != recipe.digest() or not rootfs.is_dir():
            _build(recipe, directory, release, repo, cache, slurm_source_given)
            (directory / "venv.stamp").unlink(missing_ok=True)
        venv_stamp = f"{recipe.digest()}-{project_digest(repo)}"
        if _stamp(directory / "venv.stamp") != venv_stamp:
            _install_project(rootfs, repo)
            (directory / "venv.stamp").write_text(venv_stamp + "\n")
    return rootfs


def _install_tool(binary: str, package: str) -> None:
    if shutil.which(binary, path=with_sbin(dict(os.environ))["PATH"]) is None:
        _say(f"installing {package}")
        env = {**with_sbin(dict(os.environ)), "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], timeout=600, env=env)


def _build(recipe: Recipe, directory: Path, release: Release, repo: Path, cache: Path,
           slurm_source_given: str | None) -> None:
    _install_tool("mmdebstrap", "mmdebstrap")
    new, rootfs, old = directory / "rootfs.new", directory / "rootfs", directory / "rootfs.old"
    for stale in (new, old):
        shutil.rmtree(stale, ignore_errors=True)
    tree: tuple[Path, slurm_source.Origin] | None = None
    if recipe.source is not None:  # the source first: a missing one is said before minutes of work
        _install_tool("git", "git")
        # The environment too: the test suite and the scripts bring testbeds up without a command line.
        choice = slurm_source.choose_source(slurm_source_given or os.environ.get(slurm_source.ENV))
        _say(f"Slurm {release.name} is built from SchedMD's source, tag {recipe.source.tag}, from {choice.location}")
        tree = slurm_source.export(choice, release, directory / "slurm-source.tar", cache / "slurm.git")
    _say(f"building the {recipe.name} root filesystem in {rootfs} (about a minute"
         f"{f', then about {BUILD_MINUTES_HERE} min for Slurm on 2 cores' if tree else ''})")
    started = time.monotonic()
    run(recipe.mmdebstrap_argv(new), timeout=900)
    shutil.copyfile(CA_BUNDLE, new / CA_BUNDLE.relative_to("/"))
    resolv = new / "etc" / "resolv.conf"
    resolv.unlink(missing_ok=True)
    shutil.copyfile("/etc/resolv.conf", resolv)
    for mount_point in ("etc/slurm", "etc/clusterctl", "run/healthd"):
        (new / mount_point).mkdir(parents=True, exist_ok=True)
    built = None
    if tree is not None:
        built = _build_slurm(recipe, release, new, repo, *tree, log=directory / "build.log")
        (directory / "slurm-source.tar").unlink(missing_ok=True)
    if rootfs.exists():
        os.rename(rootfs, old)  # a running testbed keeps its chroot; the old tree goes once renamed
    os.rename(new, rootfs)
    shutil.rmtree(old, ignore_errors=True)
    (directory / "rootfs.stamp").write_text(Stamp(recipe.digest(), built).render())
    _say(f"built {recipe.name} in {time.monotonic() - started:.0f} s")


def _build_slurm(recipe: Recipe, release: Release, root: Path, repo: Path, tree: Path,
                 origin: slurm_source.Origin, *, log: Path) -> BuiltSlurm:
    """Unpack SchedMD's tree into `root`, build and install it there; what was built."""
    build_dir = root / BUILD_DIR.relative_to("/")
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir(parents=True)
    members = run(["tar", "-tf", str(tree)], timeout=300).stdout.splitlines()
    strip = ["--strip-components=1"] if slurm_source.top_directory(members) else []
    run(["tar", "-xf", str(tree), "-C", str(build_dir), *strip], timeout=600)
    slurm_source.check_tree_version(_stamp(build_dir / "META"), release, origin.source)
    log.write_text("")
    jobs = os.cpu_count() or 1
    _say(f"building Slurm {release.name} ({origin.tag}) in {root}: configure, make -j{jobs}, make install, "
         f"niced (about {BUILD_MINUTES_HERE} min on 2 cores); the output goes to {log}")
    started = time.monotonic()
    for step in recipe.build_steps(jobs):
        def progress(elapsed: float, lines: list[str], what: str = step.what) -> None:
            _say(f"  Slurm {release.name}: {what}, {elapsed / 60:.0f} min so far, {build_position(lines)}")
        run_in_root(root, repo, list(step.argv), timeout=step.timeout, log=log, progress=progress)
    seconds = time.monotonic() - started
    plugins = root / PLUGIN_DIR.relative_to("/")
    if missing := missing_plugins(os.listdir(plugins) if plugins.is_dir() else []):
        raise TestbedError(f"the Slurm {release.name} build made no {', '.join(missing)} plugin in {PLUGIN_DIR}; "
                           f"see configure's summary in {log}")
    # slurmctld -V, not sinfo --version: the commands want a slurm.conf (or DNS SRV records) even for that.
    version = run_in_root(root, repo, ["slurmctld", "-V"], timeout=30).stdout.strip()
    if parse_version(version) != tag_version(origin.tag):
        raise TestbedError(f"the Slurm built from {origin.tag} says {version!r}; see {log}")
    shutil.rmtree(build_dir, ignore_errors=True)  # hundreds of MB of objects; build.log keeps the story
    _say(f"built {version} from {origin.tag} in {seconds / 60:.1f} min (configure + make + make install)")
    return BuiltSlurm(origin.tag, origin.commit, origin.source, version, round(seconds, 1))


def run_in_root(rootfs: Path, repo: Path, argv: list[str], *, timeout: float, log: Path | None = None,
                progress: Callable[[float, list[str]], None] | None = None) -> CommandResult:
    """Run `argv` chrooted into `rootfs` with this checkout, /tmp and the kernel filesystems mounted.

    With `log`, a long command: its output is appended to `log` (not returned) and `progress` is
    told the elapsed seconds and the log's last lines every minute."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "LANG": "C.UTF-8", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.update({k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV)})
    full = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", "clusterctl_testbed.holder",
            "--root", str(rootfs), "--bind", f"{repo}:{repo}", "--bind", f"{repo}:{SOURCE}", "--exec", "--", *argv]
    if log is not None:
        run_logged(full, log, timeout=timeout, env=env, progress=progress)
        return CommandResult(tuple(full), 0, "", "")
    return run(full, timeout=timeout, env=env)


def _install_project(rootfs: Path, repo: Path) -> None:
    _say(f"installing clusterctl from {repo} into {rootfs}{VENV} (editable, from {SOURCE})")
    shutil.rmtree(rootfs / VENV.relative_to("/"), ignore_errors=True)
    run_in_root(rootfs, repo, ["python3", "-m", "venv", str(VENV)], timeout=120)
    run_in_root(rootfs, repo, [str(VENV / "bin" / "pip"), "install", "-q", "-e", str(SOURCE)], timeout=600)
