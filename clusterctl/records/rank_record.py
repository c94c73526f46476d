"""Where one rank really ran: `<run>/jobs/<job id>/ranks/<rank>.json`.

Written by each rank's preflight (`python -m clusterctl.launcher.job rank`) just before it
becomes the training command, after checking it runs where the rank map says; read by tests,
scripts/main-job.sh (`rank`, `hostname`) and people comparing the map with reality.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import check_header, field, header, number_field, read_json_record

KIND = "rank-record"
VERSION = 1

_OPTIONAL_STR = (str, type(None))


@dataclass(frozen=True)
class RankRecord:
    """One rank as it started: Slurm's node name, the host's own name, and what Slurm told the task."""

    rank: int
    node: str  # SLURMD_NODENAME (the name the map uses)
    hostname: str  # the host's own name, which may differ
    pid: int
    local_rank: int
    started: float  # epoch seconds
    slurm_procid: str | None = None
    slurm_localid: str | None = None
    slurm_nodeid: str | None = None
    cuda_visible_devices: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The file's JSON."""
        return {**header(KIND, VERSION), "rank": self.rank, "node": self.node, "hostname": self.hostname,
                "pid": self.pid, "local_rank": self.local_rank, "started": self.started,
                "slurm_procid": self.slurm_procid, "slurm_localid": self.slurm_localid,
                "slurm_nodeid": self.slurm_nodeid, "cuda_visible_devices": self.cuda_visible_devices}

    @classmethod
    def from_json(cls, data: object, where: str) -> RankRecord:
        """Parse a stored record; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        return cls(rank=field(body, "rank", int, where), node=field(body, "node", str, where),
                   hostname=field(body, "hostname", str, where), pid=field(body, "pid", int, where),
                   local_rank=field(body, "local_rank", int, where),
                   started=number_field(body, "started", where),
                   slurm_procid=field(body, "slurm_procid", _OPTIONAL_STR, where),
                   slurm_localid=field(body, "slurm_localid", _OPTIONAL_STR, where),
                   slurm_nodeid=field(body, "slurm_nodeid", _OPTIONAL_STR, where),
                   cuda_visible_devices=field(body, "cuda_visible_devices", _OPTIONAL_STR, where))


def rank_record_path(job_dir: Path, rank: int) -> Path:
    """Where rank `rank` of a job records itself."""
    return job_dir / "ranks" / f"{rank}.json"


def write_rank_record(job_dir: Path, record: RankRecord) -> Path:
    """Write the record atomically; its path."""
    return atomic_write(rank_record_path(job_dir, record.rank), json.dumps(record.to_json(), sort_keys=True) + "\n")


def read_rank_record(path: Path) -> RankRecord:
    """Read one rank's record; RecordError when it is damaged, foreign or from a newer clusterctl."""
    data = read_json_record(path)
    return RankRecord.from_json(data, str(path))


def read_rank_records(job_dir: Path) -> dict[int, RankRecord]:
    """Every rank record of a job, by rank (ranks that have not started yet are absent)."""
    records = (read_rank_record(path) for path in sorted((job_dir / "ranks").glob("*.json")))
    return {record.rank: record for record in records}
