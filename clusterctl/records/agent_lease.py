"""Which agent drives a job: `<job_dir>/agent-lease/`, one file per epoch, taken with an atomic link.

The job's agent (the batch script, on the allocation's first node) takes epoch 1 when it starts and
registers a standby (`standby.json`: an agent on another node of the allocation, ready to take
over).  A standby that finds the active agent gone, and Slurm agreeing that its node is, takes the
next epoch: it writes `<epoch>.json` to a temporary name and links it to its final name, which
fails when the file exists, so of two agents racing for one epoch exactly one wins, on a local
filesystem and on NFS alike (link is atomic there; O_EXCL was not before NFSv3).

The agent in charge is the one holding the highest epoch.  Every agent asks `current_lease` before
it acts (starts a step, gives a node back, ends the job) and stands down when a higher epoch exists;
the run journal's events carry the acting agent's node.  Read by the supervisor and `clusterctl
status` too: a job whose standby took over is not a job whose agent is gone.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import RecordError, check_header, field, header, read_json_record
from clusterctl.slurm.names import node_name_problem

KIND = "agent-lease"
VERSION = 1
LEASE_DIR = "agent-lease"
STANDBY_NAME = "standby.json"
LEASE_LIMIT = 64 * 1024
MAX_EPOCHS = 1000
"""A job whose lease directory holds more epoch files than this is refused as damaged."""
_EPOCH_FILE = re.compile(r"^(\d{1,6})\.json$")
ROLES = ("active", "standby")


@dataclass(frozen=True)
class AgentLease:
    """One agent's claim: `epoch` (1, 2, ...; a standby's record names the epoch it would take), its
    node and process, when (epoch s), and why it took over ('' for the first agent)."""

    epoch: int
    node: str
    pid: int
    at: float
    role: str = "active"  # one of ROLES
    why: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} is not one of {', '.join(ROLES)}")

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "epoch": self.epoch, "node": self.node, "pid": self.pid, "at": self.at,
                "role": self.role, "why": self.why}

    @classmethod
    def from_json(cls, data: object, where: str) -> AgentLease:
        """Parse a stored lease; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        epoch, pid = field(body, "epoch", int, where), field(body, "pid", int, where)
        at = field(body, "at", (int, float), where)
        if isinstance(epoch, bool) or epoch < 1 or isinstance(pid, bool) or pid < 1:
            raise RecordError(where, "fields `epoch` and `pid` must be whole numbers of at least 1")
        if isinstance(at, bool) or not at >= 0 or at == float("inf"):
            raise RecordError(where, f"field `at` is {at!r}: it must be a finite time, not negative")
        node = field(body, "node", str, where)
        if (problem := node_name_problem(node)):
            raise RecordError(where, f"field `node`: {problem}")
        role = field(body, "role", str, where)
        if role not in ROLES:
            raise RecordError(where, f"field `role` is {role!r}: one of {', '.join(ROLES)}")
        return cls(epoch=epoch, node=node, pid=pid, at=float(at), role=role, why=field(body, "why", str, where))


def lease_dir(job_dir: Path) -> Path:
    """Where the job's agents keep their leases."""
    return job_dir / LEASE_DIR


def take_lease(job_dir: Path, lease: AgentLease) -> bool:
    """Claim `lease.epoch` for `lease.node`: True when this call took it, False when another agent
    holds that epoch already (the file is never replaced)."""
    directory = lease_dir(job_dir)
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    final = directory / f"{lease.epoch}.json"
    temporary = directory / f".{lease.epoch}.{lease.node}.{lease.pid}.{os.urandom(4).hex()}"
    with open(temporary, "x", encoding="utf-8") as out:
        out.write(json.dumps(lease.to_json(), sort_keys=True) + "\n")
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(temporary, final)
        return True
    except FileExistsError:
        return False
    finally:
        temporary.unlink(missing_ok=True)


def current_lease(job_dir: Path) -> AgentLease | None:
    """The lease with the highest epoch (the agent in charge), None before any agent took one;
    RecordError when that file is damaged, foreign (a symlink, not a regular file) or misnamed."""
    directory = lease_dir(job_dir)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    epochs = sorted((int(m.group(1)) for name in names if (m := _EPOCH_FILE.match(name))), reverse=True)
    if len(epochs) > MAX_EPOCHS:
        raise RecordError(str(directory), f"{len(epochs)} epoch files: more than {MAX_EPOCHS}, the directory is "
                                          "damaged")
    if not epochs:
        return None
    path = directory / f"{epochs[0]}.json"
    lease = AgentLease.from_json(read_json_record(path, limit=LEASE_LIMIT, follow_symlinks=False), str(path))
    if lease.epoch != epochs[0] or lease.role != "active":
        raise RecordError(str(path), f"holds epoch {lease.epoch} ({lease.role}), not the active epoch {epochs[0]} "
                                     "its name says")
    return lease


def register_standby(job_dir: Path, standby: AgentLease) -> None:
    """Say where the standby runs (replaced whenever the active agent starts a new one)."""
    directory = lease_dir(job_dir)
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    atomic_write(directory / STANDBY_NAME, json.dumps(standby.to_json(), sort_keys=True) + "\n")


def read_standby(job_dir: Path) -> AgentLease | None:
    """The job's registered standby, None when it has none; RecordError when the file is damaged."""
    path = lease_dir(job_dir) / STANDBY_NAME
    data = read_json_record(path, missing_ok=True, limit=LEASE_LIMIT, follow_symlinks=False)
    if data is None:
        return None
    standby = AgentLease.from_json(data, str(path))
    if standby.role != "standby":
        raise RecordError(str(path), f"role {standby.role!r}: a standby's record says standby")
    return standby
