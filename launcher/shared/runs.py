"""A run: one directory holding the spec, every attempt's job id and an append-only journal.

    <run>/spec.toml            the spec as written (for people)
    <run>/spec.json            the effective spec (overrides applied; what the job reads), kind `run-spec`
    <run>/journal.jsonl        typed events (clusterctl.records.run_journal): created, submitted, decided...
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from clusterctl.errors import ClusterctlError, OutputError, RunError
from clusterctl.files import atomic_write, check_owned
from clusterctl.launcher.pure.spec import JobSpec, spec_from_dict
from clusterctl.records.rank_map import JobRankMap, read_rank_map
from clusterctl.records.versioned import RecordError, check_header, header
from clusterctl.records.run_journal import Created, RunEvent, RunJournal, Submitted, append_run_event, read_run_journal


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
        """The run's effective spec; RunError without one, RecordError when this clusterctl cannot read it."""
        path = self.path / "spec.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise RunError(f"{self.path} is not a clusterctl run (no spec.json)") from None
        try:
            parsed = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise RecordError(str(path), f"not a readable JSON record ({exc.__class__.__name__})") from None
        return spec_from_document(parsed, str(path))

    def journal(self) -> RunJournal:
        """The journal's events and its unreadable lines (RecordError for an event this clusterctl cannot read)."""
        return read_run_journal(self.journal_path)

    def events(self) -> tuple[RunEvent, ...]:
        """The journal's events, oldest first."""
        return self.journal().events

    def now(self) -> float:
        """The time an event recorded now carries (the run's clock, to the millisecond)."""
        return round(self.clock(), 3)

    def record(self, event: RunEvent) -> RunEvent:
        """Append an event to the journal (durable when this returns); the event."""
        append_run_event(self.journal_path, event)
        return event

    def attempts(self) -> list[Attempt]:
        """Every submission, oldest first."""
        return attempts_of(self.events())

    def write_attempt_script(self, attempt: int, script: str) -> Path:
        path = self.path / "attempts" / str(attempt) / "job.sbatch"
        atomic_write(path, script)
        path.chmod(0o755)
        return path

    def log_path(self, job_id: str) -> Path:
        """Where Slurm writes the output of job `job_id`."""
        return log_path(self.path, job_id)

    def job_dir(self, job_id: str) -> Path:
        """Where job `job_id` keeps its rank map, hostfile and rank records."""
        return self.path / "jobs" / job_id

    def rank_maps(self, job_ids: Sequence[str]) -> dict[str, JobRankMap]:
        """The rank maps the jobs wrote, by job id (a job that wrote none, e.g. still queued, is absent).

        RecordError when a map is damaged or from a newer clusterctl.
        """
        maps = {}
        for job_id in job_ids:
            try:
                maps[job_id] = read_rank_map(self.job_dir(job_id))
            except FileNotFoundError:
                continue
        return maps

    def check_owned(self, uid: int | None = None) -> None:
        """RunError unless this user owns the run directory, its spec and journal, and nobody else can write them.

        A supervisor acts on what these files say (cancel, resubmit, blame): in a shared runs
        directory it must not act on a run, or a journal, that another user could have written.
        """
        uid = os.getuid() if uid is None else uid
        expected: tuple[tuple[Path, Literal["file", "directory"]], ...] = (
            (self.path, "directory"), (self.path / "spec.json", "file"), (self.journal_path, "file"))
        for path, kind in expected:
            try:
                problem = check_owned(path, uid=uid, kind=kind)
            except FileNotFoundError:
                continue
            if problem is not None:
                raise RunError(f"{path}: {problem}; only its owner may supervise this run (uid {uid} asked), and "
                               f"nobody else may write it (its owner can fix the mode: chmod go-w {path})")

    def lock(self) -> int:
        """Hold the run's lock (one supervisor per run) until the process exits; the fd."""
        try:
            fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise RunError(f"{self.path / '.lock'}: cannot open the run's lock ({exc.strerror}); another user "
                           "made it or it is a symlink: only the run's owner may supervise it") from None
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


def log_path(run_path: Path, job_id: str) -> Path:
    """Where Slurm writes the output of job `job_id` of the run at `run_path` (sbatch --output)."""
    return run_path / "logs" / f"{job_id}.out"


SPEC_KIND = "run-spec"
SPEC_VERSION = 1


