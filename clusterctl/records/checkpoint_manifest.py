"""One tier's copy of one node's part of one checkpoint, and the proof that it is complete.

Multi-level checkpoints (issue #25, being built: see docs/architecture.md) keep every checkpoint
in up to three places, its **tiers**: each node's own fast storage (`local`: tmpfs or NVMe), a
copy of that node's shards on another node of the job (`buddy`), and, every k-th checkpoint,
shared storage (`shared`).  Each copy has one manifest, written after the copy's last shard: the
step, whose shards they are (`of_node`), which node's tier holds them (`held_on`; none for
shared storage), and every shard's name, size and SHA-256.  A copy without a manifest is
incomplete; a manifest whose shards do not match is a bad copy.  Deciding which copies to resume
from is `clusterctl.launcher.pure.checkpoint_tiers`; this module only says what a manifest is.

Nothing job- or run-specific is in it (no job id, no path): the same copy means the same thing
after the job is resubmitted.  The reader refuses anything it does not exactly understand (a
newer version, an unknown field, a shard name that is not one plain file name, a number that is
not finite, more than MAX_SHARDS shards) with a RecordError naming the file and the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import (
    MAX_WHOLE, RecordError, check_header, field, header, indented_json, read_json_record,
)
from clusterctl.records.versioned import refuse_unknown as _refuse_unknown
from clusterctl.records.versioned import seconds_field as _seconds
from clusterctl.records.versioned import whole_field as _whole
from clusterctl.slurm.names import node_name_problem

KIND = "checkpoint-manifest"
VERSION = 1
TIERS = ("local", "buddy", "shared")
"""Where a copy is held: the node's own storage, another node's (its buddy's), shared storage."""
MAX_SHARDS = 4096
"""The most shards one node's part of a checkpoint may list (8 GPUs writing a few files each need tens)."""
MAX_NAME_BYTES = 255
"""The longest shard name, in UTF-8 bytes (a file name's limit on Linux filesystems)."""
MANIFEST_LIMIT = 4 << 20
"""The largest manifest file read (bytes): MAX_SHARDS entries of the longest names fit."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FIELDS = frozenset({"kind", "version", "step", "of_node", "held_on", "tier", "shards", "written_at",
                     "save_seconds", "slot", "slots"})
_SHARD_FIELDS = frozenset({"name", "size", "sha256"})


def shard_name_problem(name: object) -> str | None:
    """Why `name` is not a name a shard may have, or None when it is one.

    A shard is one plain file name (`.metadata`, `__0_0.distcp`), or one plain folder name and one
    plain file name joined by `/` (`rank-3/__0_0.distcp`: a rank's own folder in its node's copy).
    Refused: empty parts, `.`, `..` anywhere in it, a leading `/`, more than one `/` (so no
    reader has to think about climbing out of a directory), control or other unprintable
    characters, more than MAX_NAME_BYTES bytes in all.
    """
    if not isinstance(name, str):
        return f"{name!r} is not a file name"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"a shard name of {len(name.encode('utf-8'))} bytes: at most {MAX_NAME_BYTES}"
    if not name.isprintable():
        return f"{name!r} holds a control or unprintable character"
    parts = name.split("/")
    if len(parts) > 2 or ".." in name or any(part in ("", ".") for part in parts):
        return f"{name!r} is not a plain file name or folder/file (no '..', no leading or second '/')"
    return None


@dataclass(frozen=True)
class Shard:
    """One file of a node's part of a checkpoint: its plain file name, size in bytes and SHA-256 (hex)."""

    name: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        if (problem := _shard_problem(self.name, self.size, self.sha256)):
            raise ValueError(problem)

    def to_json(self) -> dict[str, Any]:
        """The shard's entry in the manifest."""
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class CheckpointManifest:
    """One tier's copy of one node's shards of one checkpoint.

    `of_node` saved the shards; `held_on` is the node whose tier holds this copy (`of_node` itself
    for `local`, another node for `buddy`, None for `shared`).  `written_at` is when the copy was
    complete (epoch s), `save_seconds` what writing it took.  `slot` is the node's slot in the rank
    map it saved under (its ranks are slot × gpus_per_node onwards), `slots` that map's size: a
    resume loads slot s's shards on whichever node takes slot s.
    """

    step: int
    of_node: str
    tier: str  # one of TIERS
    held_on: str | None
    shards: tuple[Shard, ...]
    written_at: float
    save_seconds: float
    slot: int = 0
    slots: int = 1

    def __post_init__(self) -> None:
        if (problem := _manifest_problem(self)):
            raise ValueError(problem)

    @property
    def total_bytes(self) -> int:
        """The copy's size: its shards' sizes summed."""
        return sum(s.size for s in self.shards)

    @property
    def where(self) -> str:
        """The copy in a user's words: `node3's local copy`, `node3's copy on node1`, `node3's copy on shared storage`."""
        if self.tier == "local":
            return f"{self.of_node}'s local copy"
        if self.tier == "buddy":
            return f"{self.of_node}'s copy on {self.held_on}"
        return f"{self.of_node}'s copy on shared storage"

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "step": self.step, "of_node": self.of_node, "held_on": self.held_on,
                "tier": self.tier, "shards": [s.to_json() for s in self.shards], "written_at": self.written_at,
                "save_seconds": self.save_seconds, "slot": self.slot, "slots": self.slots}

    @classmethod
    def from_json(cls, data: object, where: str) -> CheckpointManifest:
        """Parse a stored manifest; RecordError naming `where` and the key for anything not exactly understood."""
        body = check_header(data, KIND, VERSION, where)
        _refuse_unknown(body, _FIELDS, where)
        step = _whole(body, "step", where)
        of_node = field(body, "of_node", str, where)
        if (problem := node_name_problem(of_node)):
            raise RecordError(where, f"field `of_node`: {problem}")
        tier = field(body, "tier", str, where)
        if tier not in TIERS:
            raise RecordError(where, f"field `tier` is {tier!r}: one of {', '.join(TIERS)}")
        held_on = field(body, "held_on", (str, type(None)), where)
        if held_on is not None and (problem := node_name_problem(held_on)):
            raise RecordError(where, f"field `held_on`: {problem}")
        if (problem := _held_on_problem(tier, of_node, held_on)):
            raise RecordError(where, f"field `held_on`: {problem}")
        entries = field(body, "shards", list, where)
        if len(entries) > MAX_SHARDS:
            raise RecordError(where, f"field `shards` lists {len(entries)} shards: at most {MAX_SHARDS}")
        shards = tuple(_shard(entry, f"{where}: shards[{i}]") for i, entry in enumerate(entries))
        if (problem := _duplicate_problem(shards)):
            raise RecordError(where, f"field `shards`: {problem}")
        slots = _whole(body, "slots", where)
        slot = _whole(body, "slot", where)
        if not 0 <= slot < slots:
            raise RecordError(where, f"field `slot` is {slot}: a slot of a map of {slots} (0 to {slots - 1})")
        return cls(step=step, of_node=of_node, tier=tier, held_on=held_on, shards=shards,
                   written_at=_seconds(body, "written_at", where), save_seconds=_seconds(body, "save_seconds", where),
                   slot=slot, slots=slots)


