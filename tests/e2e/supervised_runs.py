"""What the end-to-end stories of a supervised run share: start `clusterctl submit --supervise` on the
testbed's login node, wait for what it does, read its journal, collect its output when it ends."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
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


def wait_for_agent_status(cluster, run_dir: Path, proc: subprocess.Popen, shows: Callable[[dict], bool], what: str,
                          timeout: float = 150) -> dict:
    """Read `clusterctl status RUN --json` on the login node until `shows(its agent part)` holds; that agent part
    (the last status read is shown when it never does)."""
    from tests.conftest import clusterctl_on

    looked: list[dict] = []

    def shown() -> bool:
        if not (run_dir / "journal.jsonl").exists():  # the supervisor has not made the run directory yet
            return False
        looked[-1:] = [json.loads(clusterctl_on(cluster, "status", str(run_dir), "--json").stdout)]
        return shows(looked[-1].get("agent") or {})

    try:
        wait_until(shown, what, timeout=timeout, proc=proc)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe last status --json: {json.dumps(looked[-1:], indent=1)}") from None
    return looked[-1]["agent"]
