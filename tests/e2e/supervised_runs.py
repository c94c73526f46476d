"""What the end-to-end stories of a supervised run share: start `clusterctl submit --supervise` on the
testbed's login node, wait for what it does, read its journal, collect its output when it ends."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from clusterctl.records.run_journal import read_run_journal
from tests.conftest import REPO, TEST_LAYOUT

RECORDS = str(TEST_LAYOUT.root / "job-health")
SLURM_NOTICES = 0.0 if TEST_LAYOUT.timeouts == "fast" else 420.0
"""Extra seconds a run may take when it waits for Slurm to declare a dead node DOWN: under the production
timeouts (SlurmdTimeout=300, a ping every 100 s) up to ~400 s; on the fast testbed ~10 s (in the usual timeouts)."""


def journal_events(run_dir: Path, kind: str) -> list:
    """The run journal's events of one kind, oldest first."""
    return [e for e in read_run_journal(run_dir / "journal.jsonl").events if e.event == kind]


def wait_until(condition, what: str, timeout: float = 60, proc: subprocess.Popen | None = None) -> None:
    """Wait for `condition()`; fail saying `what` did not happen (or, with `proc`, what it printed if it ended)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s"
        time.sleep(0.1)


def squeue(cluster, *args: str) -> str:
    """`squeue -h ARGS` on the controller."""
    return cluster.run_on("ctl", ["squeue", "-h", *args], check=False).stdout.strip()


def supervised(cluster, tmp_path: Path, spec: Path) -> tuple[subprocess.Popen, Path]:
    """`clusterctl submit SPEC --supervise` on the login node, in the background; (the process, its run dir)."""
    run_dir = tmp_path / "run"
    argv = [*cluster.enter("ctl", cwd=str(REPO)), str(cluster.python), "-c",
            "from clusterctl.launcher.login.cli import main; main()", "submit", str(spec),
            "--run-dir", str(run_dir), "--supervise", "--job-records", RECORDS]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), run_dir


def finished(cluster, proc: subprocess.Popen, timeout: float = 180) -> str:
    """The supervisor's output once it ended the run successfully (the queue shown if it never ends)."""
    try:
        out, _ = proc.communicate(timeout=timeout + SLURM_NOTICES)
    except subprocess.TimeoutExpired:
        queue = squeue(cluster, "-o", "%i %j %T %N %R") + "\n" + cluster.run_on("ctl", ["sinfo", "-N", "-h"]).stdout
        proc.kill()
        raise AssertionError(f"the supervisor did not finish:\n{proc.communicate()[0]}\n{queue}") from None
    assert proc.returncode == 0, out
    return out
