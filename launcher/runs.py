"""A run: one directory holding the spec, every attempt's job id and an append-only journal.

    <run>/spec.toml            the spec as written (for people)
    <run>/spec.json            the effective spec (overrides applied; what the job reads)
    <run>/journal.jsonl        events: created, submitted, and the supervisor's decisions
    <run>/attempts/<n>/        job.sbatch of attempt n
    <run>/jobs/<job id>/       rankmap.json, hostfile, ranks/<rank>.json (written in the job)
    <run>/logs/<job id>.out    the job's output
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import RunError
from clusterctl.files import append_json_line, atomic_write, read_json_lines
from clusterctl.launcher.spec import JobSpec, spec_from_dict


@dataclass(frozen=True)
class Attempt:
    """One submission of the run."""

    number: int
    job_id: str
    submitted_at: float
    resume_from: str | None
    exclude: str | None


class RunDir:
    """Read and append to a run directory."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock

    @property
    def journal_path(self) -> Path:
        return self.path / "journal.jsonl"

    def exists(self) -> bool:
        return (self.path / "spec.json").is_file()

    def spec(self) -> JobSpec:
        try:
            return spec_from_dict(json.loads((self.path / "spec.json").read_text()))
        except FileNotFoundError:
            raise RunError(f"{self.path} is not a clusterctl run (no spec.json)") from None

    def events(self) -> list[dict]:
        return list(read_json_lines(self.journal_path).records)

    def record(self, event: str, **fields: object) -> dict:
        """Append an event to the journal (durable when this returns)."""
        entry = {"event": event, "at": round(self.clock(), 3), **fields}
        append_json_line(self.journal_path, entry)
        return entry

    def attempts(self) -> list[Attempt]:
        return [Attempt(e["attempt"], str(e["job_id"]), e["at"], e.get("resume_from"), e.get("exclude"))
                for e in self.events() if e["event"] == "submitted"]

    def write_attempt_script(self, attempt: int, script: str) -> Path:
        path = self.path / "attempts" / str(attempt) / "job.sbatch"
        atomic_write(path, script)
        path.chmod(0o755)
        return path

    def log_path(self, job_id: str) -> Path:
        return self.path / "logs" / f"{job_id}.out"

    def job_dir(self, job_id: str) -> Path:
        return self.path / "jobs" / job_id

    def lock(self) -> int:
        """Hold the run's lock (one supervisor per run) until the process exits; the fd."""
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = (self.path / ".lock").read_text().strip() or "another process"
            raise RunError(f"{self.path} is already supervised by {holder}; stop it first or watch with "
                           "`clusterctl status`") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode())
        return fd


def run_dir_name(name: str, now: float) -> str:
    """<job name made path-safe>-<UTC timestamp>."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"
    return f"{safe[:60]}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}"


def create_run(path: Path, spec: JobSpec, spec_text: str) -> RunDir:
    """Make the run directory (it must not exist) with its spec files and a `created` event."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        raise RunError(f"{path} already exists; pass another --run-dir or let clusterctl name it") from None
    for sub in ("logs", "jobs", "attempts"):
        (path / sub).mkdir()
    atomic_write(path / "spec.toml", spec_text)
    atomic_write(path / "spec.json", json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n")
    run = RunDir(path)
    run.record("created", name=spec.job.name, source=spec.source)
    return run


def unique_run_path(root: Path, name: str, now: float) -> Path:
    """A run path under `root` that does not exist yet."""
    base = root / run_dir_name(name, now)
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate
