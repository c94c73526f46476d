"""healthd's state file (`<state_dir>/state.json`): the current verdict per GPU, for other processes.

Written by the daemon several times a minute; read by `healthd status`, the prolog, the
epilog and HealthCheckProgram.  Readers decide whether a node may take work from it, so
they refuse a file they do not understand (RecordError) instead of reading a guess.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any

from clusterctl.clock import utc
from clusterctl.files import atomic_write
from clusterctl.records.actions import Action
from clusterctl.records.finding_kind import FindingKind, finding_kind
from clusterctl.records.versioned import (
    RecordError, check_header, field, header, number_field, read_json_record, strings_field,
)
from clusterctl.slurm.nodes import NodeState

KIND = "healthd-state"
VERSION = 1
STATE_NAME = "state.json"

_OPTIONAL_INT = (int, type(None))


def _action(data: Mapping[str, Any], key: str, where: str) -> Action:
    try:
        return Action.from_label(field(data, key, str, where))
    except ValueError as exc:
        raise RecordError(where, f"field `{key}`: {exc}") from None


@dataclass(frozen=True)
class StateFinding:
    """One finding healthd holds, with the policy's verdict.

    `current` findings come from the last periodic check and hold until a check no longer
    sees them; the others are one-off events (an Xid, a lost GPU) kept until the node is
    back in service after them (`acknowledged`).  `handled`: healthd acted on it (drained,
    or the breaker or an admin's drain decided), so the prolog leaves it to Slurm's node state.
    """

    kind: FindingKind  # "xid", "gpu-lost", "ecc-dbe", "nvml-hang", ...
    action: Action
    reason: str
    source: str  # "nvml-event", "kmsg", "periodic", "host", "network", "storage", "watchdog"
    at_ts: float
    xid: int | None = None
    gpu: int | None = None
    uuid: str = ""
    detail: str = ""
    jobs: tuple[str, ...] = ()
    current: bool = False
    handled: bool = False
    acknowledged: bool = False

    @property
    def what(self) -> str:
        """`xid 79`, `ecc-dbe`: the short label."""
        return f"{self.kind} {self.xid}" if self.xid is not None else self.kind

    @property
    def at(self) -> str:
        """When it was seen, in UTC."""
        return utc(self.at_ts)

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in the state file (`at` and `what` included for humans and jq)."""
        return {"kind": self.kind, "xid": self.xid, "what": self.what, "action": self.action.label,
                "reason": self.reason, "source": self.source, "at": self.at, "at_ts": self.at_ts, "gpu": self.gpu,
                "uuid": self.uuid, "detail": self.detail, "jobs": list(self.jobs), "current": self.current,
                "handled": self.handled, "acknowledged": self.acknowledged}

    @classmethod
    def from_json(cls, data: object, where: str) -> StateFinding:
        """Parse one finding; RecordError naming the field that is wrong."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "a finding is not a JSON object")
        return cls(kind=finding_kind(field(data, "kind", str, where), where), action=_action(data, "action", where),
                   reason=field(data, "reason", str, where), source=field(data, "source", str, where),
                   at_ts=number_field(data, "at_ts", where), xid=field(data, "xid", _OPTIONAL_INT, where),
                   gpu=field(data, "gpu", _OPTIONAL_INT, where), uuid=field(data, "uuid", str, where),
                   detail=field(data, "detail", str, where), jobs=strings_field(data, "jobs", where),
                   current=field(data, "current", bool, where), handled=field(data, "handled", bool, where),
                   acknowledged=field(data, "acknowledged", bool, where))


@dataclass(frozen=True)
class GpuState:
    """One GPU as healthd sees it: identity, worst current verdict, and the findings behind it."""

    index: int
    uuid: str
    pci_bus: str  # normalised "0000:5d:00"
    findings: tuple[StateFinding, ...] = ()

    @property
    def verdict(self) -> Action:
        """The worst action its findings call for."""
        return max((f.action for f in self.findings), default=Action.IGNORE)

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored under `gpus.<index>`."""
        return {"uuid": self.uuid, "pci_bus": self.pci_bus, "verdict": self.verdict.label,
                "findings": [f.to_json() for f in self.findings]}

    @classmethod
    def from_json(cls, index: str, data: object, where: str) -> GpuState:
        """Parse `gpus.<index>`."""
        if not index.isdigit() or not isinstance(data, Mapping):
            raise RecordError(where, f"`gpus.{index}` is not a GPU entry")
        inner = f"{where}: gpus.{index}"
        return cls(int(index), field(data, "uuid", str, inner), field(data, "pci_bus", str, inner),
                   tuple(StateFinding.from_json(f, inner) for f in field(data, "findings", list, inner)))


@dataclass(frozen=True)
class Alert:
    """Something an admin must look at that healthd would not act on by itself (the breaker opened)."""

    at: str  # UTC
    alert: str  # "breaker-open"
    reason: str  # the drain reason that was not applied
    detail: str

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in `alerts`."""
        return {"at": self.at, "alert": self.alert, "reason": self.reason, "detail": self.detail}

    @classmethod
    def from_json(cls, data: object, where: str) -> Alert:
        """Parse one alert."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "an alert is not a JSON object")
        return cls(field(data, "at", str, where), field(data, "alert", str, where), field(data, "reason", str, where),
                   field(data, "detail", str, where))


def _node_to_json(node: NodeState) -> dict[str, Any]:
    return {"name": node.name, "state": node.state, "flags": list(node.flags), "reason": node.reason,
            "partitions": list(node.partitions)}


def _node_from_json(data: object, where: str) -> NodeState | None:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise RecordError(where, "field `slurm` must be an object or null")
    return NodeState(field(data, "name", str, where), field(data, "state", str, where),
                     strings_field(data, "flags", where), field(data, "reason", str, where),
                     strings_field(data, "partitions", where))


@dataclass(frozen=True)
class HealthdState:
    """Everything `state.json` says: who wrote it, when, and the verdict per GPU and for the node."""

    node: str
    pid: int
    policy_version: str
    updated_at: float  # seconds since the epoch: readers judge freshness by it
    started: str  # UTC
    nvml_ok: bool
    gpus: tuple[GpuState, ...] = ()
    node_findings: tuple[StateFinding, ...] = ()
    pending_actions: int = 0
    slurm: NodeState | None = None  # the node as Slurm last answered
    alerts: tuple[Alert, ...] = ()
    loop_age_s: Mapping[str, float] = dataclass_field(default_factory=dict)
    dry_run: bool = False
    return_note: str = ""
    """Why a node healthd drained has not returned to service yet ("waiting for diagnostic ...",
    "diagnostic ... failed: ..."), or which diagnostic let it return; "" when there is nothing to say."""

    @property
    def verdict(self) -> Action:
        """The worst action any GPU or node-level finding calls for."""
        actions = [g.verdict for g in self.gpus] + [f.action for f in self.node_findings]
        return max(actions, default=Action.IGNORE)

    def findings(self) -> Iterable[StateFinding]:
        """Every finding, GPU by GPU, then the node-level ones."""
        for gpu in self.gpus:
            yield from gpu.findings
        yield from self.node_findings

    def to_json(self) -> dict[str, Any]:
        """The whole file as stored."""
        return {**header(KIND, VERSION), "node": self.node, "pid": self.pid, "policy_version": self.policy_version,
                "updated_at": self.updated_at, "updated": utc(self.updated_at), "started": self.started,
                "nvml": "ok" if self.nvml_ok else "unavailable", "verdict": self.verdict.label,
                "gpus": {str(g.index): g.to_json() for g in self.gpus},
                "node_findings": [f.to_json() for f in self.node_findings], "pending_actions": self.pending_actions,
                "slurm": _node_to_json(self.slurm) if self.slurm else None,
                "alerts": [a.to_json() for a in self.alerts], "loop_age_s": dict(self.loop_age_s),
                "dry_run": self.dry_run, "return_note": self.return_note}

    @classmethod
    def from_json(cls, data: object, where: str) -> HealthdState:
        """Parse a stored state; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        gpus = field(body, "gpus", dict, where)
        loop_age = field(body, "loop_age_s", dict, where)
        if not all(isinstance(v, (int, float)) for v in loop_age.values()):
            raise RecordError(where, "field `loop_age_s` must map loop names to seconds")
        nvml = field(body, "nvml", str, where)
        if nvml not in ("ok", "unavailable"):
            raise RecordError(where, f"field `nvml` must be ok or unavailable, found {nvml!r}")
        return cls(node=field(body, "node", str, where), pid=field(body, "pid", int, where),
                   policy_version=field(body, "policy_version", str, where),
                   updated_at=number_field(body, "updated_at", where), started=field(body, "started", str, where),
                   nvml_ok=nvml == "ok",
                   gpus=tuple(sorted((GpuState.from_json(i, g, where) for i, g in gpus.items()),
                                     key=lambda g: g.index)),
                   node_findings=tuple(StateFinding.from_json(f, where)
                                       for f in field(body, "node_findings", list, where)),
                   pending_actions=field(body, "pending_actions", int, where),
                   slurm=_node_from_json(body.get("slurm"), where),
                   alerts=tuple(Alert.from_json(a, where) for a in field(body, "alerts", list, where)),
                   loop_age_s={str(k): float(v) for k, v in loop_age.items()},
                   dry_run=field(body, "dry_run", bool, where),
                   # `return_note` came later within version 1: optional, and older readers ignore it.
                   return_note=field(body, "return_note", str, where, default=""))


def state_path(state_dir: Path) -> Path:
    """Where healthd keeps its state file."""
    return state_dir / STATE_NAME


def write_healthd_state(state_dir: Path, state: HealthdState) -> Path:
    """Replace the state file atomically (readers see the old state or the new one, never half)."""
    return atomic_write(state_path(state_dir), json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n")


def read_healthd_state(state_dir: Path) -> HealthdState | None:
    """The state healthd last wrote; None when there is none; RecordError when it cannot be understood."""
    path = state_path(state_dir)
    data = read_json_record(path, missing_ok=True)
    if data is None:
        return None
    return HealthdState.from_json(data, str(path))
