"""Every rank checks it runs where the rank map says, and gets one consistent environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from clusterctl.launcher.job.steps import EXIT_PREFLIGHT, plan_for_job
from clusterctl.launcher.pure.preflight import (
    hostfile_lines, master_port, node_problems, placement_problems, rank_environment, torchrun_argv,
)
from clusterctl.launcher.pure.render import SlurmFacts
from clusterctl.launcher.shared.runs import create_run
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.login.submit import prepare
from clusterctl.records.rank_map import JobRankMap, RankMap, read_rank_map
from clusterctl.records.rank_record import read_rank_records
from clusterctl.slurm.commands import Completed, Slurm
from tests.conftest import REPO

MAP = JobRankMap("42", "node[1,3-4]", RankMap(("node3", "node1", "node4"), 8), 20042)


def test_the_map_places_every_rank_on_a_node_and_gpu():
    assert MAP.location(0) == ("node3", 0) and MAP.location(9) == ("node1", 1) and MAP.location(23) == ("node4", 7)


def test_a_rank_gets_torch_distributed_variables_from_the_map():
    assert rank_environment(MAP, 9) == {"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "24", "LOCAL_WORLD_SIZE": "8",
                                        "NODE_RANK": "1", "GROUP_RANK": "1", "MASTER_ADDR": "node3",
                                        "MASTER_PORT": "20042"}


def test_hostfiles_list_one_line_per_task_in_map_order():
    assert hostfile_lines(MAP, per_gpu=False) == ["node3", "node1", "node4"]
    assert hostfile_lines(MAP, per_gpu=True)[7:9] == ["node3", "node1"]


def test_the_master_port_is_the_specs_or_a_random_free_one_never_the_job_ids():
    assert master_port(29500) == 29500
    picks = {master_port(None) for _ in range(50)}
    assert len(picks) > 40 and all(20000 <= p < 32768 for p in picks)  # another user cannot guess it
    taken = {20000 + 5}
    picks_in_order = iter([5, 5, 9])
    assert master_port(None, randbelow=lambda n: next(picks_in_order), free=lambda p: p not in taken) == 20009


def test_the_job_picks_a_port_nobody_listens_on(tmp_path):
    import socket

    from clusterctl.launcher.job.steps import port_is_free
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        assert not port_is_free(held.getsockname()[1])


def test_a_w_resorted_launch_is_caught_on_the_first_rank():
    # srun -w node[1,3,4] would start task 0 on node1, where the map wants node3.
    problems = placement_problems(MAP, 0, "node1", 0, None)
    assert problems == ["rank 0 runs on node1 but the rank map puts it on node3 "
                        "(was srun given -w, or SLURM_HOSTFILE ignored?)"]


def test_tasks_out_of_gpu_order_are_caught():
    assert "is task 3 on its node but the map gives it GPU 1" in placement_problems(MAP, 9, "node1", 3, None)[0]


def test_a_rank_without_its_gpu_visible_is_caught():
    assert "needs local GPU 7 but only 4 are visible" in placement_problems(MAP, 7, "node3", 7, ["0", "1", "2", "3"])[0]


def test_a_rank_where_the_map_says_passes():
    assert placement_problems(MAP, 9, "node1", 1, [str(i) for i in range(8)]) == []


def test_a_rank_outside_the_map_is_caught():
    assert placement_problems(MAP, 24, "node4", 0, None) == ["rank 24 is outside the map's 24 ranks"]


def test_a_torchrun_node_on_the_wrong_host_is_caught():
    assert node_problems(MAP, 1, "node3") == ["node rank 1 runs on node3 but the rank map puts it on node1"]


@given(st.lists(st.sampled_from([f"n{i}" for i in range(12)]), min_size=1, max_size=6, unique=True),
       st.sampled_from([1, 2, 4, 8]))
def test_torchrun_ranks_equal_the_map_and_every_rank_passes_its_own_check(slots, gpn):
    rank_map = JobRankMap("7", "n[0-11]", RankMap(tuple(slots), gpn), 20007)
    for node_rank, node in enumerate(slots):
        argv = torchrun_argv(rank_map, node_rank, "/py", "/job", ["train"])
        assert f"--node-rank={node_rank}" in argv and "--rdzv-backend=static" in argv
        for local in range(gpn):
            rank = node_rank * gpn + local  # what torchrun's static rendezvous assigns
            assert rank_map.location(rank) == (node, local)
            assert placement_problems(rank_map, rank, node, local, None) == []
            env = rank_environment(rank_map, rank)
            assert env["MASTER_ADDR"] == slots[0] and env["LOCAL_RANK"] == str(local)


def _job_dir(tmp_path: Path) -> Path:
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    run = create_run(tmp_path / "run", spec, "")
    prepare(spec, SlurmFacts(), run_dir=str(run.path), python=sys.executable)
    topology = (REPO / "tests" / "data" / "slurm" / "scontrol-show-topology.txt").read_text()
    slurm = Slurm(lambda argv, timeout: Completed(0, topology, ""))
    job_dir = run.job_dir("42")
    plan_for_job(run.path, job_dir, {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-4]"}, slurm)
    return job_dir


def test_the_job_writes_its_map_for_the_nodes_slurm_gave(tmp_path):
    rank_map = read_rank_map(_job_dir(tmp_path))
    assert len(rank_map.slots) == 3 and rank_map.world_size == 24 and len(rank_map.unused_nodes) == 1
    assert rank_map.summary is not None
    assert rank_map.summary.leaf_crossing_groups <= rank_map.summary.slurm_order_leaf_crossing_groups


def test_the_hostfile_repeats_each_slot_once_per_gpu(tmp_path):
    job_dir = _job_dir(tmp_path)
    hostfile = (job_dir / "hostfile").read_text().split()
    assert hostfile == [n for n in read_rank_map(job_dir).slots for _ in range(8)]


def _rank(job_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    probe = "import json, os; print(json.dumps({k: os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'MASTER_ADDR')}))"
    return subprocess.run([sys.executable, "-m", "clusterctl.launcher.job", "rank", "--job-dir", str(job_dir), "--",
                           sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env}, cwd=REPO)


def test_a_rank_in_the_right_place_becomes_the_command_with_its_environment(tmp_path):
    job_dir = _job_dir(tmp_path)
    slots = read_rank_map(job_dir).slots
    done = _rank(job_dir, {"SLURM_PROCID": "10", "SLURM_LOCALID": "2", "SLURMD_NODENAME": slots[1]})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"RANK": "10", "LOCAL_RANK": "2", "MASTER_ADDR": slots[0]}


def test_a_rank_records_where_it_ran(tmp_path):
    job_dir = _job_dir(tmp_path)
    slots = read_rank_map(job_dir).slots
    assert _rank(job_dir, {"SLURM_PROCID": "10", "SLURM_LOCALID": "2", "SLURMD_NODENAME": slots[1]}).returncode == 0
    record = read_rank_records(job_dir)[10]
    assert (record.node, record.local_rank, record.slurm_procid) == (slots[1], 2, "10")


def test_a_rank_in_the_wrong_place_fails_the_job_with_a_clear_message(tmp_path):
    job_dir = _job_dir(tmp_path)
    slots = read_rank_map(job_dir).slots
    done = _rank(job_dir, {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURMD_NODENAME": slots[2]})
    assert done.returncode == EXIT_PREFLIGHT and done.stdout == ""
    assert f"clusterctl: preflight failed: rank 0 runs on {slots[2]} but the rank map puts it on {slots[0]}" \
        in done.stderr


def test_a_rank_without_a_map_says_the_plan_step_did_not_run(tmp_path):
    done = _rank(tmp_path, {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "node1"})
    assert done.returncode == 1 and "rankmap.idx is missing: the job's `plan` step did not run" in done.stderr


def test_a_run_directory_is_private_to_its_owner(tmp_path):
    import stat

    from clusterctl.launcher.shared.runs import create_run
    from clusterctl.launcher.pure.spec import parse_spec
    text = '[job]\nname = "t"\nnodes = 1\n[launch]\ncommand = ["x"]\n'
    run = create_run(tmp_path / "run", parse_spec(text, "job.toml", base_dir=tmp_path), text)
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o700  # its rank map (and port) unreadable by others
