"""The agent's side of multi-level checkpoints (docs/checkpoint-tiers.md): what every node holds, the
resume plan across tiers, and what a step is told about it.

The nodes' holdings reach the agent in their reports (no per-node file on shared storage, no Slurm
call); the agent keeps the newest of each node, and once per change writes them to
`<job dir>/checkpoint-inventory.json` (one file per job: a resubmitted job reads its predecessor's,
so a resume after resubmission can take copies from the nodes it got again) and, for a checkpoint
every slot of which has reached shared storage, `<shared>/tiers/step-<N>/complete.json` (one file per
flushed checkpoint, what the supervisor's `tiers` validator looks for).  Deciding is
`clusterctl.launcher.pure.checkpoint_tiers`; this module reads and writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from clusterctl.files import atomic_write
from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.pure.checkpoint_tiers import (
    ResumePlan, buddy_map, copy_key, plan_resume, resume_facts, slot_sources,
)
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.node_dir import node_tmp_base
from clusterctl.records.checkpoint_holdings import CheckpointHoldings
from clusterctl.records.checkpoint_manifest import CheckpointManifest
from clusterctl.records.checkpoint_settings import CheckpointSettings
from clusterctl.records.resume_failure import read_resume_failures
from clusterctl.records.tier_index import TierSlot, write_tier_index
from clusterctl.records.versioned import RecordError, header
from clusterctl.text import one_line

INVENTORY = "checkpoint-inventory.json"
INVENTORY_KIND = "checkpoint-inventory"
INVENTORY_VERSION = 1
COMPLETE = "complete.json"
TIERS_DIR = "tiers"
HOLDINGS_PATH_ENV = "CLUSTERCTL_CHECKPOINT_HOLDINGS"
PORTS = (20000, 32767)
"""The range a step's copy servers' port is drawn from (the rendezvous port's: clusterctl.launcher.pure.preflight)."""


def run_key(run_dir: Path) -> str:
    """The run's name on a node's fast tier: 16 hex digits of its directory's path (plain, the same for every job
    of the run, so a resubmitted job finds the copies its predecessor left on a node)."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


def step_dir(shared: str, step: int) -> Path:
    """The shared tier's folder of one checkpoint."""
    return Path(shared) / TIERS_DIR / f"step-{step:012d}"


class TierPlanner:
    """One job's inventory of checkpoint copies and its resume plans."""

    def __init__(self, run_dir: Path, job_dir: Path, spec: JobSpec, environ: Mapping[str, str],
                 say: Callable[[str], None]) -> None:
        self.run_dir, self.job_dir, self.spec, self.say = run_dir, job_dir, spec, say
        self.shared = spec.checkpoint_dir(str(run_dir)) or ""
        self.local_base = spec.checkpoint.local_dir or str(node_tmp_base(environ))
        self.key = run_key(run_dir)
        self.held: dict[str, tuple[CheckpointManifest, ...]] = {}
        """Every node's copies, from its newest holdings (a node's holdings replace its earlier ones)."""
        self.problems: dict[tuple[int, str, str, str | None], str] = {}
        self.failed: dict[int, int] = {}
        self.completed: set[int] = set()
        self.plan: ResumePlan | None = None
        self._written = ""

    # ---- what the nodes hold ---------------------------------------------------------------------
    def load_previous(self) -> None:
        """Take the holdings the run's earlier jobs recorded (the newest inventory of another job)."""
        found = []
        for path in (self.run_dir / "jobs").glob(f"*/{INVENTORY}"):
            if path.parent != self.job_dir:
                try:
                    found.append((path.stat().st_mtime, path))
                except OSError:
                    continue
        if not found:
            return
        path = max(found)[1]
        try:
            for node, copies in read_inventory(path).items():
                self.held.setdefault(node, copies)
        except (OSError, RecordError) as exc:
            self.say(f"cannot read the previous job's checkpoint inventory {path} ({one_line(str(exc))}): "
                     "resuming from shared storage only")

    def observe(self, holdings: Mapping[str, CheckpointHoldings]) -> None:
        """Take the nodes' newest holdings (from their reports); record the inventory and every checkpoint
        flushed whole, when anything changed."""
        changed = False
        for node, held in holdings.items():
            copies = manifests_of(held)
            if self.held.get(node) != copies:
                self.held[node] = copies
                changed = True
        if changed:
            self._record()

    def _record(self) -> None:
        document = json.dumps({**header(INVENTORY_KIND, INVENTORY_VERSION),
                               "nodes": {node: [m.to_json() for m in copies]
                                         for node, copies in sorted(self.held.items())}}, sort_keys=True)
        if document != self._written:
            try:
                atomic_write(self.job_dir / INVENTORY, document + "\n")
                self._written = document
            except OSError as exc:
                self.say(f"cannot write {self.job_dir / INVENTORY} ({exc.strerror}): a resubmitted job resumes "
                         "from shared storage only")
        for step in sorted(self._flushed_whole() - self.completed):
            try:
                atomic_write(step_dir(self.shared, step) / COMPLETE,
                             json.dumps({"kind": "checkpoint-flushed", "version": 1, "step": step,
                                         "slots": self._slots_of(step)}) + "\n")
                self.completed.add(step)
            except OSError as exc:
                self.say(f"cannot mark step {step} flushed in {step_dir(self.shared, step)} ({exc.strerror})")

    def _copies(self) -> list[CheckpointManifest]:
        return [m for copies in self.held.values() for m in copies]

    def _slots_of(self, step: int) -> int:
        return max((m.slots for m in self._copies() if m.step == step), default=0)

    def _flushed_whole(self) -> set[int]:
        shared: dict[int, set[int]] = {}
        for m in self._copies():
            if m.tier == "shared":
                shared.setdefault(m.step, set()).add(m.slot)
        return {step for step, slots in shared.items() if len(slots) == self._slots_of(step)}

    # ---- resuming ---------------------------------------------------------------------------------
    def resume_point(self, present: Iterable[str]) -> Checkpoint | None:
        """The newest checkpoint complete across the tiers of the nodes `present` (any other node's copies
        count as gone), every checkpoint passed over said; None: none (the program starts afresh)."""
        here = set(present)
        gone = {n for m in self._copies() for n in (m.of_node, m.held_on) if n is not None and n not in here}
        facts = resume_facts(self._copies(), gone=gone, problems=self.problems, failed_resumes=self.failed)
        self.plan = plan_resume(facts)
        for line in self.plan.lines():
            self.say(line)
        if self.plan.step is None:
            return None
        return Checkpoint(str(step_dir(self.shared, self.plan.step)), self.plan.step, "tiers")

    def resume_failed(self, launch_dir: Path) -> list[str]:
        """What the nodes of the step in `launch_dir` said when they could not load its checkpoint (each
        failure counted against that checkpoint, the copies that failed remembered as bad)."""
        said = []
        try:
            failures = read_resume_failures(launch_dir)
        except (OSError, RecordError) as exc:
            return [f"cannot read the step's resume failures: {one_line(str(exc))}"]
        steps = set()
        for failure in failures:
            steps.add(failure.step)
            for bad in failure.bad_copies:
                self.problems[bad.key] = bad.problem
            said.append(f"{failure.node} could not load step {failure.step}: {one_line(failure.why)}")
        for step in steps:
            self.failed[step] = self.failed.get(step, 0) + 1
        return said

    def launch_env(self, launch_dir: Path, slots: Sequence[str], leaf_of: Mapping[str, str]) -> dict[str, str]:
        """Write the step's tier index and return what its processes need in their environment."""
        buddies = buddy_map(slots, leaf_of)
        plan = self.plan or ResumePlan(None)
        try:
            sources = slot_sources(plan, slots, buddies)
        except ValueError as exc:
            self.say(f"{exc}: the step starts from its beginning")
            plan = ResumePlan(None)
            sources = slot_sources(plan, slots, buddies)
        index = launch_dir / "tiers.idx"
        write_tier_index(index, plan.step, [TierSlot(s.node, s.buddy or "-", s.tier or "-", s.of_node or "-",
                                                     s.held_on or "-") for s in sources])
        c = self.spec.checkpoint
        settings = CheckpointSettings(
            run_key=self.key, local_base=self.local_base, shared_dir=self.shared, tier_index=str(index),
            port=PORTS[0] + secrets.randbelow(PORTS[1] - PORTS[0] + 1), keep=c.keep,
            flush_every_steps=c.flush_every_steps, flush_at_end=c.flush_at_end,
            local_budget_bytes=int(c.local_budget_gb * 1e9), shared_bytes_per_second=c.shared_mb_per_s * 1e6,
            resume_step=plan.step)
        holdings = Path(self.local_base) / f"clusterctl-{os.getuid()}" / f"ckpt-{self.key}" / "holdings.json"
        return {**settings.to_env(), HOLDINGS_PATH_ENV: str(holdings)}


def manifests_of(holdings: CheckpointHoldings) -> tuple[CheckpointManifest, ...]:
    """A node's holdings as the copies they are (shards not listed: they are verified where loaded)."""
    return tuple(CheckpointManifest(step=h.step, of_node=h.of_node, tier=h.tier,
                                    held_on=None if h.tier == "shared" else holdings.node, shards=(),
                                    written_at=h.written_at, save_seconds=h.save_seconds, slot=h.slot, slots=h.slots)
                 for h in holdings.copies)


def read_inventory(path: Path) -> dict[str, tuple[CheckpointManifest, ...]]:
    """The copies an earlier job of the run recorded, by the node holding them (RecordError when damaged
    or from a newer clusterctl)."""
    from clusterctl.records.versioned import check_header, read_json_record
    body = check_header(read_json_record(path, limit=256 << 20), INVENTORY_KIND, INVENTORY_VERSION, str(path))
    nodes = body.get("nodes")
    if not isinstance(nodes, dict) or not all(isinstance(v, list) for v in nodes.values()):
        raise RecordError(str(path), "field `nodes` must map node names to lists of copies")
    return {str(node): tuple(CheckpointManifest.from_json(m, f"{path}: nodes.{node}") for m in copies)
            for node, copies in nodes.items()}


def copy_keys(copies: Iterable[CheckpointManifest]) -> set[tuple[int, str, str, str | None]]:
    """The keys of `copies` (see `checkpoint_tiers.copy_key`)."""
    return {copy_key(m) for m in copies}
