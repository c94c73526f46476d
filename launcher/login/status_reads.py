"""What `clusterctl status` reads of a run besides its journal, rank maps, agent summary and Slurm: its spec
(the total step count), its checkpoints (the newest complete one and, with multi-level checkpoints, where
its parts are held) and every job's step-time table (goodput's time lost to slow nodes).

`Looks` keeps each value with the stats (mtime, size) of the files it came from, taken before they were
read, and reads again only when one of them changed: `status --watch` stats them each interval and reads
nothing more while they stay the same.  The checkpoints are found as `report` and the supervisor find them
(launcher/shared/checkpoints.py: the newest complete one is the one a resubmission resumes from); with
multi-level checkpoints the newest one complete across tiers is the agent's plan over the nodes' holdings
(its inventory) and what is flushed whole to shared storage (launcher/shared/checkpoint_inventory.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from clusterctl.errors import RunError
from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.login.status import CheckpointStatus
from clusterctl.launcher.pure.checkpoint_tiers import parts_held, plan_resume_from_copies
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.checkpoint_inventory import (
    COMPLETE_NAME, INVENTORY_NAME, copies_of, flushed_copies, gone_from, newest_inventory, read_complete,
    read_inventory,
)
from clusterctl.launcher.shared.checkpoints import find_checkpoints, markers
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.records.checkpoint_holdings import CheckpointHoldings
from clusterctl.records.checkpoint_manifest import CheckpointManifest
from clusterctl.records.node_step_times import NodeStepTimes, read_node_step_times, step_times_path
from clusterctl.records.versioned import RecordError
from clusterctl.text import one_line

Stamp = tuple[int, int] | None
"""A file's (mtime_ns, size), None when it is not there."""
T = TypeVar("T")


def stamp(path: Path) -> Stamp:
    """The stat `Looks` compares: (mtime_ns, size), None when `path` is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def stamps(paths: Sequence[Path]) -> dict[Path, Stamp]:
    """Each path's stamp."""
    return {path: stamp(path) for path in paths}


@dataclass
class _Kept:
    stamps: Mapping[Path, Stamp]
    also: Hashable
    value: Any
    trigger: bool


class Looks:
    """Values read from files, read again only when a stat of those files changed (or `also`, what else the
    value was made from, differs)."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}

    def value(self, key: str, read: Callable[[], tuple[T, Mapping[Path, Stamp]]], *, also: Hashable = None,
              trigger: bool = True) -> T:
        """The value under `key`: the one kept while the files it came from are unchanged, else `read()`'s,
        which returns it with those files' stamps taken before it read them.  `trigger`: a change of those
        files is worth a new look (`changed`)."""
        kept = self._kept.get(key)
        if kept is not None and kept.also == also and all(stamp(p) == s for p, s in kept.stamps.items()):
            return kept.value
        value, read_stamps = read()
        self._kept[key] = _Kept(dict(read_stamps), also, value, trigger)
        return value

    def kept(self, key: str) -> Any:
        """The value last read under `key` (None: never read)."""
        kept = self._kept.get(key)
        return kept.value if kept is not None else None

    def changed(self) -> bool:
        """True when a file a triggering value came from changed since it was read (one stat each)."""
        return any(stamp(p) != s for kept in self._kept.values() if kept.trigger for p, s in kept.stamps.items())

    def watched(self) -> list[Path]:
        """The files `changed` stats."""
        return [p for kept in self._kept.values() if kept.trigger for p in kept.stamps]


# ---- the spec -------------------------------------------------------------------------------------------

def run_spec(looks: Looks, run: RunDir, say: Callable[[str], None]) -> JobSpec | None:
    """The run's spec (None, said once, when it cannot be read)."""
    def read() -> tuple[JobSpec | None, Mapping[Path, Stamp]]:
        before = stamps([run.path / "spec.json"])
        try:
            return run.spec(), before
        except (RunError, RecordError, OSError) as exc:
            say(f"note: {one_line(str(exc))[:300]}; no ETA, checkpoints or goodput without the run's spec")
            return None, before
    return looks.value("spec", read, trigger=False)


# ---- the step-time tables --------------------------------------------------------------------------------

def slow_node_seconds(looks: Looks, run: RunDir, job_ids: Sequence[str]) -> float:
    """The seconds the jobs `job_ids` lost to slow nodes, from their step-time tables (as `report` counts
    them; a damaged table counts nothing: `status` names the latest job's)."""
    total = 0.0
    for job_id in job_ids:
        table = looks.value(f"step-times {job_id}", partial(_step_times, run.job_dir(job_id)), trigger=False)
        total += table.lost_s if table is not None else 0.0
    return total


