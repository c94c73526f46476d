"""The one drain door on the real testbed: a job's straggler verdict and healthd drain the same Slurm,
each as its own owner.  The verdict is drawn through the door the straggler actions use
(`SlurmDrains().drain`, run on the login node as a job's agent or supervisor would) rather than by
a whole straggler job, which takes minutes."""

from __future__ import annotations

import pytest

from clusterctl_testbed.gpu_faults import Fault, inject
from tests.conftest import run_python_on
from tests.e2e.test_healthd import drained, node_row, quiet_cycles, wait_until

pytestmark = pytest.mark.e2e


def straggler_drain(cluster, node: str) -> str:
    """A straggler verdict against `node` through the drain door, from the login node: what came of it."""
    code = ("import time\n"
            "from clusterctl.clock import utc\n"
            "from clusterctl.records.actions import Action\n"
            "from clusterctl.records.drain_reason import STRAGGLER, DrainReason\n"
            "from clusterctl.slurm.drains import SlurmDrains\n"
            f"reason = DrainReason('slow-gpus', Action.DRAIN_RESET, utc(time.time()), owner=STRAGGLER)\n"
            f"print(SlurmDrains().drain({node!r}, reason).describe())\n")
    done = run_python_on(cluster, "ctl", code)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_admins_drain_is_never_relabelled_by_a_straggler_verdict(cluster):
    cluster.run_on("ctl", ["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=admin: bad fan"])
    assert straggler_drain(cluster, "node2") == "not drained: kept another drain (admin: bad fan)"
    assert node_row(cluster, "node2").reason == "admin: bad fan"


def test_a_straggler_drain_takes_no_breaker_slot_and_healthd_never_resumes_it(cluster):
    # healthd may hold half of the 4-node partition (breaker_max_share 0.5): node1 holds one slot (RMA: never resumed).
    cluster.run_on("ctl", ["scontrol", "update", "NodeName=node1", "State=DRAIN",
                           "Reason=healthd: remap-failure gpu2 drain-rma 2026-11-22T00:00:00Z"])
    assert straggler_drain(cluster, "node2").startswith("drained: clusterctl straggler: slow-gpus drain-reset ")
    inject(cluster.nvml_dir("node3"), Fault("xid", gpu=3, value=79))
    row = wait_until(lambda: drained(cluster, "node3"), 10, "node3 drained for its Xid 79")
    assert row.reason.startswith("healthd: xid 79 gpu3 ")
    quiet_cycles(cluster, 3)  # node2's healthd checks stay clean (resume_when_clean is on): not its drain to lift
    assert node_row(cluster, "node2").reason.startswith("clusterctl straggler: ")
