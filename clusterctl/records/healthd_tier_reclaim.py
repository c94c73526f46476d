"""The prolog's log of the checkpoint tiers it reclaimed on this node (`<journal_dir>/tier-reclaims.jsonl`).

One line per job start that removed (or tried to remove) a stale tier: which trees, whose, how many runs'
tiers they held, the bytes freed and why (healthd/stale_tiers.py decides, healthd/node_tiers.py removes).
Read by admins and tests to learn where a node's memory or disk went back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import append_json_line, read_json_lines
from clusterctl.records.versioned import (
    MAX_WHOLE, RecordError, check_header, field, header, refuse_unknown, seconds_field, whole_field,
)

KIND = "healthd-tier-reclaim"
VERSION = 1
TIER_RECLAIMS_NAME = "tier-reclaims.jsonl"
_FIELDS = frozenset({"kind", "version", "at", "job", "node", "seconds", "trees"})
_TREE_FIELDS = frozenset({"path", "uid", "runs", "bytes", "why", "error"})
MAX_UID = 2**32 - 1


@dataclass(frozen=True)
class ReclaimedTree:
    """One tree the prolog removed, or tried to: `error` is None when it is gone."""

    path: str
    uid: int
    runs: int
    """The runs' tiers (`ckpt-*`) it held."""
    freed_bytes: int
    why: str
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The tree as stored."""
        return {"path": self.path, "uid": self.uid, "runs": self.runs, "bytes": self.freed_bytes, "why": self.why,
                "error": self.error}

    @classmethod
    def from_json(cls, data: object, where: str) -> ReclaimedTree:
        """Parse one tree; RecordError for anything not understood."""
        if not isinstance(data, dict):
            raise RecordError(where, "a reclaimed tree must be a JSON object")
        refuse_unknown(data, _TREE_FIELDS, where)
        return cls(field(data, "path", str, where), whole_field(data, "uid", where, maximum=MAX_UID),
                   whole_field(data, "runs", where), whole_field(data, "bytes", where, maximum=MAX_WHOLE),
                   field(data, "why", str, where), field(data, "error", (str, type(None)), where))


@dataclass(frozen=True)
class TierReclaim:
    """What one prolog reclaimed: when, for which job, on which node, how long it took, tree by tree."""

    at: str  # UTC
    job_id: str
    node: str
    seconds: float
    trees: tuple[ReclaimedTree, ...]

    @property
    def freed_bytes(self) -> int:
        """The bytes given back to the node."""
        return sum(tree.freed_bytes for tree in self.trees)

    def to_json(self) -> dict[str, Any]:
        """One line as stored."""
        return {**header(KIND, VERSION), "at": self.at, "job": self.job_id, "node": self.node,
                "seconds": self.seconds, "trees": [tree.to_json() for tree in self.trees]}

    @classmethod
    def from_json(cls, data: object, where: str) -> TierReclaim:
        """Parse one line; RecordError for anything not understood (a newer version is refused)."""
        body = check_header(data, KIND, VERSION, where)
        refuse_unknown(body, _FIELDS, where)
        trees = field(body, "trees", list, where)
        return cls(field(body, "at", str, where), field(body, "job", str, where), field(body, "node", str, where),
                   seconds_field(body, "seconds", where),
                   tuple(ReclaimedTree.from_json(tree, f"{where}: tree {n}") for n, tree in enumerate(trees, start=1)))


def tier_reclaims_path(journal_dir: Path) -> Path:
    """Where the prolog keeps its log of reclaimed tiers."""
    return journal_dir / TIER_RECLAIMS_NAME


def append_tier_reclaim(journal_dir: Path, entry: TierReclaim) -> None:
    """Append one entry durably."""
    journal_dir.mkdir(parents=True, exist_ok=True)
    append_json_line(tier_reclaims_path(journal_dir), entry.to_json())


def read_tier_reclaims(journal_dir: Path) -> tuple[TierReclaim, ...]:
    """Every entry (a torn last line is skipped); RecordError for a line not understood."""
    path = tier_reclaims_path(journal_dir)
    return tuple(TierReclaim.from_json(r, f"{path}: record {n}")
                 for n, r in enumerate(read_json_lines(path).records, start=1))
