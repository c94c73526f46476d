"""The Slurm hooks run by hand: help, version, or a refusal outside a job; never the hook itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clusterctl import package_version


def _hook(part: str, *args: str, job: str | None = None, tmp_path=None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    if job is not None:
        env["SLURM_JOB_ID"] = job
    code = f"import sys; from clusterctl.{part}.hook import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, env=env,
                          cwd=tmp_path)


@pytest.mark.parametrize("part", ["prolog", "epilog"])
@pytest.mark.parametrize("job", [None, "41"])
def test_help_prints_help_and_runs_nothing(part, job, tmp_path):
    done = _hook(part, "--help", job=job, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"usage: clusterctl-{part}" in done.stdout
    assert f"{part.capitalize()}=" in done.stdout  # how to install it
    assert done.stderr == ""  # a hook that ran says so on stderr (slurmd's log)


@pytest.mark.parametrize("part", ["prolog", "epilog"])
def test_version_says_the_package_version(part, tmp_path):
    done = _hook(part, "--version", job="41", tmp_path=tmp_path)
    assert done.returncode == 0
    assert done.stdout.strip() == f"clusterctl-{part} (clusterctl {package_version()})"


@pytest.mark.parametrize("part", ["prolog", "epilog"])
def test_outside_a_job_it_refuses_and_says_how_it_is_called(part, tmp_path):
    done = _hook(part, tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert f"clusterctl-{part}: not inside a Slurm job (no SLURM_JOB_ID): nothing done" in done.stderr
    assert f"{part.capitalize()}=" in done.stderr and "slurm.conf" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("part", ["prolog", "epilog"])
def test_an_unknown_argument_is_a_usage_error(part, tmp_path):
    done = _hook(part, "--drain-everything", job="41", tmp_path=tmp_path)
    assert done.returncode == 2
    assert "unrecognized arguments: --drain-everything" in done.stderr
