"""Stories whose Slurm side differs between releases (issue 12): what a user sees of a job that
failed or completed, and a block topology that `--segment` is run on, not only rendered.

Every test here is marked `slurm_versions` (CI runs the marked stories on 24.11 too, beside the
full suite on the newest release and on 22.05; see scripts/test.sh).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterctl_testbed.cluster import Testbed
from clusterctl_testbed.versions import RELEASES
from tests.conftest import REPO, TEST_SLURM, clusterctl_on, side_layout, wait_job

pytestmark = [pytest.mark.e2e, pytest.mark.slurm_versions]

SEGMENT_SINCE = (24, 5)
"""sbatch --segment exists from Slurm 24.05 (topology/block itself from 23.11)."""


def _spec(tmp_path: Path, command: list[str], *, nodes: int = 1, extra: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f"""\
[job]
name = "versions"
nodes = {nodes}
gpus_per_node = 8
[launch]
command = {json.dumps(command)}
workdir = "{REPO / 'examples'}"
[parallel]
tp = 8
{extra}""")
    return path


@pytest.mark.parametrize(("code", "state", "exit_status"), [(0, "COMPLETED", 0), (3, "FAILED", 1)])
def test_submit_wait_and_status_tell_a_completed_job_from_a_failed_one(cluster, tmp_path, code, state, exit_status):
    run_dir = tmp_path / "run"
    spec = _spec(tmp_path, ["python3", "-c", f"import sys; sys.exit({code})"])
    done = clusterctl_on(cluster, "submit", str(spec), "--run-dir", str(run_dir), "--wait", check=False, timeout=120)
    assert done.returncode == exit_status, done.stdout + done.stderr
    assert state in done.stderr, done.stderr  # the run's status, shown when the job ended
    status = json.loads(clusterctl_on(cluster, "status", str(run_dir), "--json").stdout)
    assert status["state"] == state, status


@pytest.fixture(scope="module")
def block_cluster() -> Iterator[Testbed]:
    """A testbed of the session's release whose topology is topology/block: one block per leaf
    (node[1-2], node[3-4]); its own directory and namespaces, beside the session one."""
    if RELEASES[TEST_SLURM].version < SEGMENT_SINCE:
        pytest.skip(f"Slurm {RELEASES[TEST_SLURM].version[0]}.{RELEASES[TEST_SLURM].version[1]:02d} has no --segment "
                    "(24.05 and newer): run with CLUSTERCTL_TEST_SLURM=24.11 or 26.05")
    tb = Testbed(side_layout("bk", topology="block", healthd=False))
    tb.up(timeout=90, slurm=TEST_SLURM)
    try:
        yield tb
    finally:
        tb.down(quiet=True)


def _occupy_node2(tb: Testbed) -> str:
    """Keep node2 busy so that only the second block (node[3-4]) is wholly free."""
    job = tb.run_on("ctl", ["sbatch", "--parsable", "-w", "node2", "-N1", "--exclusive", "--wrap", "sleep 300"])
    tb.wait_nodes(lambda n: n.state == "allocated", nodes=["node2"], timeout=30, what="node2 allocated")
    return job.stdout.strip()


def test_the_block_topology_is_slurms_and_segment_allocates_within_a_block(block_cluster):
    tb = block_cluster
    topology = tb.run_on("ctl", ["scontrol", "show", "topology"]).stdout
    assert "BlockName=leaf1" in topology and "Nodes=node[3-4]" in topology, topology
    blocker = _occupy_node2(tb)
    try:
        # Two nodes in one segment: node1 and node3 are free too, but they are not one block.
        out = tb.run_on("ctl", ["srun", "-N2", "--segment=2", "hostname"], timeout=60).stdout
        assert sorted(out.split()) == ["node3", "node4"]
    finally:
        tb.run_on("ctl", ["scancel", blocker], check=False)


def test_clusterctl_submit_asks_for_a_segment_and_its_ranks_land_in_one_block(block_cluster, tmp_path):
    tb = block_cluster
    blocker = _occupy_node2(tb)
    try:
        spec = _spec(tmp_path, ["python3", "toy_trainer.py", "--checkpoint-dir", "{checkpoint_dir}", "--steps", "5",
                                "--checkpoint-every", "5"], nodes=2,
                     extra='[checkpoint]\ndir = "{run_dir}/checkpoints"\n')
        run_dir = tmp_path / "run"
        summary = json.loads(clusterctl_on(tb, "submit", str(spec), "--run-dir", str(run_dir), "--json").stdout)
        assert "--segment=2" in summary["sbatch_argv"], summary["sbatch_argv"]
        job_id = summary["job_id"]
        assert wait_job(tb, job_id) == "COMPLETED", (run_dir / "logs" / f"{job_id}.out").read_text()
        slots = json.loads((run_dir / "jobs" / job_id / "rankmap.json").read_text())["slots"]
        assert sorted(slots) == ["node3", "node4"]
    finally:
        tb.run_on("ctl", ["scancel", blocker], check=False)
