"""A job's rank map: `<run>/jobs/<job id>/rankmap.json`, and the map itself.

Written once per job by `python -m clusterctl.launcher.job plan` (the job's first step);
read by `clusterctl status` and by scripts (scripts/main-job.sh reads `slots`).  The `plan` object inside is the
planner's own document (what `clusterctl plan --json` prints), kept for people; programs read
the typed fields only.  Ranks do not read this file: each reads its own slot of `rankmap.idx`
(clusterctl.records.rank_index), a few hundred bytes whatever the job's size.

This module is imported by every rank of a job: it stays light (no planner, no rich).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import RecordError, check_header, field, header, read_json_record, indented_json

KIND = "rank-map"
VERSION = 1
FILE_NAME = "rankmap.json"


@dataclass(frozen=True)
class RankMap:
    """Where every global rank runs: slot s is node `slots[s]`; rank r is on slot r // gpus_per_node,
    local GPU r % gpus_per_node (the same local order on every node)."""

    slots: tuple[str, ...]
    gpus_per_node: int

    @property
    def world_size(self) -> int:
        """Ranks in the map."""
        return len(self.slots) * self.gpus_per_node

    @property
    def master_addr(self) -> str:
        """The node of rank 0 (torch.distributed's MASTER_ADDR)."""
        return self.slots[0]

    def location(self, rank: int) -> tuple[str, int]:
        """(node, local GPU index) of a global rank."""
        return self.slots[rank // self.gpus_per_node], rank % self.gpus_per_node

    def node_rank(self, node: str) -> int:
        """The node's slot (torchrun's --node-rank)."""
        return self.slots.index(node)

    def first_rank(self, slot: int) -> int:
        """The lowest global rank on a slot (its ranks are first_rank … first_rank + gpus_per_node − 1)."""
        return slot * self.gpus_per_node


@dataclass(frozen=True)
class PlanSummary:
    """How good the job's map is: the planner's strategy and leaf-crossing DP/PP groups vs the baselines."""

    strategy: str
    leaf_crossing_groups: int
    slurm_order_leaf_crossing_groups: int
    dfs_order_leaf_crossing_groups: int

    def to_json(self) -> dict[str, Any]:
        """As stored (and as `clusterctl status --json` shows it, with the slots)."""
        return {"strategy": self.strategy, "leaf_crossing_groups": self.leaf_crossing_groups,
                "slurm_order_leaf_crossing_groups": self.slurm_order_leaf_crossing_groups,
                "dfs_order_leaf_crossing_groups": self.dfs_order_leaf_crossing_groups}

    @classmethod
    def from_json(cls, data: object, where: str) -> PlanSummary:
        """Parse the summary; RecordError naming the field that is wrong."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "field `summary` is not a JSON object")
        return cls(strategy=field(data, "strategy", str, where),
                   leaf_crossing_groups=field(data, "leaf_crossing_groups", int, where),
                   slurm_order_leaf_crossing_groups=field(data, "slurm_order_leaf_crossing_groups", int, where),
                   dfs_order_leaf_crossing_groups=field(data, "dfs_order_leaf_crossing_groups", int, where))


@dataclass(frozen=True)
class JobRankMap:
    """The rank map one job computed for the nodes Slurm gave it, and how to reach rank 0."""

    job_id: str
    nodelist: str  # SLURM_JOB_NODELIST as the job saw it
    rank_map: RankMap
    master_port: int
    unused_nodes: tuple[str, ...] = ()  # allocated but not in the map (spares)
    summary: PlanSummary | None = None
    plan: Mapping[str, Any] = dataclass_field(default_factory=dict)  # the planner's document, for people

    @property
    def slots(self) -> tuple[str, ...]:
        """The map's nodes in slot order."""
        return self.rank_map.slots

    @property
    def gpus_per_node(self) -> int:
        """Ranks per node."""
        return self.rank_map.gpus_per_node

    @property
    def world_size(self) -> int:
        """Ranks in the job."""
        return self.rank_map.world_size

    @property
    def node_count(self) -> int:
        """Slots (nodes) in the map."""
        return len(self.rank_map.slots)

    @property
    def master_addr(self) -> str:
        """The node of rank 0."""
        return self.rank_map.master_addr

    def location(self, rank: int) -> tuple[str, int]:
        """(node, local GPU index) of a global rank."""
        return self.rank_map.location(rank)

    def to_json(self) -> dict[str, Any]:
        """The file's JSON (world_size and master_addr included for people and scripts)."""
        return {**header(KIND, VERSION), "job_id": self.job_id, "nodelist": self.nodelist,
                "slots": list(self.slots), "gpus_per_node": self.gpus_per_node, "world_size": self.world_size,
                "master_addr": self.master_addr, "master_port": self.master_port,
                "unused_nodes": list(self.unused_nodes),
                "summary": self.summary.to_json() if self.summary is not None else None, "plan": dict(self.plan)}

    @classmethod
    def from_json(cls, data: object, where: str) -> JobRankMap:
        """Parse a stored map; RecordError for anything not understood."""
        body = check_header(data, KIND, VERSION, where)
        slots = field(body, "slots", list, where)
        if not slots or not all(isinstance(s, str) and s for s in slots):
            raise RecordError(where, "field `slots` must be a non-empty list of node names")
        gpus_per_node = field(body, "gpus_per_node", int, where)
        if gpus_per_node < 1:
            raise RecordError(where, "field `gpus_per_node` must be at least 1")
        unused = field(body, "unused_nodes", list, where)
        if not all(isinstance(n, str) for n in unused):
            raise RecordError(where, "field `unused_nodes` must list node names")
        summary = field(body, "summary", (dict, type(None)), where)
        return cls(job_id=field(body, "job_id", str, where), nodelist=field(body, "nodelist", str, where),
                   rank_map=RankMap(tuple(slots), gpus_per_node), master_port=field(body, "master_port", int, where),
                   unused_nodes=tuple(unused),
                   summary=PlanSummary.from_json(summary, where) if summary is not None else None,
                   plan=field(body, "plan", dict, where))


def rank_map_path(job_dir: Path) -> Path:
    """Where a job keeps its rank map."""
    return job_dir / FILE_NAME


def write_rank_map(job_dir: Path, record: JobRankMap) -> Path:
    """Write the job's map atomically (ranks never read half of it); its path."""
    return atomic_write(rank_map_path(job_dir), indented_json(record.to_json()) + "\n")


def read_rank_map(job_dir: Path) -> JobRankMap:
    """The job's map; FileNotFoundError when the job has not written one, RecordError when it is not readable."""
    path = rank_map_path(job_dir)
    parsed = read_json_record(path)
    return JobRankMap.from_json(parsed, str(path))
