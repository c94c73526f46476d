"""Shared fixtures. End-to-end tests run against a real Slurm testbed of their own.

The test testbed lives in its own directory and namespaces (`/tmp/ctb-test`, `ctbt-*`),
so a test run never touches a testbed a developer has up at /tmp/ctb.

The testbed package (`clusterctl_testbed`, development only) is imported only where the
end-to-end fixtures and names need it (TEST_LAYOUT and TEST_SLURM are made on first use), so
the unit tests run without it; `import_testbed()` skips a test that needs it when it is missing.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

from tests.recordings import Recording, load_recording, recording_dirs

if TYPE_CHECKING:
    from clusterctl_testbed.cluster import Testbed
    from clusterctl_testbed.layout import Layout

# Speed is measured by bench/, never by a test: hypothesis' per-example deadline (200 ms) only
# turns a loaded CI machine into failures.
settings.register_profile("clusterctl", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("clusterctl")

REPO = Path(__file__).resolve().parent.parent

# `--clock-shift=+365d`: the whole suite as if today were a year ahead (tests/clock_shift.py).
pytest_plugins = ["tests.clock_shift"]


def import_testbed(module: str = "") -> ModuleType:
    """`clusterctl_testbed` (or its `module`), or skip the test asking for it when it is not installed."""
    name = f"clusterctl_testbed.{module}" if module else "clusterctl_testbed"
    return pytest.importorskip(name, reason="needs the testbed package: pip install -e ./testbed")


BACKEND = os.environ.get("CLUSTERCTL_TEST_BACKEND", "namespace")
"""Which testbed the end-to-end tests run on: `namespace` (default) or `compose` (docker-compose services)."""


@cache
def _test_layout() -> Layout:
    from clusterctl_testbed.compose import compose_layout
    from clusterctl_testbed.layout import Layout

    # CLUSTERCTL_TEST_TESTBED=<short name> gives a test run a testbed of its own (/tmp/ctb-<name>,
    # namespaces ct<name>-*), so two runs on one machine do not share daemons.
    name = os.environ.get("CLUSTERCTL_TEST_TESTBED", "test")
    if not name.isalnum() or len(name) > 8:
        raise SystemExit(f"CLUSTERCTL_TEST_TESTBED={name!r}: use up to 8 letters or digits")
    if BACKEND == "compose":
        return replace(compose_layout(f"ctd{name}"), timeouts=_test_timeouts())  # /tmp/ctd/ctd<name>, containers ctd<name>-*
    if name == "test":
        return Layout(root=Path("/tmp/ctb-test"), namespace_prefix="ctbt-", timeouts=_test_timeouts())
    return Layout(root=Path(f"/tmp/ctb-{name}"), namespace_prefix=f"ct{name}-", timeouts=_test_timeouts())


def _test_timeouts() -> str:
    # CLUSTERCTL_TEST_TIMEOUTS=production runs the session's testbed with Slurm's default timeouts
    # (300/10/30 s): the recovery stories as a real cluster sees them (scripts/test-production.sh).
    from clusterctl_testbed.slurm_config import TIMEOUTS

    name = os.environ.get("CLUSTERCTL_TEST_TIMEOUTS", "fast")
    if name not in TIMEOUTS:
        raise SystemExit(f"CLUSTERCTL_TEST_TIMEOUTS={name!r}: use one of {', '.join(TIMEOUTS)}")
    return name


def pytest_configure(config: pytest.Config) -> None:
    # On the compose testbed only the testbed's root, its shared directory and the checkout exist in
    # every container: the run directories the tests make in tmp_path must live in the shared one.
    # Made private (root's, nobody else may write) before pytest makes its basetemp in it.
    if BACKEND != "compose" or config.option.basetemp or os.geteuid() != 0:
        return
    try:
        from clusterctl_testbed.compose import shared_dir
        from clusterctl_testbed.private_root import ensure_private_root
    except ImportError:
        return  # no testbed package: the end-to-end tests skip
    config.option.basetemp = str(ensure_private_root(shared_dir(_test_layout())) / "pytest")


def shared_scratch() -> Path:
    """Where a test makes a directory that several users reach on every host: /tmp on the namespace
    testbed (every host sees the machine's), the shared directory on the compose testbed."""
    if BACKEND != "compose":
        return Path("/tmp")
    from clusterctl_testbed.compose import shared_dir

    return shared_dir(_test_layout())


def side_layout(tag: str, **changes: object) -> Layout:
    """A second testbed of this session's own beside the session one (`/tmp/ctb-<name><tag>`,
    namespaces `ct<name><tag>-*`), so tests that bring up their own never collide with another run's."""
    layout = _test_layout()
    return replace(layout, root=Path(f"{layout.root}{tag}"),
                   namespace_prefix=f"{layout.namespace_prefix.rstrip('-')}{tag}-", **changes)


@cache
def _test_release() -> str:
    from clusterctl_testbed.versions import RELEASES

    # One Slurm release per pytest session: CLUSTERCTL_TEST_SLURM=22.05|24.11|26.05 runs the whole
    # suite on that release's testbed (scripts/test-matrix.sh runs every one).  The default stays this
    # machine's own 22.05 (`host`) until the Slurm door reads the newer releases; then it becomes the
    # newest, like `clusterctl-testbed up` without --slurm.
    name = os.environ.get("CLUSTERCTL_TEST_SLURM", "host")
    if name not in RELEASES:
        raise SystemExit(f"CLUSTERCTL_TEST_SLURM={name!r}: use one of {', '.join(RELEASES)}")
    return name



def __getattr__(name: str) -> Any:
    # TEST_LAYOUT: the testbed of this session's end-to-end tests.  TEST_SLURM: the Slurm release
    # (clusterctl_testbed.versions.RELEASES) every end-to-end test of this session runs on.
    if name == "TEST_LAYOUT":
        return _test_layout()
    if name == "TEST_SLURM":
        return _test_release()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@pytest.fixture(params=recording_dirs(), ids=lambda directory: directory.name)
def recording(request: pytest.FixtureRequest) -> Recording:
    """Each release's recorded Slurm outputs in turn (tests/data/slurm/*/index.json, listed: a new
    release's directory is tested with no test edit; see tests/recordings.py)."""
    return load_recording(request.param)


@pytest.fixture(scope="session")
def testbed_session() -> Iterator[Testbed]:
    """The real Slurm testbed, up once for the whole session and torn down at its end."""
    from clusterctl_testbed.cluster import Testbed
    from clusterctl_testbed.compose import ComposeTestbed

    if os.geteuid() != 0:
        pytest.fail("end-to-end tests need root (namespaces, Slurm daemons): run the README's test command as root")
    tb = (ComposeTestbed if BACKEND == "compose" else Testbed)(_test_layout())
    running = tb.running() if tb.is_up() else None
    if running is not None and (running.release, running.timeouts) != (_test_release(), tb.layout.timeouts):
        tb.down(quiet=True)  # left up by an earlier session on another release or timeouts
    tb.up(timeout=90, slurm=_test_release())
    try:
        yield tb
    finally:
        tb.down()


@pytest.fixture()
def cluster(testbed_session: Testbed) -> Iterator[Testbed]:
    """The session testbed, restored after each test: controller and healthd running, jobs
    cancelled, nodes booted, links up, GPUs healthy, every drain resumed."""
    from clusterctl_testbed.gpu_faults import Fault, inject
    from clusterctl_testbed.system import is_alive

    yield testbed_session
    tb = testbed_session
    pids = tb._pids()
    if not is_alive(pids.get("slurmctld", 0)):
        tb.start_controller()
    tb.run_on("ctl", ["scancel", "--user=root"], check=False)
    faulted = False
    for node in tb.layout.nodes:
        if not is_alive(pids.get(f"holder:{node}", 0)):
            tb.boot_node(node)
        elif not is_alive(tb._pids().get(f"healthd:{node}", 0)):
            tb.start_healthd(node)
        tb.heal_link(node)
        state = tb.nvml_dir(node) / "state"
        before = state.read_text() if state.exists() else ""
        inject(tb.nvml_dir(node), Fault("clear"))
        faulted = faulted or state.read_text() != before
        faulted = _clear_network_and_diagnostic_faults(tb.nvml_dir(node)) or faulted
    # A job that ran on a node cut off or given back completes only once that node answers again, and its
    # epilog runs then (seen: during the next test, draining the node for what it found): wait for it here.
    deadline = time.monotonic() + 120
    while tb.run_on("ctl", ["squeue", "-h", "-t", "CG,CF", "-o", "%i"], check=False).stdout.strip() and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    tb.back_in_service(faulted=faulted)


def _clear_network_and_diagnostic_faults(node_dir: Path) -> bool:
    """Every NIC's port healthy again and the node's dcgmi passing; whether anything was faulted."""
    from clusterctl_testbed.dcgmi_emu import FAULT_FILE, DiagFault, inject_diag
    from clusterctl_testbed.ib_faults import HEALTHY_LINK, HEALTHY_PORT, SYSFS_IB, IbFault, inject_ib

    faulted = False
    diag = node_dir / FAULT_FILE
    if diag.exists() and diag.read_text().strip():
        inject_diag(node_dir, DiagFault("clear"))
        faulted = True
    ib = node_dir / "sysroot" / SYSFS_IB
    for device in sorted(ib.iterdir()) if ib.is_dir() else []:
        port = device / "ports" / "1"
        healthy = all((port / name).read_text().strip() == text for name, text in HEALTHY_PORT.items()) and all(
            (device / "device" / name).read_text().strip() == text for name, text in HEALTHY_LINK.items())
        if not healthy:
            inject_ib(node_dir / "sysroot", IbFault("ib-clear", nic=int(device.name.rsplit("_", 1)[1])))
            faulted = True
    return faulted


def run_python_on(tb: Testbed, host: str, code: str, *, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a Python snippet on a testbed host with the Python the project runs with there (pynvml and the
    project importable): this interpreter on this machine's Slurm, the root filesystem's own otherwise."""
    argv = [*tb.enter(host), str(tb.python), "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def wait_job(tb: Testbed, job_id: str, timeout: float = 120) -> str:
    """Wait until Slurm's accounting says the job ended; its final state (COMPLETED, FAILED...)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = tb.run_on("ctl", ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"]).stdout.strip()
        if state and state not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s")


def clusterctl_on(tb: Testbed, *args: str, check: bool = True, timeout: float = 60):
    """Run this checkout's `clusterctl` on the login node (the testbed's controller host)."""
    return tb.run_on("ctl", [str(tb.python), "-c", "from clusterctl.launcher.login.cli import main; main()", *args], check=check,
                     timeout=timeout, cwd=str(REPO))
