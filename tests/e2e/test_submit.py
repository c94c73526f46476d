"""`clusterctl submit` against the real Slurm testbed: ranks land where the map says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clusterctl.records.rank_map import JobRankMap, read_rank_map
from clusterctl.records.rank_record import RankRecord, read_rank_records
from tests.conftest import REPO, clusterctl_on, wait_job

pytestmark = pytest.mark.e2e

EXAMPLES = REPO / "examples"


def _spec(tmp_path: Path, body: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def _submit(cluster, spec: Path, run_dir: Path, *extra: str) -> tuple[str, dict]:
    done = clusterctl_on(cluster, "submit", str(spec), "--run-dir", str(run_dir), "--json", *extra)
    summary = json.loads(done.stdout)
    return summary["job_id"], summary


def _ranks(run_dir: Path, job_id: str) -> tuple[JobRankMap, dict[int, RankRecord]]:
    job_dir = run_dir / "jobs" / job_id
    return read_rank_map(job_dir), read_rank_records(job_dir)


def _assert_every_rank_where_the_map_says(rank_map: JobRankMap, records: dict[int, RankRecord], log: str) -> None:
    assert sorted(records) == list(range(rank_map.world_size))
    for rank, record in records.items():
        node, gpu = rank_map.location(rank)
        assert (record.node, record.hostname, record.local_rank) == (node, node, gpu), record
    # What the program itself saw: the toy trainer prints "[<hostname> rank <r>]".
    seen = {int(r): host for host, r in re.findall(r"^\[(\S+) rank (\d+)\]", log, re.M)}
    assert seen and all(host == rank_map.location(r)[0] for r, host in seen.items())


@pytest.mark.slurm_versions
def test_the_example_runs_with_tp_inside_nodes_and_ranks_where_the_map_says(cluster, tmp_path):
    run_dir = tmp_path / "run"
    job_id, summary = _submit(cluster, EXAMPLES / "toy_trainer.toml", run_dir)
    assert "--switches=2@5:00" in summary["sbatch_argv"]
    assert wait_job(cluster, job_id) == "COMPLETED", (run_dir / "logs" / f"{job_id}.out").read_text()
    log = (run_dir / "logs" / f"{job_id}.out").read_text()
    rank_map, records = _ranks(run_dir, job_id)
    _assert_every_rank_where_the_map_says(rank_map, records, log)
    # TP = 8 = one node: every TP group's ranks share a host.
    for group in range(rank_map.world_size // 8):
        assert len({records[r].hostname for r in range(group * 8, group * 8 + 8)}) == 1
    plan = rank_map.plan
    assert plan["cost"]["objective"] <= plan["baselines"]["dfs"]["objective"]
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text())["step"] == 60

    status = json.loads(clusterctl_on(cluster, "status", str(run_dir), "--json").stdout)
    assert status["state"] == "COMPLETED" and status["attempts"][0]["rank_map"]["slots"] == list(rank_map.slots)


REORDERING = f"""\
[job]
name = "reorder"
nodes = 4
gpus_per_node = 8
[launch]
command = ["python3", "toy_trainer.py", "--checkpoint-dir", "{{run_dir}}/ck", "--steps", "5", "--checkpoint-every", "5"]
workdir = "{EXAMPLES}"
[parallel]
tp = 8
pp = 2
[placement]
weights = {{pp = 2.0}}   # pipeline neighbours under one leaf: slot order node1 node3 node2 node4
"""


def test_a_map_that_reorders_slurms_nodes_is_followed_through_the_hostfile(cluster, tmp_path):
    run_dir = tmp_path / "run"
    job_id, _ = _submit(cluster, _spec(tmp_path, REORDERING), run_dir)
    assert wait_job(cluster, job_id) == "COMPLETED", (run_dir / "logs" / f"{job_id}.out").read_text()
    rank_map, records = _ranks(run_dir, job_id)
    assert rank_map.nodelist == "node[1-4]"
    assert rank_map.slots == ("node1", "node3", "node2", "node4"), "the map must differ from Slurm's order"
    _assert_every_rank_where_the_map_says(rank_map, records, (run_dir / "logs" / f"{job_id}.out").read_text())
    # SLURM_NODEID follows Slurm's order, not the hostfile: rank 8 runs on node3, which Slurm numbers 2.
    assert records[8].slurm_nodeid == "2" and records[8].node == "node3"


def test_spare_nodes_are_allocated_and_left_out_of_the_map(cluster, tmp_path):
    spec = _spec(tmp_path, REORDERING.replace("nodes = 4", "nodes = 2\nspare_nodes = 1").replace("pp = 2", "pp = 1")
                 .replace("weights = {pp = 2.0}", "switches = 0"))
    run_dir = tmp_path / "run"
    job_id, _ = _submit(cluster, spec, run_dir)
    assert wait_job(cluster, job_id) == "COMPLETED", (run_dir / "logs" / f"{job_id}.out").read_text()
    rank_map, records = _ranks(run_dir, job_id)
    assert len(rank_map.slots) == 2 and len(rank_map.unused_nodes) == 1 and len(records) == 16


HOSTILE = ["$(touch {m}/1)", "`touch {m}/2`", "'; touch {m}/3; '", '"; touch {m}/4; "', "a\nb; touch {m}/5",
           "*", "~root", "${{IFS}}", "$((6*7))", "x\\", "a b\tc", "-n", "|| touch {m}/6", "é中☃"]


def test_hostile_values_reach_the_program_as_literal_text_and_run_nothing(cluster, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    values = [v.format(m=marks) for v in HOSTILE]
    probe = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
             "if k.startswith('HOSTILE_')}}, open(os.environ['OUT'] + '/' + os.environ['RANK'] + '.json', 'w'))")
    env = "\n".join(f"HOSTILE_{i} = {json.dumps(v)}" for i, v in enumerate(values))
    out = tmp_path / "out $(touch x)"
    out.mkdir()
    body = (f'[job]\nname = {json.dumps("n; touch " + str(marks) + "/7 `x`")}\nnodes = 1\ngpus_per_node = 2\n'
            f'[launch]\ncommand = {json.dumps(["python3", "-c", probe, *values])}\n'
            f'workdir = {json.dumps(str(tmp_path))}\n[launch.env]\nOUT = {json.dumps(str(out))}\n{env}\n')
    run_dir = tmp_path / f"run $(touch {marks}-8) `id`"
    job_id, _ = _submit(cluster, _spec(tmp_path, body), run_dir)
    assert wait_job(cluster, job_id) == "COMPLETED", (run_dir / "logs" / f"{job_id}.out").read_text()
    for rank in (0, 1):
        seen = json.loads((out / f"{rank}.json").read_text())
        assert seen["argv"] == values
        assert seen["env"] == {f"HOSTILE_{i}": v for i, v in enumerate(values)}
    assert list(marks.iterdir()) == [] and not list(tmp_path.glob("*-8"))


def test_a_bad_spec_is_refused_before_anything_reaches_slurm(cluster, tmp_path):
    before = cluster.run_on("ctl", ["squeue", "-h", "-o", "%i"]).stdout
    spec = _spec(tmp_path, '[job]\nname = "x"\nnodes = 3\n[launch]\ncommand = ["python3"]\n[parallel]\ntp = 16\n')
    done = clusterctl_on(cluster, "submit", str(spec), "--run-dir", str(tmp_path / "run"), check=False)
    assert done.returncode in (5, 7) and "Traceback" not in done.stderr and "tp" in done.stderr
    assert not (tmp_path / "run").exists()
    assert cluster.run_on("ctl", ["squeue", "-h", "-o", "%i"]).stdout == before


def test_the_torchrun_style_uses_static_rendezvous_and_the_maps_node_ranks(cluster, tmp_path):
    # PyTorch is not installed on the testbed: tests/data/bin/torchrun models exactly what
    # torchrun's static rendezvous does to ranks (RANK = node_rank × nproc + local_rank).
    bin_dir = REPO / "tests" / "data" / "bin"
    spec = _spec(tmp_path, REORDERING.replace('name = "reorder"', 'name = "torchrun"')
                 .replace("[launch]", f'[launch]\nstyle = "torchrun"\nenv = {{PATH = "{bin_dir}:/usr/bin:/bin"}}'))
    run_dir = tmp_path / "run"
    job_id, summary = _submit(cluster, spec, run_dir)
    assert "--ntasks-per-node=1" in summary["sbatch_argv"]
    assert wait_job(cluster, job_id) == "COMPLETED", (run_dir / "logs" / f"{job_id}.out").read_text()
    rank_map, records = _ranks(run_dir, job_id)
    assert rank_map.slots == ("node1", "node3", "node2", "node4")
    _assert_every_rank_where_the_map_says(rank_map, records, (run_dir / "logs" / f"{job_id}.out").read_text())
