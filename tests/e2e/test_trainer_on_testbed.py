"""The example trainer across nodes through Slurm: a killed node, then a resume, loses nothing."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_job

pytestmark = pytest.mark.e2e

SBATCH = str(REPO / "examples" / "toy_trainer.sbatch")
TRAINER_ARGS = ["--steps", "60", "--checkpoint-every", "10", "--peer-timeout", "10"]


def _sbatch(cluster, out: Path, *args: str) -> str:
    # One attempt per submission: Slurm's own requeue after NODE_FAIL would blur what each run did.
    return cluster.run_on("ctl", ["sbatch", "--parsable", "--no-requeue", "-o", str(out), *args],
                          cwd=str(REPO)).stdout.strip()


def test_killed_node_then_resume_gives_the_uninterrupted_final_state(cluster, tmp_path):
    # Uninterrupted reference run on two nodes.
    ref = tmp_path / "reference"
    job = _sbatch(cluster, tmp_path / "ref.out", "-N2", "--ntasks-per-node=4", SBATCH, str(ref),
                  *TRAINER_ARGS, "--step-time", "0.01")
    assert wait_job(cluster, job) == "COMPLETED", (tmp_path / "ref.out").read_text()
    reference = json.loads((ref / "final.json").read_text())
    assert reference["step"] == 60 and reference["world_size"] == 8

    # The same run, with one of its nodes killed after the second checkpoint.
    ckpt = tmp_path / "interrupted"
    job = _sbatch(cluster, tmp_path / "a.out", "-N2", "-w", "node1,node2", "--ntasks-per-node=4", SBATCH,
                  str(ckpt), *TRAINER_ARGS, "--step-time", "0.1")
    deadline = time.monotonic() + 60
    while not (ckpt / "step-00000020").exists():
        assert time.monotonic() < deadline, (tmp_path / "a.out").read_text()
        time.sleep(0.1)
    cluster.kill_node("node2")
    assert wait_job(cluster, job) in ("NODE_FAIL", "FAILED")
    assert not (ckpt / "final.json").exists()

    # Resume on healthy nodes, the dead one excluded, from the last complete checkpoint.
    job = _sbatch(cluster, tmp_path / "b.out", "-N2", "-x", "node2", "--ntasks-per-node=4", SBATCH, str(ckpt),
                  *TRAINER_ARGS, "--step-time", "0.01")
    assert wait_job(cluster, job) == "COMPLETED", (tmp_path / "b.out").read_text()
    resumed = re.search(r"resumed from \S+/step-(\d+)", (tmp_path / "b.out").read_text())
    assert resumed and int(resumed.group(1)) >= 20, "must resume from the last complete checkpoint"
    assert json.loads((ckpt / "final.json").read_text()) == reference


def test_ranks_fail_like_cuda_when_their_gpu_is_lost(cluster, tmp_path):
    from clusterctl_testbed.gpu_faults import Fault, inject

    ckpt = tmp_path / "ck"
    job = _sbatch(cluster, tmp_path / "out", "-N1", "-w", "node3", "--ntasks-per-node=8", SBATCH, str(ckpt),
                  "--steps", "600", "--step-time", "0.05", "--peer-timeout", "5")
    deadline = time.monotonic() + 60
    while not (ckpt / "step-00000010").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    inject(cluster.nvml_dir("node3"), Fault("gpu-lost", gpu=6))
    assert wait_job(cluster, job) == "FAILED"
    log = (tmp_path / "out").read_text()
    assert "CUDA error: GPU 6 is lost (NVML_ERROR_GPU_IS_LOST)" in log
