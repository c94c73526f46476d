"""Parsers for Slurm's job reports (`squeue --json`, `sacct --json`, `sbatch --parsable`).

Pure functions on text; the recorded outputs of the testbed's real Slurm 22.05 are their
unit-test data.  Notes on 22.05 relied on: `squeue --json` ignores `--jobs` and lists every
job slurmctld still holds (finished ones for MinJobAge, 300 s by default), so one call
answers for all supervised jobs; its `exit_code` is a wait status (768 = exit 3).  The
accounting record from `sacct --json` can lag the controller by seconds (a running job may
still read PENDING, a failed one exit 0), so live state comes from squeue first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from clusterctl.errors import SlurmCommandError

TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                             "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})


@dataclass(frozen=True)
class StepReport:
    """One step of a finished job (from accounting)."""

    step: str
    name: str
    state: str
    exit_code: int | None
    signal: int | None
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class JobReport:
    """What Slurm says about one job."""

    job_id: str
    name: str
    state: str
    reason: str
    nodes: str
    exit_code: int | None
    signal: int | None
    submit_time: float
    start_time: float
    end_time: float
    restarts: int = 0
    steps: tuple[StepReport, ...] = ()
    source: str = "squeue"
    comment: str = ""

    @property
    def terminal(self) -> bool:
        """Slurm is done with the job (it will not run again unless resubmitted)."""
        return self.state in TERMINAL_STATES


def _load(text: str, argv: list[str]) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmCommandError(argv, 0, f"output is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise SlurmCommandError(argv, 0, "JSON output has no `jobs` list")
    return data


def _time(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def parse_squeue_json(text: str) -> dict[str, JobReport]:
    """`squeue --json` → job id → report (every job slurmctld still holds)."""
    jobs: dict[str, JobReport] = {}
    for job in _load(text, ["squeue", "--json"])["jobs"]:
        status = job.get("exit_code")
        exit_code = signal = None
        if isinstance(status, int) and job.get("job_state") in TERMINAL_STATES:
            exit_code, signal = (status >> 8) & 0xFF, (status & 0x7F) or None
        job_id = str(job["job_id"])
        jobs[job_id] = JobReport(job_id, str(job.get("name", "")), str(job.get("job_state", "UNKNOWN")),
                                 str(job.get("state_reason", "")), str(job.get("nodes") or ""), exit_code, signal,
                                 _time(job.get("submit_time")), _time(job.get("start_time")),
                                 _time(job.get("end_time")), int(job.get("restart_cnt") or 0),
                                 comment=str(job.get("comment") or ""))
    return jobs


def _exit(value: object) -> tuple[int | None, int | None]:
    if not isinstance(value, dict):
        return None, None
    signal = value.get("signal", {})
    return (value.get("return_code") if isinstance(value.get("return_code"), int) else None,
            signal.get("signal_id") if isinstance(signal, dict) else None)


def parse_sacct_json(text: str) -> dict[str, JobReport]:
    """`sacct --json -j ...` → job id → report with its steps."""
    jobs: dict[str, JobReport] = {}
    for job in _load(text, ["sacct", "--json"])["jobs"]:
        state = job.get("state", {})
        times = job.get("time", {})
        exit_code, signal = _exit(job.get("exit_code"))
        steps = []
        for step in job.get("steps", []):
            ident = step.get("step", {})
            step_code, step_signal = _exit(step.get("exit_code"))
            nodes = step.get("nodes", {})
            steps.append(StepReport(str(ident.get("id", "")), str(ident.get("name", "")), str(step.get("state", "")),
                                    step_code, step_signal,
                                    tuple(nodes.get("list", [])) if isinstance(nodes, dict) else ()))
        job_id = str(job["job_id"])
        comment = job.get("comment")
        report = JobReport(job_id, str(job.get("name", "")), str(state.get("current", "UNKNOWN")),
                           str(state.get("reason", "")), str(job.get("nodes") or ""), exit_code, signal,
                           _time(times.get("submission")), _time(times.get("start")), _time(times.get("end")),
                           0, tuple(steps), "sacct",
                           str(comment.get("job") or "") if isinstance(comment, dict) else str(comment or ""))
        # A fresh cluster reuses job ids: keep the newest submission of each id.
        if job_id not in jobs or report.submit_time >= jobs[job_id].submit_time:
            jobs[job_id] = report
    return jobs


def parse_sbatch_parsable(text: str) -> str:
    """`sbatch --parsable` prints `<job id>[;<cluster>]`."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    job_id = first.split(";")[0].strip()
    if not job_id.isdigit():
        raise SlurmCommandError(["sbatch", "--parsable"], 0, f"unexpected output {text.strip()!r}")
    return job_id
