"""`down` leaves no process and no namespace behind, and `up` starts fresh every time."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl_testbed.cluster import Testbed
from clusterctl_testbed.system import is_alive, namespaces
from tests.conftest import TEST_SLURM, side_layout

# CI time: the testbed's own teardown: the same on every release.
pytestmark = [pytest.mark.e2e, pytest.mark.one_release]

# A second, smaller testbed of its own (directory, namespaces): the session one keeps running.
SMALL = side_layout("td", leaves=(("leaf1", ("node1",)), ("leaf2", ("node2",))))


def _our_processes(root: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(root) in cmdline and is_alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def test_down_leaves_nothing_and_up_restarts_job_ids(testbed_session):
    tb = Testbed(SMALL)
    try:
        for _ in range(2):
            tb.up(timeout=60, slurm=TEST_SLURM)
            job = tb.run_on("ctl", ["sbatch", "--parsable", "-N2", "--wrap", "srun hostname"]).stdout.strip()
            assert job == "1", "a fresh testbed starts job ids at 1"
            pids = list(tb._pids().values())
            tb.down()
            assert not [p for p in pids if is_alive(p)]
            assert not [ns for ns in namespaces() if ns.startswith(SMALL.namespace_prefix)]
            assert not _our_processes(SMALL.root)
    finally:
        tb.down(quiet=True)
    # The session testbed was not disturbed.
    assert testbed_session.is_up()


def test_down_leaves_no_record_a_fresh_run_could_mistake_for_its_own(testbed_session):
    tb = Testbed(SMALL)
    try:
        tb.up(timeout=60, slurm=TEST_SLURM)
        (SMALL.root / "job-health" / "1").mkdir(parents=True)
        tb.down()
        assert sorted(p.name for p in SMALL.root.iterdir()) == ["log"]
    finally:
        tb.down(quiet=True)
