"""The supervisor kept alive by Slurm: its sbatch script is exact (golden), shellcheck-clean, inert for
any run path, and keeps `clusterctl supervise` running until the run is over."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from clusterctl.launcher.pure.supervisor_job import supervisor_job
from tests.golden import assert_golden


def test_the_supervisor_job_script_and_argv_match_golden():
    request = supervisor_job("/runs/llm-1", "/venv/bin/python", "/var/lib/clusterctl/job-health", partition="gpu",
                             account="ml")
    assert request.argv[-1] == "/runs/llm-1/supervisor.sbatch"
    assert "--requeue" in request.argv and "--partition=gpu" in request.argv and "--account=ml" in request.argv
    assert_golden("supervisor/supervisor.sbatch", request.script)


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is installed by scripts/setup.sh")
def test_the_supervisor_job_script_passes_shellcheck_for_a_hostile_run_path(tmp_path):
    path = tmp_path / "supervisor.sbatch"
    path.write_text(supervisor_job("/runs/$(touch x)/`y`'", "/venv/bin/py thon", "/r; rm -rf /").script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    checked = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def _run_script(tmp_path: Path, exits: list[int]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the script with a stand-in Python that exits with `exits` in turn and notes its environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "exits").write_text("\n".join(map(str, exits)) + "\n")
    python = bin_dir / "python"
    python.write_text(f"""#!/bin/bash
code=$(head -n1 {tmp_path}/exits); sed -i 1d {tmp_path}/exits
echo "supervise ${{SLURM_CPUS_PER_TASK:-unset}} ${{SLURM_CONF:-unset}} $*" >> {tmp_path}/calls
exit "$code"
""")
    (bin_dir / "sleep").write_text("#!/bin/bash\nexit 0\n")
    for tool in (python, bin_dir / "sleep"):
        tool.chmod(0o755)
    run_dir = tmp_path / "run dir"
    script = tmp_path / "supervisor.sbatch"
    script.write_text(supervisor_job(str(run_dir), str(python), "/records").script)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77", "SLURM_CPUS_PER_TASK": "1",
           "SLURM_CONF": "/etc/slurm/slurm.conf"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    return done, (tmp_path / "calls").read_text().splitlines()


def test_a_killed_supervisor_is_started_again_until_the_run_is_over(tmp_path):
    done, calls = _run_script(tmp_path, [137, 70, 9, 0])
    assert done.returncode == 0, done.stderr
    assert len(calls) == 4
    # The job's own Slurm settings are not passed on to the jobs it submits; the site's SLURM_CONF is.
    assert calls[0].startswith("supervise unset /etc/slurm/slurm.conf -c ")
    assert calls[0].endswith(f"supervise {tmp_path / 'run dir'} --job-records /records")
    assert "the supervisor exited 137; starting it again" in done.stdout


def test_a_supervisor_that_cannot_start_at_all_gives_up_instead_of_looping_forever(tmp_path):
    done, calls = _run_script(tmp_path, [70] * 12)
    assert done.returncode == 1 and len(calls) == 10
    assert "failed 10 times in a row within a minute (exit 70); giving up" in done.stdout
