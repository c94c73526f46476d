"""The wheel, installed as a user would (not editable, a fresh virtualenv outside the checkout),
runs the example on the real Slurm testbed: submit, the in-job steps, every rank, status."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl_testbed import rootfs
from tests.conftest import REPO, wait_job

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def wheel_venv(testbed_session, tmp_path_factory) -> Path:
    """The virtualenv scripts/check-wheel.sh made (scripts/test.sh passes it on), or a new one; on a
    testbed that runs from a root filesystem, one made by that system's own python3 (3.11 on bookworm,
    3.13 on trixie, sid's newer one), as a user of that system would install the wheel."""
    if testbed_session.running().rootfs is not None:
        return _venv_of_the_root_filesystem(testbed_session, tmp_path_factory.mktemp("wheel"))
    given = os.environ.get("CLUSTERCTL_WHEEL_VENV")
    if given:
        return Path(given)
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    done = subprocess.run(["bash", str(REPO / "scripts" / "check-wheel.sh"), str(venv)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return venv


def _venv_of_the_root_filesystem(tb, work: Path) -> Path:
    # The wheel is built here (its build needs nothing of the target); the venv is made and the wheel
    # installed by the root filesystem's python3, chrooted into it with this machine's network (the
    # testbed's hosts reach no package index), and then used on the testbed's hosts.
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(work / "dist"), str(REPO)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next((work / "dist").glob("clusterctl-*.whl"))
    venv = work / "venv"
    root = Path(tb.running().rootfs)
    rootfs.run_in_root(root, REPO, ["python3", "-m", "venv", str(venv)], timeout=120)
    rootfs.run_in_root(root, REPO, [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                                    str(wheel)], timeout=600)
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
    # python, python3 or python3.N of that virtualenv: whichever name its scripts were installed with.
    assert re.search(rf"^python={re.escape(str(wheel_venv))}/bin/python[0-9.]*$", script, re.M), \
        "the job's in-job steps must run the wheel's Python"

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


def test_the_wheel_installs_into_the_login_hosts_own_python_not_the_checkout(cluster, wheel_venv):
    probe = ("import sys, clusterctl.launcher as l, clusterctl.healthd.cli; "
             "print('%d.%d' % sys.version_info[:2], l.__file__, sys.base_prefix)")
    version, where, base = cluster.run_on("ctl", [str(wheel_venv / "bin" / "python"), "-c", probe], env=user_env(),
                                          cwd=str(wheel_venv)).stdout.split()
    assert where.startswith(str(wheel_venv)) and not where.startswith(str(REPO)), where
    system = cluster.run_on("ctl", ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                            env=user_env()).stdout.strip()
    if cluster.running().rootfs is not None:
        assert version == system and base == "/usr", (version, system, base)  # that system's Python
    for script in ("clusterctl", "healthd"):
        assert cluster.run_on("ctl", [str(wheel_venv / "bin" / script), "--help"], env=user_env(),
                              check=False).returncode == 0, script
    for hook in ("clusterctl-prolog", "clusterctl-epilog", "clusterctl-healthcheck"):
        assert (wheel_venv / "bin" / hook).is_file(), hook
