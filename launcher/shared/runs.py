"""A run: one directory holding the spec, every attempt's job id and an append-only journal.

    <run>/spec.toml            the spec as written (for people)
    <run>/spec.json            the effective spec (overrides applied; what the job reads): clusterctl.records.run_spec
    <run>/journal.jsonl        typed events (clusterctl.records.run_journal): created, submitted, decided...
    <run>/attempts/<n>/        job.sbatch of attempt n, and experiment.json: what it ran (resolved spec, command,
                               code and data versions, clusterctl's version; clusterctl.records.experiment_record)
    <run>/jobs/<job id>/       rankmap.json, hostfile, ranks/<rank>.json (written in the job)
    <run>/logs/<job id>.out    the job's output
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from clusterctl.errors import ClusterctlError, OutputError, RunError
from clusterctl.files import atomic_write, check_owned
from clusterctl.launcher.pure.spec import JobSpec, spec_from_dict
from clusterctl.records.rank_map import JobRankMap, read_rank_map
from clusterctl.records.run_spec import FILE_NAME as SPEC_FILE
from clusterctl.records.run_spec import RunSpecRecord, read_run_spec, run_spec_path, write_run_spec
from clusterctl.records.versioned import RecordError
from clusterctl.records.run_journal import (
    Created, RunEvent, RunJournal, Submitted, append_run_event, event_from_json, read_run_journal,
)


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
        return run_spec_path(self.path).is_file()

    def spec(self) -> JobSpec:
        """The run's effective spec; RunError without one, RecordError when this clusterctl cannot read it."""
        try:
            record = read_run_spec(self.path)
        except FileNotFoundError:
            raise RunError(f"{self.path} is not a clusterctl run (no spec.json)") from None
        return spec_from_record(record, str(run_spec_path(self.path)))

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

    def attempt_dir(self, attempt: int) -> Path:
        """Where attempt `attempt` keeps its job script and experiment record."""
        return self.path / "attempts" / str(attempt)

    def write_attempt_script(self, attempt: int, script: str) -> Path:
        path = self.attempt_dir(attempt) / "job.sbatch"
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

    def ownership_problem(self, uid: int | None = None) -> str | None:
        """Why this run is not `uid`'s alone (`<path>: <rule broken>`); None when it is.

        The run directory, its spec and its journal must be real, owned by `uid` (default: this
        user) and writable by nobody else (`clusterctl.files.check_owned`); a missing spec or
        journal is no objection (a run being made).
        """
        uid = os.getuid() if uid is None else uid
        expected: tuple[tuple[Path, Literal["file", "directory"]], ...] = (
            (self.path, "directory"), (run_spec_path(self.path), "file"), (self.journal_path, "file"))
        for path, kind in expected:
            try:
                problem = check_owned(path, uid=uid, kind=kind)
            except FileNotFoundError:
                continue
            if problem is not None:
                return f"{path}: {problem}"
        return None

    def check_owned(self, uid: int | None = None) -> None:
        """RunError unless this user owns the run directory, its spec and journal, and nobody else can write them.

        A supervisor (and `cancel`) acts on what these files say (cancel, resubmit, blame): in a
        shared runs directory it must not act on a run, or a journal, that another user could have written.
        """
        uid = os.getuid() if uid is None else uid
        problem = self.ownership_problem(uid)
        if problem is not None:
            path = problem.split(": ", 1)[0]
            raise RunError(f"{problem}; only its owner may supervise or cancel this run (uid {uid} asked), and "
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


def spec_document(spec: JobSpec) -> dict[str, Any]:
    """spec.json's JSON (clusterctl.records.run_spec): the spec as `JobSpec.to_dict` gives it, under its header."""
    return RunSpecRecord(spec.to_dict()).to_json()


def spec_from_document(data: object, where: str) -> JobSpec:
    """Read spec.json's JSON back; RecordError for a newer or damaged one (a spec.json from before the
    header is read as version 1)."""
    return spec_from_record(RunSpecRecord.from_json(data, where), where)


def spec_from_record(record: RunSpecRecord, where: str) -> JobSpec:
    """The spec a run-spec record holds; RecordError naming `where` when its fields are not a spec."""
    try:
        return spec_from_dict(dict(record.spec))
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
    write_run_spec(path, RunSpecRecord(spec.to_dict()))
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


FOREIGN_JOURNAL_MAX_BYTES = 16 << 20
"""Another user's journal is read (to name it when it lists the job asked about) only up to this size."""


def _foreign_run_lists_job(run: RunDir, job_id: str) -> bool:
    """Whether another user's run journals a submission of `job_id`: read without following a
    symlink, without blocking on a FIFO and only up to FOREIGN_JOURNAL_MAX_BYTES (it is never acted on)."""
    try:
        fd = os.open(run.journal_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > FOREIGN_JOURNAL_MAX_BYTES:
            return False
        with os.fdopen(os.dup(fd), "rb") as journal:
            data = journal.read(FOREIGN_JOURNAL_MAX_BYTES + 1)
    except OSError:
        return False
    finally:
        os.close(fd)
    for line in data.splitlines():
        try:
            event = event_from_json(json.loads(line.decode("utf-8")), str(run.journal_path))
        except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError, RecursionError, RecordError):
            continue  # another user's text: whatever it holds, it only fails to name the job
        if isinstance(event, Submitted) and event.job_id == job_id:
            return True
    return False


def _run_dirs(runs_root: Path, marker: str) -> list[RunDir]:
    """The directories under `runs_root` holding `marker` (symlinked ones too: ownership is checked by lstat)."""
    return sorted((RunDir(entry.parent) for entry in runs_root.glob(f"*/{marker}")), key=lambda run: run.path)


def find_run_of_job(runs_root: Path, job_id: str, *, uid: int | None = None,
                    say: Callable[[str], None] = lambda note: None) -> RunDir | None:
    """The newest run of user `uid` (default: this user) under `runs_root` that submitted `job_id`
    (ids restart on a fresh cluster).

    Only runs the user owns count (`RunDir.ownership_problem`, the one rule): in a shared runs
    directory another user can plant a run whose journal lists this user's job ids, and `cancel`
    would then cancel the jobs it lists, as this user.  Such a run that lists `job_id` is named
    through `say` and skipped; a damaged run of the user's is skipped too (it must not hide the others).
    """
    uid = os.getuid() if uid is None else uid
    found: list[tuple[float, RunDir]] = []
    for run in _run_dirs(runs_root, "journal.jsonl"):
        try:
            problem = run.ownership_problem(uid)
        except OSError:
            continue  # gone, or a place this user cannot look into
        if problem is not None:
            if _foreign_run_lists_job(run, job_id):
                say(f"note: {run.path} lists job {job_id} but is not this user's run ({problem}): skipped; "
                    f"only runs owned by uid {uid} and writable by nobody else are looked up")
            continue
        try:
            attempts = run.attempts()
        except (RecordError, OSError):
            continue  # a damaged run must not hide every other run's jobs
        for attempt in attempts:
            if attempt.job_id == job_id:
                found.append((attempt.submitted_at, run))
    return max(found, key=lambda item: item[0])[1] if found else None


def list_runs(runs_root: Path, limit: int = 20, *, uid: int | None = None,
              say: Callable[[str], None] = lambda note: None) -> list[RunDir]:
    """The newest runs of user `uid` (default: this user) under `runs_root`.

    Runs of other users (or that others may write) are left out, with one note through `say`
    counting them: their journals are not this user's to read or act on.
    """
    uid = os.getuid() if uid is None else uid
    runs, others = [], 0
    for run in _run_dirs(runs_root, SPEC_FILE):
        try:
            problem = run.ownership_problem(uid)
        except OSError:
            problem = "cannot be looked into"
        if problem is None:
            runs.append(run)
        else:
            others += 1
    if others:
        say(f"note: {others} run(s) under {runs_root} are not this user's (another owner, or writable by others): "
            "not shown")
    runs.sort(key=lambda r: r.journal_path.stat().st_mtime if r.journal_path.exists() else 0, reverse=True)
    return runs[:limit]
