"""What one rank reads of its job's map: `<run>/jobs/<job id>/rankmap.idx`, a fixed-width index.

The map of a 100,000-rank job lists 12,500 nodes; if every rank read all of it, the shared
filesystem would serve 100,000 × the whole map at every start.  Written once per job, next to
rankmap.json, by `python -m clusterctl.launcher.job plan`; read by every rank's preflight
(`python -m clusterctl.launcher.job rank` / `node`), which reads the header and the one line of its own slot —
a few hundred bytes, whatever the size of the job.

The file is text a person can read (`sed -n 2p` shows slot 0):

    {"gpus_per_node": 8, "job_id": "42", "kind": "rank-map-index", ..., "record_bytes": 7, "version": 1}
    node3␠␠
    node1␠␠
    node12␠

Line 1 is the header (a JSON object of at most HEADER_MAX_BYTES); then one line per slot, in
slot order, each the node's name padded with blanks to `record_bytes` (newline included), so
slot s starts at byte len(header line) + s × record_bytes.  Node names never hold blanks.

This module is imported by every rank of a job: it stays light (no planner, no rich).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.rank_map import JobRankMap
from clusterctl.records.versioned import RecordError, check_header, field, header

KIND = "rank-map-index"
VERSION = 1
FILE_NAME = "rankmap.idx"
HEADER_MAX_BYTES = 4096
"""The header line's limit (newline included): a reader's first read of this size always holds it."""


@dataclass(frozen=True)
class RankMapIndex:
    """The header: what every rank of the job shares, and the width of one slot's line."""

    job_id: str
    gpus_per_node: int
    nodes: int  # slots in the map
    master_addr: str
    master_port: int
    record_bytes: int

    @property
    def world_size(self) -> int:
        """Ranks in the job."""
        return self.nodes * self.gpus_per_node

    def to_json(self) -> dict[str, Any]:
        """The header line's JSON."""
        return {**header(KIND, VERSION), "job_id": self.job_id, "gpus_per_node": self.gpus_per_node,
                "nodes": self.nodes, "master_addr": self.master_addr, "master_port": self.master_port,
                "record_bytes": self.record_bytes}

    @classmethod
    def from_json(cls, data: object, where: str) -> RankMapIndex:
        """Parse a header; RecordError for anything not understood."""
        body: Mapping[str, Any] = check_header(data, KIND, VERSION, where)
        index = cls(job_id=field(body, "job_id", str, where), gpus_per_node=field(body, "gpus_per_node", int, where),
                    nodes=field(body, "nodes", int, where), master_addr=field(body, "master_addr", str, where),
                    master_port=field(body, "master_port", int, where),
                    record_bytes=field(body, "record_bytes", int, where))
        if index.gpus_per_node < 1 or index.nodes < 1 or index.record_bytes < 2:
            raise RecordError(where, "fields `gpus_per_node`, `nodes` and `record_bytes` must be positive "
                                     "(record_bytes at least 2)")
        return index


@dataclass(frozen=True)
class SlotView:
    """One slot of a job's map as a rank sees it: the shared header and the node of that slot
    (None when the slot is outside the map).  Answers what the preflight asks of a whole map
    for the ranks of this slot."""

    index: RankMapIndex
    slot: int
    node: str | None

    @property
    def world_size(self) -> int:
        """Ranks in the job."""
        return self.index.world_size

    @property
    def gpus_per_node(self) -> int:
        """Ranks per node."""
        return self.index.gpus_per_node

    @property
    def node_count(self) -> int:
        """Slots (nodes) in the map."""
        return self.index.nodes

    @property
    def master_addr(self) -> str:
        """The node of rank 0."""
        return self.index.master_addr

    @property
    def master_port(self) -> int:
        """rank 0's port."""
        return self.index.master_port

    def location(self, rank: int) -> tuple[str, int]:
        """(node, local GPU index) of a rank of this slot; ValueError for a rank of another slot."""
        slot, gpu = divmod(rank, self.gpus_per_node)
        if slot != self.slot or self.node is None:
            raise ValueError(f"rank {rank} is not on slot {self.slot} of the map")
        return self.node, gpu


def rank_index_path(job_dir: Path) -> Path:
    """Where a job keeps the index of its map."""
    return job_dir / FILE_NAME


def rank_index_text(record: JobRankMap) -> str:
    """The index file's text for a job's map; RecordError if a name has a blank or the header is too long."""
    where = FILE_NAME
    if any(not node or any(c.isspace() for c in node) for node in record.slots):
        raise RecordError(where, "node names in the map must be non-empty and hold no blanks")
    width = max(len(node.encode("utf-8")) for node in record.slots) + 1
    index = RankMapIndex(record.job_id, record.gpus_per_node, len(record.slots), record.master_addr,
                         record.master_port, width)
    head = json.dumps(index.to_json(), sort_keys=True) + "\n"
    if len(head.encode("utf-8")) > HEADER_MAX_BYTES:
        raise RecordError(where, f"header longer than {HEADER_MAX_BYTES} bytes (job id or master address too long)")
    # Pad by bytes, not characters: a non-ASCII name must not shift the slots after it.
    lines = (node + " " * (width - 1 - len(node.encode("utf-8"))) + "\n" for node in record.slots)
    return head + "".join(lines)


def write_rank_index(job_dir: Path, record: JobRankMap) -> Path:
    """Write the index of the job's map atomically (ranks never read half of it); its path."""
    return atomic_write(rank_index_path(job_dir), rank_index_text(record))


def read_slot(job_dir: Path, *, rank: int | None = None, node_rank: int | None = None) -> SlotView:
    """The slot of global `rank` (or of `node_rank`, torchrun's node rank), reading only the header
    and that slot's line.  FileNotFoundError without an index; RecordError when it is damaged,
    foreign or from a newer clusterctl."""
    if (rank is None) == (node_rank is None):
        raise ValueError("read_slot needs exactly one of rank and node_rank")
    path = rank_index_path(job_dir)
    where = str(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        first = os.pread(fd, HEADER_MAX_BYTES, 0)
        end = first.find(b"\n")
        if end < 0:
            raise RecordError(where, f"no header line in the first {HEADER_MAX_BYTES} bytes; not a rank map index")
        try:
            parsed = json.loads(first[:end].decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise RecordError(where, f"header is not a readable JSON record ({exc.__class__.__name__})") from None
        index = RankMapIndex.from_json(parsed, where)
        size = os.fstat(fd).st_size
        if size != end + 1 + index.nodes * index.record_bytes:
            raise RecordError(where, f"{size} bytes, but the header promises {index.nodes} slots of "
                                     f"{index.record_bytes} bytes; the file is damaged or half-copied")
        slot = node_rank if node_rank is not None else (rank // index.gpus_per_node if rank is not None else 0)
        if not 0 <= slot < index.nodes or (rank is not None and rank < 0):
            return SlotView(index, slot, None)
        start = end + 1 + slot * index.record_bytes
        line = first[start:start + index.record_bytes]
        if len(line) < index.record_bytes:
            line = os.pread(fd, index.record_bytes, start)
    finally:
        os.close(fd)
    node = line[:-1].decode("utf-8", errors="replace").rstrip(" ")
    if not line.endswith(b"\n") or not node or " " in node:
        raise RecordError(where, f"the line of slot {slot} is damaged")
    return SlotView(index, slot, node)
