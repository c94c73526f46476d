"""Multi-level checkpoints on the real testbed: every rank saves to its node's memory, each node's part
is copied to a buddy node, every k-th checkpoint flushed to shared storage; a node lost between its save
and the flush comes back on the spare from its buddy's copy, and a copy that went bad is caught by its
checksum and passed over for the next tier, without a restart loop.  The run ends bit-identical to an
uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.launcher.job.checkpoint_plan import run_key
from clusterctl.records.checkpoint_holdings import read_holdings
from clusterctl.records.rank_map import read_rank_map
from tests.conftest import REPO, clusterctl_on
from tests.e2e.supervised_runs import finished, journal_events, supervised, wait_until

pytestmark = pytest.mark.e2e

STEPS = 60
FLUSH_EVERY = 40


def _spec(cluster, tmp_path: Path, *, spares: int, tiers: bool) -> Path:
    path = tmp_path / "job.toml"
    tiers_keys = f"tiers = true\nflush_every_steps = {FLUSH_EVERY}\nkeep = 2\n" if tiers else ""
    path.write_text(f"""\
[job]
name = "tiers"
nodes = 2
spare_nodes = {spares}
gpus_per_node = 8
sbatch_options = ["--exclusive"]
[launch]
command = ["{cluster.python}", "toy_trainer.py", "--checkpoint-dir", "{{checkpoint_dir}}", "--steps", "{STEPS}",
           "--checkpoint-every", "10", "--step-time", "0.3", "--log-every", "10", "--peer-timeout", "15"]
workdir = "{REPO / 'examples'}"
[parallel]
tp = 8
pp = 2
[checkpoint]
dir = "{{run_dir}}/checkpoints"
{tiers_keys}
[restart]
poll_seconds = 0.5
backoff_seconds = 0.5
""")
    return path


def _tier(run_dir: Path, node: str) -> Path:
    """A node's fast tier of the run (the testbed's nodes share this machine's /dev/shm; each has its own folder)."""
    return Path("/dev/shm") / "clusterctl-0" / f"ckpt-{run_key(run_dir)}" / node


def _buddy_copied(run_dir: Path, nodes: list[str]) -> int | None:
    """The newest step whose every node's part is in its own tier and on its buddy, not on shared storage
    (what the nodes' holdings say: the files their reporters send to the agent)."""
    copies = [c for node in nodes if (held := read_holdings(_tier(run_dir, node) / "holdings.json"))
              for c in held.copies]
    local = {(c.step, c.of_node) for c in copies if c.tier == "local"}
    buddy = {(c.step, c.of_node) for c in copies if c.tier == "buddy"}
    shared = {c.step for c in copies if c.tier == "shared"}
    whole = [step for step in {s for s, _ in local} - shared
             if all((step, n) in local and (step, n) in buddy for n in nodes)]
    return max(whole, default=None)


def _batch_host(cluster, job: str) -> str:
    nodes = cluster.run_on("ctl", ["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()
    return cluster.run_on("ctl", ["scontrol", "show", "hostnames", nodes]).stdout.split()[0]


@pytest.fixture(scope="module")
def reference(testbed_session, tmp_path_factory) -> dict:
    """The same training on 2 nodes, uninterrupted, saving the classic way (rank 0 to shared storage)."""
    tmp = tmp_path_factory.mktemp("tiers-reference")
    clusterctl_on(testbed_session, "submit", str(_spec(testbed_session, tmp, spares=0, tiers=False)), "--run-dir",
                  str(tmp / "run"), "--wait", timeout=180)
    final = json.loads((tmp / "run" / "checkpoints" / "final.json").read_text())
    assert final["step"] == STEPS
    return final


# On the host release only in CI (its 45 minutes): on 26.05 the PyTorch sibling in test_pytorch.py tells
# the same Slurm side (a node powered off, the spare swapped in, a buddy's copy); the corrupted copy is that
# sibling's on the host (the same checksum, of a DCP part); scripts/test-matrix.sh runs both on every release.
@pytest.mark.parametrize("corrupt", [pytest.param(False, marks=pytest.mark.one_release),
                                     pytest.param(True, marks=pytest.mark.matrix_only)],
                         ids=["buddy-copy", "corrupted-buddy-copy"])
def test_a_node_lost_before_its_checkpoint_was_flushed_resumes_on_the_spare_from_its_buddys_copy(
        cluster, tmp_path, reference, corrupt):
    proc, run_dir = supervised(cluster, tmp_path, _spec(cluster, tmp_path, spares=1, tiers=True))
    wait_until(lambda: journal_events(run_dir, "submitted"), "the submission", 90, proc)
    job = journal_events(run_dir, "submitted")[0].job_id
    wait_until(lambda: (run_dir / "jobs" / job / "rankmap.json").exists(), "the rank map", 90, proc)
    slots = list(read_rank_map(run_dir / "jobs" / job).slots)
    wait_until(lambda: (_buddy_copied(run_dir, slots) or 0) >= 20, "a checkpoint copied to the buddies", 90, proc)
    victim = next(n for n in slots if n != _batch_host(cluster, job))
    survivor = next(n for n in slots if n != victim)
    if corrupt:  # every copy of the victim's part its buddy holds goes bad (a flipped byte in one rank's file)
        for step_dir in (_tier(run_dir, survivor) / "buddy" / victim).glob("step-*"):
            shard = next(step_dir.glob("rank-*.json"))
            data = bytearray(shard.read_bytes())
            data[len(data) // 2] ^= 0x01
            shard.write_bytes(bytes(data))
    cluster.kill_node(victim)
    out = finished(cluster, proc, timeout=240)
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text()) == reference, out
    assert len(journal_events(run_dir, "submitted")) == 1, out  # never back through the queue
    recovered = journal_events(run_dir, "recovered-in-allocation")
    assert [b.node for b in recovered[0].blame] == [victim], out
    log = (run_dir / "logs" / f"{job}.out").read_text()  # the job's output: the agent's and the ranks' lines
    if not corrupt:
        assert len(recovered) == 1, log
        assert f"resuming from step {recovered[0].checkpoint_step}: 1 node(s) from their own copies, 1 node(s) " \
               f"from a buddy's copy ({victim}'s on {survivor})" in log, log
        assert f"files from {victim}'s copy on {survivor} in" in log, log
        # Never flushed: the restart names the step and the nodes' tiers, no folder on shared storage.
        assert recovered[0].checkpoint is None, log
        assert f"from step {recovered[0].checkpoint_step} (in the nodes' tiers: 1 own copy, 1 buddy copy) " \
               "(no queue wait)" in log, log
        # Both nodes said their resume (their holdings, in their reports): the slowest read reaches the journal,
        # the job's log and `clusterctl report`.
        [resumed] = journal_events(run_dir, "resumed")
        assert (resumed.restart, resumed.step, resumed.nodes, resumed.reported) == \
            (1, recovered[0].checkpoint_step, 2, 2), log
        assert resumed.read_seconds is not None and resumed.slowest_node in recovered[0].nodes, log
        said = (f"resumed step {resumed.step}: 1 node(s) from their own copies, 1 node(s) from a buddy's copy "
                f"({victim}'s on {survivor}); read in {resumed.read_seconds:.2f} s (slowest: {resumed.slowest_node})")
        assert said in log, log
        report = " ".join(clusterctl_on(cluster, "report", str(run_dir)).stdout.split())  # rich wraps at 80 columns
        assert f"job {job}, restart 1: {said}" in report, report
    else:
        assert "fails its checksum" in log, log
        assert len(recovered) <= 3, log  # a bounded number of tries, never a loop