def _step_times(job_dir: Path) -> tuple[NodeStepTimes | None, Mapping[Path, Stamp]]:
    before = stamps([step_times_path(job_dir)])
    try:
        return read_node_step_times(job_dir), before
    except RecordError:
        return None, before


# ---- the checkpoints ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunCheckpoints:
    """What status knows of a run's checkpoints: the newest (`newest`) and every complete one in the directory
    (oldest first: goodput's times of the work redone)."""

    newest: CheckpointStatus
    complete: tuple[Checkpoint, ...]


def run_checkpoints(looks: Looks, run: RunDir, spec: JobSpec, job_id: str | None, present: Sequence[str] | None,
                    say: Callable[[str], None]) -> RunCheckpoints | None:
    """The run's checkpoints (None: the spec names no checkpoint directory).  `job_id`: the run's latest job
    (whose inventory holds the nodes' holdings); `present`: the nodes that job has now (None: not running; every
    node's copies then count).

    The directory is read again when `checkpoints.markers` shows a change (a checkpoint renamed into place, a
    marker written in a newer candidate); with tiers, the job's inventory when its stat changed."""
    directory = spec.checkpoint_dir(str(run.path))
    if not directory:
        return None
    validator = spec.checkpoint.recognised_by
    previous = looks.kept("checkpoints")
    above = previous[-1].step if previous else None

    def read() -> tuple[tuple[Checkpoint, ...], Mapping[Path, Stamp]]:
        marked = markers(Path(directory), validator, above)
        before = stamps([path for path, _ in marked])
        complete, _ = find_checkpoints(Path(directory), validator)
        best = complete[-1].step if complete else None
        return tuple(complete), {path: before[path] for path, step in marked
                                 if step is None or best is None or step > best}
    complete: tuple[Checkpoint, ...] = looks.value("checkpoints", read)
    best = complete[-1] if complete else None
    if validator != "tiers":
        return RunCheckpoints(CheckpointStatus(directory, validator, len(complete), best.step if best else None,
                                               best.path if best else None, best.written_at if best else None),
                              complete)
    newest = looks.value("tiers", lambda: _across_tiers(run, directory, best, len(complete), job_id, present, say),
                         also=(best, job_id, tuple(present) if present is not None else None))
    return RunCheckpoints(newest, complete)


def _across_tiers(run: RunDir, directory: str, flushed: Checkpoint | None, flushed_count: int, job_id: str | None,
                  present: Sequence[str] | None, say: Callable[[str], None]
                  ) -> tuple[CheckpointStatus, Mapping[Path, Stamp]]:
    """The newest checkpoint complete across tiers, planned as the agent plans a resume: from the nodes'
    holdings in the job's inventory (the previous job's until this one writes its own) and the newest
    checkpoint flushed whole (`flushed`), the nodes not `present` gone."""
    own = run.job_dir(job_id) / INVENTORY_NAME if job_id is not None else None
    path = own if own is not None and own.exists() else newest_inventory(run.path)
    read_stamps = stamps([p for p in (own, path) if p is not None])
    holdings: dict[str, CheckpointHoldings] = {}
    if path is not None:
        try:
            holdings = read_inventory(path)
        except (OSError, RecordError) as exc:
            say(f"note: {one_line(str(exc))[:300]}: the nodes' checkpoint copies are not counted")
    copies: list[CheckpointManifest] = [copy for held in holdings.values() for copy in copies_of(held)]
    if flushed is not None:
        try:  # one complete.json: a checkpoint older than the newest flushed whole is never the newest complete
            copies.extend(flushed_copies(read_complete(Path(flushed.path) / COMPLETE_NAME)))
        except (OSError, RecordError) as exc:
            say(f"note: {one_line(str(exc))[:300]}")
    gone = gone_from(copies, present) if present is not None else set()
    plan = plan_resume_from_copies(copies, gone=gone)
    flushed_step = flushed.step if flushed is not None else None
    if plan.step is None:
        return CheckpointStatus(directory, "tiers", flushed_count, flushed_step=flushed_step), read_stamps
    held = parts_held(copies, plan.step, gone)
    on_shared = flushed is not None and flushed.step == plan.step
    written_at = held.saved_at if held.saved_at is not None or not on_shared or flushed is None else flushed.written_at
    return CheckpointStatus(directory, "tiers", flushed_count, plan.step, flushed.path if on_shared and flushed else None,
                            written_at, held, flushed_step), read_stamps
