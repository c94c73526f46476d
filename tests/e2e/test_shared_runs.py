"""Two users share a runs directory on the testbed: what the other user plants there cannot steer
the supervisor (issue 18).  The victim is root; the other user is `nobody`, with Slurm's own
sbatch and munge credentials."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from clusterctl.records.run_journal import read_run_journal
from tests.conftest import REPO, TEST_LAYOUT, shared_scratch

# CI time: another user's plants: their Slurm side is the supervisor's, which runs everywhere.
pytestmark = [pytest.mark.e2e, pytest.mark.one_release]

OTHER = "65534"  # nobody
FORGER = """
import json, subprocess, sys, time
shared = sys.argv[1]
end = time.time() + 170
while time.time() < end:
    text = subprocess.run(["squeue", "--json"], capture_output=True, text=True).stdout
    for state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        text = text.replace(f'"job_state": "{state}"', '"job_state": "COMPLETED"')
    entry = {"kind": "slurm-cache", "version": 1, "command": "squeue", "at": time.time(), "pid": 1, "text": text}
    for name in (".slurm-squeue.json", ".clusterctl-0/.slurm-squeue.json"):
        try:
            with open(f"{shared}/{name}.new", "w") as out:
                out.write(json.dumps(entry))
            import os; os.replace(f"{shared}/{name}.new", f"{shared}/{name}")
        except OSError:
            pass
    time.sleep(0.05)
"""


def as_other_user(cluster, argv: list[str]) -> subprocess.CompletedProcess:
    """Run argv on the login node as another user (setpriv drops root to `nobody`)."""
    prefix = [*cluster.enter("ctl", cwd="/tmp"), "setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups"]
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=60,
                          env=cluster.host_env(None))


def test_another_users_plants_in_a_shared_runs_directory_do_not_steer_the_supervisor(cluster):
    shared = Path(tempfile.mkdtemp(prefix="clusterctl-shared-runs-", dir=shared_scratch()))
    shared.chmod(0o1777)
    held = None
    forging: subprocess.Popen | None = None
    # On a real cluster every user reaches munged's socket; the testbed keeps its directory root-only.
    # Traverse only (0711): the key inside stays unreadable.
    os.chmod(TEST_LAYOUT.munge_dir, 0o711)
    try:
        # What the other user prepares before the victim submits: a fake "every job COMPLETED" answer
        # where supervisors used to share it, the lock they used to share (unreadable to others), the
        # victim's own cache directory (so it cannot make a private one), and a held job carrying the
        # comment the victim's first attempt will carry.
        fake = {"kind": "slurm-cache", "version": 1, "command": "squeue", "at": time.time() + 3600, "pid": 1,
                "text": json.dumps({"jobs": []})}
        planted = as_other_user(cluster, ["sh", "-c", f"""
            printf '%s' '{json.dumps(fake)}' > {shared}/.slurm-squeue.json &&
            : > {shared}/.slurm-squeue.lock && chmod 600 {shared}/.slurm-squeue.lock &&
            mkdir -m 777 {shared}/.clusterctl-0"""])
        assert planted.returncode == 0, planted.stderr
        # ...and keeps the shared answer fresh, with every job of the real queue shown as COMPLETED.
        forger = [*cluster.enter("ctl", cwd="/tmp"), "setpriv", f"--reuid={OTHER}", f"--regid={OTHER}",
                  "--clear-groups", "/usr/bin/python3", "-c", FORGER, str(shared)]
        forging = subprocess.Popen(forger, env=cluster.host_env(None), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        sbatch = as_other_user(cluster, ["sbatch", "--parsable", "--hold", "--comment=clusterctl:run:1:beef",
                                         "--output=/dev/null", "--wrap", "true"])
        assert sbatch.returncode == 0, sbatch.stderr
        held = sbatch.stdout.strip().split(";")[0]

        spec = shared / "job.toml"
        spec.write_text(f"""\
