"""The epilog's per-job health record: what broke on one node during one job.

Written by the epilog (healthd side) to `<job_records_dir>/<job id>/<node>.json`; read by
the supervisor (launcher side) to blame nodes with evidence.  A field renamed on one side
would turn every hardware failure into "the program's own", so both sides use this one
definition, and a reader refuses a record it does not understand instead of guessing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write_at, check_entry_name, open_checked_dir, open_owned_subdir
from clusterctl.records.actions import Action
from clusterctl.records.finding_kind import FindingKind, finding_kind
from clusterctl.records.versioned import RecordError, check_header, field, header, read_json_record

KIND = "job-health"
VERSION = 1


@dataclass(frozen=True)
class HealthFinding:
    """One thing seen on the node during the job, with the policy's verdict."""

    kind: FindingKind  # "xid", "gpu-lost", "ecc-dbe", ...
    action: Action
    reason: str
    source: str  # "healthd", "kernel log", "epilog check"
    at: str | None = None  # UTC, when known
    xid: int | None = None
    gpu: int | None = None
    uuid: str = ""
    detail: str = ""

    @property
    def what(self) -> str:
        """`xid 79`, `ecc-dbe`: the short label."""
        return f"{self.kind} {self.xid}" if self.xid is not None else self.kind

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in the record."""
        return {"kind": self.kind, "xid": self.xid, "gpu": self.gpu, "uuid": self.uuid, "action": self.action.label,
                "reason": self.reason, "detail": self.detail, "source": self.source, "at": self.at}

    @classmethod
    def from_json(cls, data: object, where: str) -> HealthFinding:
        """Parse one finding; RecordError naming the field that is wrong."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "a finding is not a JSON object")
        try:
            action = Action.from_label(field(data, "action", str, where))
        except ValueError as exc:
            raise RecordError(where, str(exc)) from None
        return cls(kind=finding_kind(field(data, "kind", str, where), where), action=action, reason=field(data, "reason", str, where),
                   source=field(data, "source", str, where), at=field(data, "at", (str, type(None)), where),
                   xid=field(data, "xid", (int, type(None)), where), gpu=field(data, "gpu", (int, type(None)), where),
                   uuid=field(data, "uuid", str, where), detail=field(data, "detail", str, where))


@dataclass(frozen=True)
class JobHealthRecord:
    """The epilog's verdict on one node for one job."""

    job_id: str
    node: str
    window_start: str  # UTC: the prolog's start of the job (or a day back without one)
    window_end: str  # UTC: when the epilog ran
    written_at: str
    gpus: tuple[int, ...] | None = None  # the job's GPUs (None: all, or unknown)
    findings: tuple[HealthFinding, ...] = ()
    exit_code: str | None = None  # SLURM_JOB_EXIT_CODE as the epilog saw it

    @property
    def verdict(self) -> Action:
        """The worst action any finding calls for."""
        return max((f.action for f in self.findings), default=Action.IGNORE)

    @property
    def hardware_fault(self) -> bool:
        """The node broke the job: some finding calls for a drain."""
        return self.verdict.drains

    def worst_finding(self) -> HealthFinding | None:
        """The first finding with the worst action."""
        return next((f for f in self.findings if f.action == self.verdict), None)

    def summary(self) -> str:
        """One line of evidence: `epilog record: drain-reset (xid 79 gpu3 drain-reset)`."""
        described = "; ".join(f"{f.what} gpu{f.gpu} {f.action.label}" for f in self.findings[:3]) or "no findings"
        return f"epilog record: {self.verdict.label} ({described})"

    def to_json(self) -> dict[str, Any]:
        """The whole record as stored (verdict and hardware_fault included for humans and jq)."""
        return {**header(KIND, VERSION), "job": self.job_id, "node": self.node,
                "gpus": list(self.gpus) if self.gpus is not None else None,
                "window": [self.window_start, self.window_end], "findings": [f.to_json() for f in self.findings],
                "verdict": self.verdict.label, "hardware_fault": self.hardware_fault,
                "exit_code": self.exit_code, "written_at": self.written_at}

    @classmethod
    def from_json(cls, data: object, where: str) -> JobHealthRecord:
        """Parse a stored record; RecordError for anything not understood (never a guess)."""
        body = check_header(data, KIND, VERSION, where)
        window = field(body, "window", list, where)
        if len(window) != 2 or not all(isinstance(w, str) for w in window):
            raise RecordError(where, "field `window` must be [start, end] in UTC")
        gpus = field(body, "gpus", (list, type(None)), where)
        if gpus is not None and not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            raise RecordError(where, "field `gpus` must list GPU indices")
        findings = tuple(HealthFinding.from_json(f, where) for f in field(body, "findings", list, where))
        return cls(job_id=field(body, "job", str, where), node=field(body, "node", str, where),
                   window_start=window[0], window_end=window[1], written_at=field(body, "written_at", str, where),
                   gpus=tuple(gpus) if gpus is not None else None, findings=findings,
                   exit_code=field(body, "exit_code", (str, type(None)), where))


def job_health_path(records_dir: Path, job_id: str, node: str) -> Path:
    """Where the epilog of `job_id` on `node` keeps its record."""
    return records_dir / job_id / f"{node}.json"


def write_job_health(records_dir: Path, record: JobHealthRecord) -> Path:
    """Write the record atomically (readers never see half of it); its path.

    Root writes here into a directory that is often on shared storage, so nothing is looked
    up by path twice: `records_dir` must be a real directory, not writable by others unless
    sticky (UnsafePathError otherwise); `<job>/` is created there (0755) or reused only if it
    is a real directory of the same owner that nobody else can write (a planted directory or
    symlink is refused); the file is written relative to it (O_EXCL|O_NOFOLLOW temp, rename).
    OSError when the directory cannot be written at all.
    """
    text = json.dumps(record.to_json(), indent=1, sort_keys=True) + "\n"
    records_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    parent = open_checked_dir(records_dir)
    try:
        job_dir = open_owned_subdir(parent, record.job_id, where=str(records_dir))
        try:
            atomic_write_at(job_dir, check_entry_name(f"{record.node}.json"), text)
        finally:
            os.close(job_dir)
    finally:
        os.close(parent)
    return job_health_path(records_dir, record.job_id, record.node)


def read_job_health(path: Path) -> JobHealthRecord:
    """Read one record; RecordError when it is damaged, foreign or from a newer clusterctl."""
    data = read_json_record(path)
    return JobHealthRecord.from_json(data, str(path))