def read_checkpoint_manifest(path: Path) -> CheckpointManifest:
    """The manifest at `path`; FileNotFoundError when there is none (the copy is incomplete), RecordError
    when it is damaged, foreign, too large, from a newer clusterctl or not a regular file."""
    return CheckpointManifest.from_json(read_json_record(path, limit=MANIFEST_LIMIT, follow_symlinks=False), str(path))


def write_checkpoint_manifest(path: Path, manifest: CheckpointManifest) -> Path:
    """Write the manifest atomically (a reader sees all of it or none): call it after the copy's last shard."""
    return atomic_write(path, indented_json(manifest.to_json()) + "\n")




def _shard(entry: object, where: str) -> Shard:
    if not isinstance(entry, Mapping):
        raise RecordError(where, "must be an object with `name`, `size` and `sha256`")
    _refuse_unknown(entry, _SHARD_FIELDS, where)
    name = field(entry, "name", str, where)
    if (problem := shard_name_problem(name)):
        raise RecordError(where, f"field `name`: {problem}")
    size = _whole(entry, "size", where)
    sha256 = field(entry, "sha256", str, where)
    if not _SHA256.fullmatch(sha256):
        raise RecordError(where, f"field `sha256` of {name!r} must be 64 lowercase hex digits")
    return Shard(name, size, sha256)






def _shard_problem(name: str, size: int, sha256: str) -> str | None:
    if (problem := shard_name_problem(name)):
        return problem
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_WHOLE:
        return f"shard {name!r}: size {size!r} is not a whole number of bytes"
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        return f"shard {name!r}: sha256 must be 64 lowercase hex digits"
    return None


def _held_on_problem(tier: str, of_node: str, held_on: str | None) -> str | None:
    if tier == "local" and held_on != of_node:
        return f"a local copy is held on its own node ({of_node}), not {held_on!r}"
    if tier == "buddy" and (held_on is None or held_on == of_node):
        return f"a buddy copy of {of_node}'s shards is held on another node, not {held_on!r}"
    if tier == "shared" and held_on is not None:
        return f"a copy on shared storage is held on no node (null), not {held_on!r}"
    return None


def _duplicate_problem(shards: tuple[Shard, ...]) -> str | None:
    seen: set[str] = set()
    for shard in shards:
        if shard.name in seen:
            return f"shard {shard.name!r} is listed twice"
        seen.add(shard.name)
    return None


def _manifest_problem(manifest: CheckpointManifest) -> str | None:
    if isinstance(manifest.step, bool) or not isinstance(manifest.step, int) or not 0 <= manifest.step <= MAX_WHOLE:
        return f"step {manifest.step!r} is not a whole number from 0 to {MAX_WHOLE}"
    if manifest.tier not in TIERS:
        return f"tier {manifest.tier!r} is not one of {', '.join(TIERS)}"
    for key, node in (("of_node", manifest.of_node), ("held_on", manifest.held_on)):
        if (node is not None or key == "of_node") and (problem := node_name_problem(node)):
            return f"{key}: {problem}"
    if (problem := _held_on_problem(manifest.tier, manifest.of_node, manifest.held_on)):
        return problem
    for key, value in (("slot", manifest.slot), ("slots", manifest.slots)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WHOLE:
            return f"{key} {value!r} is not a whole number"
    if not 0 <= manifest.slot < manifest.slots:
        return f"slot {manifest.slot} is not a slot of a map of {manifest.slots}"
    if not isinstance(manifest.shards, tuple) or not all(isinstance(s, Shard) for s in manifest.shards):
        return "shards must be a tuple of Shard"
    if len(manifest.shards) > MAX_SHARDS:
        return f"{len(manifest.shards)} shards: at most {MAX_SHARDS}"
    if (problem := _duplicate_problem(manifest.shards)):
        return problem
    for key, seconds in (("written_at", manifest.written_at), ("save_seconds", manifest.save_seconds)):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or seconds < 0:
            return f"{key} is {seconds!r}: a finite number of seconds, not negative"
    return None
