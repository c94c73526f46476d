"""What a run knows of its multi-level checkpoints from one job to the next (docs/checkpoint-tiers.md).

Two files, both written by the job's agent (launcher/job/checkpoint_plan.py), never by the ranks:

- `<job dir>/checkpoint-inventory.json`: the newest holdings of every node the job heard from (one file
  per job, rewritten when they change, at most every INVENTORY_EVERY seconds).  The next job of the run
  reads its predecessor's, so a resubmitted job can resume from the copies on the nodes it got again.
- `<checkpoint dir>/tiers/step-<N:012d>/complete.json`: written once every slot's part of checkpoint N is
  reported flushed to shared storage (one file per flushed checkpoint), naming the node whose part each
  slot holds.  The supervisor's `tiers` validator (launcher/shared/checkpoints.py) takes a step with this
  file as complete; an agent plans from it when no node holds anything (a fresh allocation).  Version 2
  adds `save_seconds`: what saving the checkpoint stalled training, the slowest slot's local save (null when
  no slot's is known), which `report`'s Young/Daly advice takes as the checkpoint's cost.  Version 1 files
  (an older agent's, kept on shared storage) are still read, without it.

What both tell of the newest checkpoint complete across the tiers is asked of one place: the agent's resume
(launcher/job/checkpoint_plan.py) and `clusterctl status` (launcher/login/status_reads.py) turn them into copies
(`copies_of`, `flushed_copies`), count as gone the nodes not present (`gone_from`), plan with
`checkpoint_tiers.plan_resume_from_copies` and name the chosen checkpoint with `tiers_checkpoint`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from clusterctl.files import atomic_write
from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.pure.checkpoint_tiers import FlushedCheckpoint, ResumePlan
from clusterctl.records.checkpoint_holdings import CheckpointHoldings
from clusterctl.records.checkpoint_manifest import CheckpointManifest
from clusterctl.records.versioned import (
    RecordError, check_header, field, header, node_field, read_json_record, refuse_unknown, seconds_field, whole_field,
)

INVENTORY_NAME = "checkpoint-inventory.json"
INVENTORY_KIND = "checkpoint-inventory"
INVENTORY_VERSION = 1
INVENTORY_LIMIT = 256 << 20
"""The largest inventory read (bytes): 100,000 nodes' holdings of a handful of copies are ~100 MB."""
COMPLETE_NAME = "complete.json"
COMPLETE_KIND = "checkpoint-flushed"
COMPLETE_VERSION = 2
COMPLETE_FIELDS_V1 = frozenset({"kind", "version", "step", "slots", "nodes"})
COMPLETE_LIMIT = 16 << 20
TIERS_DIR = "tiers"
_STEP_DIR = re.compile(r"step-([0-9]{12})")


def step_dir(shared_dir: str | Path, step: int) -> Path:
    """The shared tier's folder of checkpoint `step`."""
    return Path(shared_dir) / TIERS_DIR / f"step-{step:012d}"


# ---- the inventory ---------------------------------------------------------------------------------

def inventory_text(holdings: Mapping[str, CheckpointHoldings],
                   fragments: dict[str, tuple[CheckpointHoldings, str]] | None = None) -> str:
    """The inventory of `holdings` (by node), nodes sorted: the same holdings give the same text.

    `fragments`, kept by the caller from one call to the next: each node's holdings with their text, so
    that a node whose holdings are the same object as last time is not encoded again (at 12,500 nodes
    encoding them all takes most of a second; between two inventories a tenth of the nodes change)."""
    cache: dict[str, tuple[CheckpointHoldings, str]] = {} if fragments is None else fragments
    parts = []
    for node in sorted(holdings):
        held = holdings[node]
        known = cache.get(node)
        if known is None or known[0] is not held:
            known = cache[node] = (held, json.dumps(held.to_json(), sort_keys=True, separators=(",", ":")))
        parts.append(known[1])
    for node in [n for n in cache if n not in holdings]:
        del cache[node]
    # The record's own fields around the nodes, sorted as json.dumps(sort_keys=True) sorts them.
    empty = json.dumps({**header(INVENTORY_KIND, INVENTORY_VERSION), "nodes": []}, sort_keys=True,
                       separators=(",", ":"))
    before, after = empty.split('"nodes":[]', 1)
    return before + '"nodes":[' + ",".join(parts) + "]" + after + "\n"


def write_inventory(job_dir: Path, text: str) -> Path:
    """Write an inventory (`inventory_text`) into `job_dir` atomically; its path."""
    return atomic_write(job_dir / INVENTORY_NAME, text, mode=0o600)


def read_inventory(path: Path) -> dict[str, CheckpointHoldings]:
    """Every node's holdings an inventory recorded; RecordError when it is damaged, too large, not a regular
    file or from a newer clusterctl."""
    body = check_header(read_json_record(path, limit=INVENTORY_LIMIT, follow_symlinks=False), INVENTORY_KIND,
                        INVENTORY_VERSION, str(path))
    refuse_unknown(body, frozenset({"kind", "version", "nodes"}), str(path))
    entries = field(body, "nodes", list, str(path))
    found: dict[str, CheckpointHoldings] = {}
    for i, entry in enumerate(entries):
        held = CheckpointHoldings.from_json(entry, f"{path}: nodes[{i}]")
        found[held.node] = held
    return found