def spec_document(spec: JobSpec) -> dict[str, Any]:
    """spec.json's JSON: the spec as `JobSpec.to_dict` gives it, under a kind and version header."""
    return {**header(SPEC_KIND, SPEC_VERSION), **spec.to_dict()}


def spec_from_document(data: object, where: str) -> JobSpec:
    """Read spec.json's JSON back; RecordError for a newer or damaged one.

    A spec.json from before the header (no `kind`) holds the same fields and is read as version 1.
    """
    if isinstance(data, Mapping) and "kind" not in data and "version" not in data:
        body: Mapping[str, Any] = data
    else:
        body = check_header(data, SPEC_KIND, SPEC_VERSION, where)
    try:
        return spec_from_dict({key: value for key, value in body.items() if key not in ("kind", "version")})
    except (KeyError, TypeError, ValueError, AttributeError, ClusterctlError) as exc:
        raise RecordError(where, f"not a run spec this clusterctl can read ({exc.__class__.__name__}: {exc})") from None


def run_dir_name(name: str, now: float) -> str:
    """<job name made path-safe>-<UTC timestamp>."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"
    return f"{safe[:60]}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}"


def create_run(path: Path, spec: JobSpec, spec_text: str) -> RunDir:
    """Make the run directory (it must not exist) with its spec files and a `created` event."""
    check_new_run_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{path.parent}: cannot make the runs directory ({exc.strerror}); pass another --run-dir "
                          "or set job.runs_dir") from None
    try:
        # Private to its owner: the journal steers a supervisor, the rank map names the rendezvous
        # port, spec and logs may hold secrets.  (The job runs as the same user.)
        path.mkdir(mode=0o700)
    except FileExistsError:
        raise RunError(f"{path} already exists; pass another --run-dir or let clusterctl name it") from None
    except OSError as exc:
        raise OutputError(f"{path}: cannot make the run directory ({exc.strerror}); pass another --run-dir") from None
    for sub in ("logs", "jobs", "attempts"):
        (path / sub).mkdir()
    # Only the owner reads the spec back (the job runs as the same user): it may hold secrets
    # (restart.webhook, [launch] env values), so it is not left world-readable.
    atomic_write(path / "spec.toml", spec_text, mode=0o600)
    atomic_write(path / "spec.json", json.dumps(spec_document(spec), indent=2, sort_keys=True) + "\n", mode=0o600)
    run = RunDir(path)
    run.record(Created(at=run.now(), name=spec.job.name, source=spec.source))
    return run


def check_new_run_path(path: Path) -> None:
    """RunError/OutputError unless a run directory can be made at `path` (checked before `--dry-run` shows it).

    It must not exist, and its nearest existing ancestor must be a directory this user may write.
    """
    if path.exists() or path.is_symlink():
        raise RunError(f"{path} already exists; pass another --run-dir or let clusterctl name it")
    ancestor = path.parent
    while not ancestor.exists():
        if ancestor.is_symlink():
            break
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"{path}: {ancestor} is not a directory; pass another --run-dir")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: {ancestor} is not writable by this user; pass another --run-dir")


def attempts_of(events: Sequence[RunEvent]) -> list[Attempt]:
    """The attempts a journal's `submitted` events name, oldest first."""
    return [Attempt(e.attempt, e.job_id, e.at, e.resume_from, e.exclude) for e in events if isinstance(e, Submitted)]


def unique_run_path(root: Path, name: str, now: float) -> Path:
    """A run path under `root` that does not exist yet."""
    base = root / run_dir_name(name, now)
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def find_run_of_job(runs_root: Path, job_id: str) -> RunDir | None:
    """The newest run under `runs_root` that submitted `job_id` (ids restart on a fresh cluster)."""
    found: list[tuple[float, RunDir]] = []
    for journal in runs_root.glob("*/journal.jsonl"):
        run = RunDir(journal.parent)
        try:
            attempts = run.attempts()
        except (RecordError, OSError):
            continue  # a damaged or foreign run must not hide every other run's jobs
        for attempt in attempts:
            if attempt.job_id == job_id:
                found.append((attempt.submitted_at, run))
    return max(found, key=lambda item: item[0])[1] if found else None


def list_runs(runs_root: Path, limit: int = 20) -> list[RunDir]:
    """The newest runs under `runs_root`."""
    runs = [RunDir(p.parent) for p in runs_root.glob("*/spec.json")]
    runs.sort(key=lambda r: r.journal_path.stat().st_mtime if r.journal_path.exists() else 0, reverse=True)
    return runs[:limit]
