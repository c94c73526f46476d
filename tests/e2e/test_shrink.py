"""When the spares run out, a job goes on with fewer data-parallel replicas inside its allocation (issue 43),
on the real testbed: the lost node and nothing else given back to Slurm, no new sbatch, the run ending
bit-identical to an unshrunk one (the toy trainer's sums do not depend on how the slots are spread)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.records.rank_map import read_rank_map
from clusterctl_testbed.gpu_faults import Fault, inject
from tests.conftest import REPO, clusterctl_on
from tests.e2e.supervised_runs import finished, journal_events, squeue, supervised, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.one_release]  # the Slurm side (a node given back) is the spare stories'

STEPS = 60


def _spec(tmp_path: Path, min_data_parallel: int) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f"""\
[job]
name = "shrinks"
nodes = 3
gpus_per_node = 8
sbatch_options = ["--exclusive"]
[launch]
command = ["python3", "toy_trainer.py", "--checkpoint-dir", "{{checkpoint_dir}}", "--steps", "{STEPS}",
           "--checkpoint-every", "10", "--step-time", "0.15", "--log-every", "10", "--peer-timeout", "15"]
workdir = "{REPO / 'examples'}"
[parallel]
tp = 8
pp = 1
[checkpoint]
dir = "{{run_dir}}/checkpoints"
validator = "manifest"
resume_args = ["--resume", "{{path}}"]
[restart]
min_data_parallel = {min_data_parallel}
poll_seconds = 0.5
backoff_seconds = 0.5
""")
    return path


@pytest.fixture(scope="module")
def reference(testbed_session, tmp_path_factory) -> dict:
    """The same training on 3 nodes (dp = 3), uninterrupted."""
    tmp = tmp_path_factory.mktemp("reference-3")
    clusterctl_on(testbed_session, "submit", str(_spec(tmp, 3)), "--run-dir", str(tmp / "run"), "--wait", timeout=180)
    final = json.loads((tmp / "run" / "checkpoints" / "final.json").read_text())
    assert final["step"] == STEPS
    return final


def _hosts(cluster, nodes: str) -> list[str]:
    return cluster.run_on("ctl", ["scontrol", "show", "hostnames", nodes]).stdout.split()


def test_with_no_spare_a_lost_node_leaves_the_job_one_replica_smaller_in_the_same_allocation(cluster, tmp_path,
                                                                                               reference):
    proc, run_dir = supervised(cluster, tmp_path, _spec(tmp_path, 2))
    wait_until(lambda: (run_dir / "checkpoints" / "step-00000020").exists(), "checkpoint 20", proc=proc)
    job = journal_events(run_dir, "submitted")[0].job_id
    batch_host = _hosts(cluster, squeue(cluster, "-j", job, "-o", "%N"))[0]  # where the agent runs
    broken = next(n for n in read_rank_map(run_dir / "jobs" / job).slots if n != batch_host)
    inject(cluster.nvml_dir(broken), Fault("xid", gpu=3, value=79))
    wait_until(lambda: journal_events(run_dir, "recovered-in-allocation"), "the shrink", proc=proc)
    held = _hosts(cluster, squeue(cluster, "-j", job, "-o", "%N"))
    assert broken not in held and len(held) == 2, held  # the lost node given back, nothing held unused
    out = finished(cluster, proc)
    final = json.loads((run_dir / "checkpoints" / "final.json").read_text())
    assert (final["step"], final["digest"]) == (STEPS, reference["digest"]), out
    assert final["world_size"] == 16, out  # two replicas of tp = 8
    assert len(journal_events(run_dir, "submitted")) == 1, out  # never back through the queue
    (event,) = journal_events(run_dir, "recovered-in-allocation")
    assert (event.data_parallel_before, event.data_parallel_after) == (3, 2), out
    assert [b.node for b in event.blame] == [broken] and event.given_back == (broken,), out
    log = (run_dir / "logs" / f"{job}.out").read_text()  # the agent's own lines
    assert "no spare left: shrinking from 3 to 2 data-parallel replicas on 2 nodes" in log, log
    assert "with 2 of 3 data-parallel replicas" in log, log
    report = clusterctl_on(cluster, "report", str(run_dir)).stdout
    assert "shrunk from 3 to 2 data-parallel replicas" in report, report
    assert "capacity lost running smaller" in report, report



def test_a_job_whose_spec_forbids_shrinking_is_resubmitted_without_the_node_as_before(cluster, tmp_path, reference):
    proc, run_dir = supervised(cluster, tmp_path, _spec(tmp_path, 3))
    wait_until(lambda: (run_dir / "checkpoints" / "step-00000020").exists(), "checkpoint 20", proc=proc)
    job = journal_events(run_dir, "submitted")[0].job_id
    batch_host = _hosts(cluster, squeue(cluster, "-j", job, "-o", "%N"))[0]
    broken = next(n for n in read_rank_map(run_dir / "jobs" / job).slots if n != batch_host)
    inject(cluster.nvml_dir(broken), Fault("xid", gpu=3, value=79))
    out = finished(cluster, proc, timeout=240)
    final = json.loads((run_dir / "checkpoints" / "final.json").read_text())
    assert (final["step"], final["digest"], final["world_size"]) == (STEPS, reference["digest"], 24), out
    submitted = journal_events(run_dir, "submitted")
    assert len(submitted) == 2 and broken in _hosts(cluster, submitted[1].exclude or ""), out
    assert not journal_events(run_dir, "recovered-in-allocation"), out