def newest_inventory(run_dir: Path) -> Path | None:
    """The newest inventory a job of the run wrote (`<run>/jobs/*/`: the previous job's, or this job's own
    when an agent takes a job over), or None."""
    found = []
    try:
        jobs = list(os.scandir(run_dir / "jobs"))
    except OSError:
        return None
    for entry in jobs:
        path = Path(entry.path) / INVENTORY_NAME
        try:
            found.append((path.stat().st_mtime_ns, str(path)))
        except OSError:
            continue
    return Path(max(found)[1]) if found else None


# ---- complete.json: a checkpoint flushed whole ------------------------------------------------------

def write_complete(shared_dir: str | Path, flushed: FlushedCheckpoint) -> Path:
    """Mark `flushed.step` complete on shared storage; the file's path."""
    return atomic_write(step_dir(shared_dir, flushed.step) / COMPLETE_NAME, json.dumps(
        {**header(COMPLETE_KIND, COMPLETE_VERSION), "step": flushed.step, "slots": len(flushed.nodes),
         "nodes": list(flushed.nodes), "save_seconds": flushed.save_seconds}, sort_keys=True) + "\n")


def read_complete(path: Path) -> FlushedCheckpoint:
    """One complete.json (version 1 or 2); RecordError when it is damaged or from a newer clusterctl."""
    where = str(path)
    data = read_json_record(path, limit=COMPLETE_LIMIT, follow_symlinks=False)
    old = isinstance(data, dict) and data.get("version") == 1 and data.get("kind") == COMPLETE_KIND
    body = check_header(data, COMPLETE_KIND, 1 if old else COMPLETE_VERSION, where)
    refuse_unknown(body, COMPLETE_FIELDS_V1 if old else COMPLETE_FIELDS_V1 | {"save_seconds"}, where)
    if not old and "save_seconds" not in body:
        raise RecordError(where, "missing field `save_seconds` (null when no slot's save time is known)")
    save_seconds = None if old or body["save_seconds"] is None else seconds_field(body, "save_seconds", where)
    nodes = field(body, "nodes", list, where)
    if whole_field(body, "slots", where) != len(nodes) or not nodes:
        raise RecordError(where, f"field `slots` says {body['slots']}, `nodes` names {len(nodes)}")
    return FlushedCheckpoint(whole_field(body, "step", where),
                             tuple(node_field({"node": n}, "node", f"{where}: nodes[{i}]") for i, n in enumerate(nodes)),
                             save_seconds)


def flushed_checkpoints(shared_dir: str | Path) -> tuple[list[FlushedCheckpoint], list[str]]:
    """Every checkpoint marked complete on shared storage (oldest first), and a line for each marker that
    could not be read (such a checkpoint is not taken)."""
    good: list[FlushedCheckpoint] = []
    problems: list[str] = []
    try:
        names = sorted(e.name for e in os.scandir(Path(shared_dir) / TIERS_DIR) if _STEP_DIR.fullmatch(e.name))
    except OSError:
        return [], []
    for name in names:
        path = Path(shared_dir) / TIERS_DIR / name / COMPLETE_NAME
        try:
            flushed = read_complete(path)
        except FileNotFoundError:
            continue
        except (OSError, RecordError) as exc:
            problems.append(f"not taking {path}: {exc}")
            continue
        if f"step-{flushed.step:012d}" != name:
            problems.append(f"not taking {path}: it names step {flushed.step}")
            continue
        good.append(flushed)
    return good, problems


# ---- the copies a plan is made from ------------------------------------------------------------------

def copies_of(holdings: CheckpointHoldings) -> tuple[CheckpointManifest, ...]:
    """A node's holdings as the copies they are (shards not listed: they are verified where loaded)."""
    return tuple(CheckpointManifest(step=h.step, of_node=h.of_node, tier=h.tier,
                                    held_on=None if h.tier == "shared" else holdings.node, shards=(),
                                    written_at=h.written_at, save_seconds=h.save_seconds, slot=h.slot, slots=h.slots)
                 for h in holdings.copies)


def flushed_copies(flushed: FlushedCheckpoint) -> tuple[CheckpointManifest, ...]:
    """A checkpoint marked complete on shared storage as one shared copy per slot."""
    return tuple(CheckpointManifest(step=flushed.step, of_node=node, tier="shared", held_on=None, shards=(),
                                    written_at=0.0, save_seconds=0.0, slot=slot, slots=len(flushed.nodes))
                 for slot, node in enumerate(flushed.nodes))


def gone_from(copies: Iterable[CheckpointManifest], present: Iterable[str]) -> set[str]:
    """The nodes the copies name (whose part, or held where) that are not `present`: their tiers are gone."""
    named: set[str] = set()
    for copy in copies:
        named.add(copy.of_node)
        if copy.held_on is not None:
            named.add(copy.held_on)
    return named - set(present)


def tiers_checkpoint(plan: ResumePlan, shared_dir: str | Path) -> Checkpoint | None:
    """The checkpoint a plan chose (None: none), as the supervisor, the agent and `status` name it: its folder
    on shared storage (which holds it only once flushed) and what the nodes' tiers give of it (`from_tiers`)."""
    if plan.step is None:
        return None
    path = str(step_dir(shared_dir, plan.step))
    return Checkpoint(path, plan.step, "tiers", from_tiers=plan.from_tiers(path))
