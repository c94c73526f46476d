"""The wheel, installed as a user would (not editable, a fresh virtualenv outside the checkout),
runs the example on the real Slurm testbed: submit, the in-job steps, every rank, status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_job

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """The virtualenv scripts/check-wheel.sh made (scripts/test.sh passes it on), or a new one."""
    given = os.environ.get("CLUSTERCTL_WHEEL_VENV")
    if given:
        return Path(given)
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    done = subprocess.run(["bash", str(REPO / "scripts" / "check-wheel.sh"), str(venv)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return venv


def user_env() -> dict[str, str]:
    """This process's environment without anything that points into the checkout or its .venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO)))
    return env


def test_the_installed_wheel_runs_the_example_on_slurm(cluster, wheel_venv, tmp_path):
    clusterctl = str(wheel_venv / "bin" / "clusterctl")
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    run_dir = tmp_path / "run"

    def from_the_wheel(*args: str):
        return cluster.run_on("ctl", [clusterctl, *args], cwd=str(tmp_path), env=user_env(), timeout=120)

    summary = json.loads(from_the_wheel("submit", "examples/toy_trainer.toml", "--run-dir", str(run_dir),
                                        "--json").stdout)
    script = Path(summary["sbatch_argv"][-1]).read_text()
    assert f"python={wheel_venv}/bin/python\n" in script, "the job's in-job steps must run the wheel's Python"

    job_id = summary["job_id"]
    log = run_dir / "logs" / f"{job_id}.out"
    assert wait_job(cluster, job_id) == "COMPLETED", log.read_text()
    rank_map = json.loads((run_dir / "jobs" / job_id / "rankmap.json").read_text())
    ranks = [json.loads(p.read_text()) for p in (run_dir / "jobs" / job_id / "ranks").glob("*.json")]
    assert sorted(r["rank"] for r in ranks) == list(range(24))
    assert all(r["hostname"] == rank_map["slots"][r["rank"] // 8] for r in ranks)
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text())["step"] == 60

    status = json.loads(from_the_wheel("status", str(run_dir), "--json").stdout)
    assert status["state"] == "COMPLETED"
