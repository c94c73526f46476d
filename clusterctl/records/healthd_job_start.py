"""The prolog's note that a job started on this node (`<journal_dir>/jobs/<job>.json`).

Written by the prolog when it lets a job in; read by the epilog of the same job, which
judges only what happened after that moment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import RecordError, check_header, field, header, number_field, read_json_record

KIND = "healthd-job-start"
VERSION = 1


@dataclass(frozen=True)
class JobStart:
    """When a job's prolog ran here, and which GPUs the job was given (None: all, or unknown)."""

    job_id: str
    start: float  # seconds since the epoch
    gpus: tuple[int, ...] | None = None
    uid: int | None = None
    """The job's user (SLURM_JOB_UID), when the prolog was told; older notes have none."""

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "job": self.job_id, "start": self.start,
                "gpus": list(self.gpus) if self.gpus is not None else None, "uid": self.uid}

    @classmethod
    def from_json(cls, data: object, where: str) -> JobStart:
        """Parse a stored record; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        gpus = field(body, "gpus", (list, type(None)), where)
        if gpus is not None and not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            raise RecordError(where, "field `gpus` must list GPU indices")
        # `uid` came later within version 1: optional, and older readers ignore it.
        uid = field(body, "uid", (int, type(None)), where, default=None)
        return cls(field(body, "job", str, where), number_field(body, "start", where),
                   tuple(gpus) if gpus is not None else None, uid)


def job_start_path(journal_dir: Path, job_id: str) -> Path:
    """Where the prolog of `job_id` leaves its note."""
    return journal_dir / "jobs" / f"{job_id}.json"


def write_job_start(journal_dir: Path, record: JobStart) -> Path:
    """Write the note atomically; its path."""
    return atomic_write(job_start_path(journal_dir, record.job_id), json.dumps(record.to_json(), sort_keys=True) + "\n")


def read_job_start(journal_dir: Path, job_id: str) -> JobStart | None:
    """The prolog's note for `job_id`; None when there is none; RecordError when it cannot be understood."""
    path = job_start_path(journal_dir, job_id)
    data = read_json_record(path, missing_ok=True)
    if data is None:
        return None
    record = JobStart.from_json(data, str(path))
    if record.job_id != job_id:
        raise RecordError(str(path), f"holds job {record.job_id}, not {job_id}")
    return record


def read_job_starts(journal_dir: Path) -> tuple[tuple[JobStart, ...], tuple[str, ...]]:
    """Every job-start note on this node (jobs whose epilog has not run yet), and why some could not be read."""
    starts: list[JobStart] = []
    problems: list[str] = []
    try:
        names = sorted(p.name for p in (journal_dir / "jobs").iterdir() if p.name.endswith(".json"))
    except OSError:
        return (), ()
    for name in names:
        try:
            record = read_job_start(journal_dir, name.removesuffix(".json"))
        except RecordError as exc:
            problems.append(str(exc))
            continue
        if record is not None:
            starts.append(record)
    return tuple(starts), tuple(problems)