[job]
name = "shared"
nodes = 1
gpus_per_node = 8
[launch]
command = ["python3", "-c", "print('trained')"]
workdir = "{REPO / 'examples'}"
[parallel]
tp = 8
[restart]
poll_seconds = 0.5
""")
        argv = [*cluster.enter("ctl", cwd=str(REPO)), str(cluster.python), "-c",
                "from clusterctl.launcher.login.cli import main; main()", "submit", str(spec), "--run-dir",
                str(shared / "run"), "--supervise", "--job-records", str(TEST_LAYOUT.root / "job-health")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=cluster.host_env(None))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "waiting for job" not in done.stdout  # the other user's held job is not our live copy
        assert "PermissionError" not in done.stdout + done.stderr
        journal = read_run_journal(shared / "run" / "journal.jsonl")
        submitted = [e for e in journal.events if e.event == "submitted"]
        assert len(submitted) == 1 and submitted[0].job_id != held
        assert [e.event for e in journal.events][-1] == "done"
        assert (shared / "run").stat().st_mode & 0o777 == 0o700
        log = (shared / "run" / "logs" / f"{submitted[0].job_id}.out").read_text()
        assert "trained" in log  # it judged the real job's end, not the forged COMPLETED
    finally:
        if forging is not None:
            forging.kill()
            forging.wait()
        os.chmod(TEST_LAYOUT.munge_dir, 0o700)
        if held:
            cluster.run_on("ctl", ["scancel", held], check=False)
        shutil.rmtree(shared, ignore_errors=True)


def test_cancel_by_job_id_skips_a_run_another_user_planted_listing_our_jobs(cluster):
    """Issue 27: `nobody` plants a newer run whose journal lists two of root's jobs; root's
    `clusterctl cancel JOB` cancels only that job, through root's own run, and names the planted one."""
    from clusterctl.launcher.pure.spec import load_spec
    from clusterctl.launcher.shared.runs import create_run
    from clusterctl.records.run_journal import Submitted

    shared = Path(tempfile.mkdtemp(prefix="clusterctl-shared-runs-", dir=shared_scratch()))
    shared.chmod(0o1777)
    jobs: list[str] = []
    try:
        for _ in range(2):  # root's two jobs, held so they stay queued until cancelled
            held = cluster.run_on("ctl", ["sbatch", "--parsable", "--hold", "--output=/dev/null", "--wrap", "true"])
            jobs.append(held.stdout.strip().split(";")[0])
        mine, other = jobs
        spec = load_spec(REPO / "examples" / "toy_trainer.toml")
        for name, job_id in (("mine", mine), ("mine-too", other)):
            run = create_run(shared / name, spec, "")
            run.record(Submitted(at=run.now(), attempt=1, job_id=job_id))
        lines = "\n".join(json.dumps({"kind": "run-event", "version": 1, "event": "submitted", "at": time.time() + 3600,
                                      "attempt": n, "job_id": job_id}) for n, job_id in enumerate(jobs, start=1))
        planted = as_other_user(cluster, ["sh", "-c", f"""
            mkdir -m 755 {shared}/planted && printf '{{}}' > {shared}/planted/spec.json &&
            printf '%s\\n' '{lines}' > {shared}/planted/journal.jsonl"""])
        assert planted.returncode == 0, planted.stderr
        assert (shared / "planted").stat().st_uid == int(OTHER)

        env = {**os.environ, "CLUSTERCTL_RUNS": str(shared)}
        cli = [str(cluster.python), "-c", "from clusterctl.launcher.login.cli import main; main()"]
        status = cluster.run_on("ctl", [*cli, "status", mine], env=env, cwd=str(REPO), check=False)
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"{shared}/planted lists job {mine}" in status.stderr and f"owned by uid {OTHER}" in status.stderr
        done = cluster.run_on("ctl", [*cli, "cancel", mine], env=env, cwd=str(REPO), check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"cancelled {mine}; run {shared / 'mine'}" in done.stdout  # before: run .../planted, both jobs
        assert f"{shared}/planted lists job {mine}" in done.stderr
        queued = cluster.run_on("ctl", ["squeue", "-h", "-j", other, "-o", "%T"], check=False).stdout.strip()
        assert queued == "PENDING", f"root's other job {other} was cancelled through the planted run"
        assert [e.event for e in read_run_journal(shared / "mine-too" / "journal.jsonl").events][-1] == "submitted"
        assert [e.event for e in read_run_journal(shared / "mine" / "journal.jsonl").events][-1] == "cancelled"
    finally:
        if jobs:
            cluster.run_on("ctl", ["scancel", *jobs], check=False)
        shutil.rmtree(shared, ignore_errors=True)
