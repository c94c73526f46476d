"""The agent's side of multi-level checkpoints (docs/checkpoint-tiers.md): what every node holds, the
resume plan across tiers, and what a step is told about it.

The nodes' holdings reach the agent in their reports (no per-node file on shared storage, no Slurm
call); the agent keeps the newest of each node and records them in the job's inventory (one file per
job, rewritten at most every INVENTORY_EVERY seconds while they change, and once each step is launched or
before the agent ends: never one per node or per second, never between a failure and the step that
recovers from it), and for a checkpoint every slot of which has reached shared storage writes
`<shared>/tiers/step-<N>/complete.json` once (launcher/shared/checkpoint_inventory.py).  Before each
step it plans the resume (`resume_point`: the newest checkpoint complete across the tiers of the nodes
present), writes the step's tier index (`launch_env`: per slot its node, its buddy and where its part of
the checkpoint is) and hands the step its settings; when a step ends because nodes could not load their
part (`resume_failed`), the bad copies are remembered and the failed resume counted, so the next plan
takes the next tier, and after two failures the last flushed checkpoint.  Deciding is
`clusterctl.launcher.pure.checkpoint_tiers`; this module reads and writes.

The node tier's folder (`local_dir` in the spec, else the agent's own node-local base: $CLUSTERCTL_NODE_TMP,
/dev/shm, $TMPDIR or /tmp, as `clusterctl.node_dir.node_tmp_base` picks it on the batch host) is one path
for every node of the step: a cluster whose nodes differ there (/dev/shm missing on some, another
$TMPDIR) must set `checkpoint.local_dir`.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.pure.checkpoint_tiers import (
    ResumePlan, SlotSource, buddy_map, holding_nodes, plan_resume_from_copies, resume_said, resumed_event,
    slot_sources,
)
from clusterctl.launcher.pure.preflight import MASTER_PORTS
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.checkpoint_inventory import (
    FlushedCheckpoint, copies_of, flushed_checkpoints, flushed_copies, gone_from, inventory_text, newest_inventory,
    read_inventory, step_dir, tiers_checkpoint, write_complete, write_inventory,
)
from clusterctl.node_dir import node_tmp_base
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, LastResume
from clusterctl.records.checkpoint_manifest import CheckpointManifest
from clusterctl.records.checkpoint_settings import CheckpointSettings
from clusterctl.records.resume_failure import read_resume_failures
from clusterctl.records.run_journal import Resumed
from clusterctl.records.tier_index import FILE_NAME as TIER_INDEX_NAME
from clusterctl.records.tier_index import NONE, TierSlot, write_tier_index
from clusterctl.records.versioned import RecordError
from clusterctl.text import one_line

INVENTORY_EVERY = 30.0
"""Seconds between two rewrites of the job's inventory while holdings keep changing (a checkpoint's pushes
and flushes reach the agent over a few heartbeats; at 12,500 nodes the inventory is ~10 MB)."""


def run_key(run_dir: Path) -> str:
    """The run's name on a node's fast tier: 16 hex digits of its directory's path (the same for every job
    of the run, so a resubmitted job finds the copies its predecessor left on a node)."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


@dataclass
class Resuming:
    """A step resuming from checkpoint `step` (started as restart `restart` at `started_at`, epoch s): where
    its slots' parts were planned to come from, each node's resume from before the step (an earlier launch's)
    and the resumes of this step its nodes said so far."""

    step: int
    sources: tuple[SlotSource, ...]
    restart: int
    started_at: float
    before: dict[str, LastResume | None]
    said: dict[str, LastResume] = field(default_factory=dict)


class TierPlanner:
    """One job's inventory of checkpoint copies and its resume plans."""

    def __init__(self, run_dir: Path, job_dir: Path, spec: JobSpec, environ: Mapping[str, str],
                 say: Callable[[str], None], monotonic: Callable[[], float] = time.monotonic) -> None:
        self.run_dir, self.job_dir, self.spec, self.say, self.monotonic = run_dir, job_dir, spec, say, monotonic
        shared = spec.checkpoint_dir(str(run_dir))
        if not shared:
            raise ValueError("multi-level checkpoints need [checkpoint] dir (the spec's check says so)")
        self.shared = shared
        self.local_base = spec.checkpoint.local_dir or str(node_tmp_base(environ))
        self.key = run_key(run_dir)
        self.holdings: dict[str, CheckpointHoldings] = {}
        """Every node's newest holdings (a node's holdings replace its earlier ones)."""
        self.problems: dict[tuple[int, str, str, str | None], str] = {}
        """Copies a resume could not load (by checkpoint_tiers.copy_key), and why."""
        self.failed: dict[int, int] = {}
        """Failed resumes so far, by checkpoint step."""
        self.completed: set[int] = set()
        """Steps whose complete.json is written (or found)."""
        self.plan: ResumePlan | None = None
        self.resuming: Resuming | None = None
        """The running step's resume, until its journal line is written."""
        self._launched: tuple[int, tuple[SlotSource, ...]] | None = None
        self._manifests: dict[str, tuple[CheckpointHoldings, tuple[CheckpointManifest, ...]]] = {}
        """Per node, its holdings as copies (`copies_of`), made when they are observed: a resume plan, on
        the recovery's critical path, does not convert (and check) 75,000 copies at 12,500 nodes again."""
        self._flushed: dict[FlushedCheckpoint, tuple[CheckpointManifest, ...]] = {}
        """Each checkpoint flushed whole as copies (`flushed_copies`), by its complete.json."""
        self._fragments: dict[str, tuple[CheckpointHoldings, str]] = {}
        """Per node, its holdings' text in the inventory (inventory_text's `fragments`)."""
        self._written = ""
        self._pending = False
        self._written_at = -INVENTORY_EVERY

    # ---- what the nodes hold ---------------------------------------------------------------------
    def load_previous(self) -> None:
        """Take the holdings the run's newest inventory records (the previous job's; this job's own for an
        agent that takes the job over); a damaged one is said and ignored (the nodes' reports and shared
        storage are planned from)."""
        path = newest_inventory(self.run_dir)
        if path is None:
            return
        try:
            found = read_inventory(path)
        except (OSError, RecordError) as exc:
            self.say(f"ignoring the checkpoint inventory ({one_line(str(exc))[:300]}): planning from "
                     "what the nodes report and what is flushed to shared storage")
            return
        for node, held in found.items():
            self.holdings.setdefault(node, held)

    def observe(self, holdings: Mapping[str, CheckpointHoldings]) -> None:
        """Take the nodes' newest holdings (from their reports) and mark every checkpoint now flushed whole; the
        inventory is written later (`record_due`, `record_pending`)."""
        changed = False
        for node, held in holdings.items():
            before = self.holdings.get(node)
            if before is held or before == held:
                continue
            self.holdings[node] = held
            self._manifests[node] = (held, copies_of(held))
            changed = True
        if changed:
            self._pending = True
            self._mark_flushed()

    def record_due(self) -> None:
        """Write the job's inventory when holdings changed since it was written and it was written
        INVENTORY_EVERY s ago or more (the agent's periodic work: an agent that takes the job over, or the
        run's next job, finds holdings at most that old)."""
        if self._pending and self.monotonic() - self._written_at >= INVENTORY_EVERY:
            self.record()

    def record_pending(self) -> None:
        """Write the job's inventory now when holdings changed since it was written: once a step is launched
        (at 12,500 nodes the ~10 MB take most of a second, kept off the recovery's critical path) and before
        the agent ends (the run's next job plans from it)."""
        if self._pending:
            self.record()

    def record(self) -> None:
        """Write the job's inventory now, if it changed since it was last written."""
        self._pending = False
        self._written_at = self.monotonic()
        text = inventory_text(self.holdings, self._fragments)
        if text == self._written:
            return
        try:
            write_inventory(self.job_dir, text)
            self._written = text
        except OSError as exc:
            self.say(f"cannot write the job's checkpoint inventory in {self.job_dir} ({exc.strerror}): a "
                     "resubmitted job resumes from the nodes' reports and shared storage only")

    def _copies(self) -> list[CheckpointManifest]:
        copies: list[CheckpointManifest] = []
        for node, held in self.holdings.items():
            made = self._manifests.get(node)
            if made is None or made[0] is not held:  # taken from the previous job's inventory
                made = self._manifests[node] = (held, copies_of(held))
            copies.extend(made[1])
        return copies

    def _flushed_copies(self, flushed: FlushedCheckpoint) -> tuple[CheckpointManifest, ...]:
        made = self._flushed.get(flushed)
        if made is None:
            made = self._flushed[flushed] = flushed_copies(flushed)
        return made

    def _mark_flushed(self) -> None:
        """complete.json for every checkpoint each slot of which some node reports flushed."""
        flushed: dict[int, dict[int, str]] = {}
        slots: dict[int, int] = {}
        stall: dict[int, float] = {}  # the slowest slot's save: what training waited for
        for held in self.holdings.values():
            for c in held.copies:
                if c.tier == "shared" and c.step not in self.completed:
                    flushed.setdefault(c.step, {})[c.slot] = c.of_node
                    slots[c.step] = max(slots.get(c.step, 0), c.slots)
                    stall[c.step] = max(stall.get(c.step, 0.0), c.save_seconds)
        for step in sorted(flushed):
            by_slot = flushed[step]
            if sorted(by_slot) != list(range(slots[step])):
                continue
            try:
                checkpoint = FlushedCheckpoint(step, tuple(by_slot[s] for s in range(slots[step])), stall[step])
                write_complete(self.shared, checkpoint)
                self.completed.add(step)
                self._flushed_copies(checkpoint)  # what the next plan reads back from complete.json
            except OSError as exc:
                self.say(f"cannot mark checkpoint {step} flushed in {step_dir(self.shared, step)} ({exc.strerror}); "
                         "trying again at the next change")

    # ---- resuming ---------------------------------------------------------------------------------
    def resume_point(self, present: Iterable[str]) -> Checkpoint | None:
        """Plan the next step's resume: the newest checkpoint complete across the tiers of the nodes
        `present` (any other node's copies count as gone) and checkpoints flushed whole to shared storage,
        every checkpoint passed over said; None: none (the program starts afresh).  The plan is kept for
        `launch_env`; the inventory is not written here (on the recovery's critical path): the agent writes
        it once the step is launched (`record_pending`).  The checkpoint's `path` is its folder on shared
        storage, which holds it only once flushed; its `from_tiers` says what the nodes' tiers give of it."""
        here = set(present)
        copies = self._copies()
        flushed, problems = flushed_checkpoints(self.shared)
        for line in problems:
            self.say(line)
        self.completed.update(f.step for f in flushed)
        # Kept for the checkpoints on shared storage now only (one removed from there is forgotten).
        self._flushed = {checkpoint: self._flushed_copies(checkpoint) for checkpoint in flushed}
        for made in self._flushed.values():
            copies.extend(made)
        self.plan = plan_resume_from_copies(copies, gone=gone_from(copies, here), problems=self.problems,
                                            failed_resumes=self.failed)
        for line in self.plan.lines():
            self.say(line)
        return tiers_checkpoint(self.plan, self.shared)

    def holders(self) -> frozenset[str]:
        """The nodes whose tiers hold a copy the last plan reads (they must run ranks: see nodes_for_map)."""
        return holding_nodes(self.plan) if self.plan is not None else frozenset()

    def resume_failed(self, launch_dir: Path) -> list[str]:
        """What the nodes of the step in `launch_dir` said when they could not load its checkpoint (each
        step failed counted once against that checkpoint, the copies that failed remembered as bad); []
        when none said anything (the step failed otherwise)."""
        try:
            failures = read_resume_failures(launch_dir)
        except (OSError, RecordError) as exc:
            # A node did write a failure (the folder is there): count it against the planned checkpoint.
            step = self.plan.step if self.plan is not None else None
            if step is not None:
                self.failed[step] = self.failed.get(step, 0) + 1
            return [f"a node could not load checkpoint {step} and its failure record cannot be read "
                    f"({one_line(str(exc))[:300]})"]
        said: list[str] = []
        steps = set()
        for failure in failures:
            steps.add(failure.step)
            for bad in failure.bad_copies:
                self.problems[bad.key] = bad.problem
            if len(said) < 5:
                said.append(f"{failure.node} could not load checkpoint {failure.step}: {one_line(failure.why)[:300]}")
        if len(failures) > len(said):
            said.append(f"and {len(failures) - len(said)} more nodes")
        for step in steps:
            self.failed[step] = self.failed.get(step, 0) + 1
        return said

    def launch_env(self, launch_dir: Path, slots: Sequence[str], leaf_of: Mapping[str, str],
                   avoid_port: int = 0) -> dict[str, str]:
        """Write the step's tier index (from the last plan; a fresh start without one) and return what its
        processes need in their environment: the settings, and the holdings file for the reporter.
        `avoid_port`: the step's rendezvous port (the copy servers' port is drawn from the same range)."""
        buddies = buddy_map(slots, leaf_of)
        plan = self.plan or ResumePlan(None)
        try:
            sources = slot_sources(plan, slots, buddies)
        except ValueError as exc:
            self.say(f"{exc}: its parts cannot be given to the new map's slots; the step starts from its beginning")
            plan = ResumePlan(None)
            sources = slot_sources(plan, slots, buddies)
        self._launched = (plan.step, tuple(sources)) if plan.step is not None else None
        index = write_tier_index(launch_dir / TIER_INDEX_NAME, plan.step, [
            TierSlot(s.node, s.buddy or NONE, s.tier or NONE, s.of_node or NONE, s.held_on or NONE) for s in sources])
        port = avoid_port
        while port == avoid_port:
            port = MASTER_PORTS[secrets.randbelow(len(MASTER_PORTS))]
        c = self.spec.checkpoint
        settings = CheckpointSettings(
            run_key=self.key, local_base=self.local_base, shared_dir=self.shared, tier_index=str(index), port=port,
            keep=c.keep, flush_every_steps=c.flush_every_steps, flush_at_end=c.flush_at_end,
            local_budget_bytes=int(c.local_budget_gb * 1e9), shared_bytes_per_second=c.shared_mb_per_s * 1e6,
            resume_step=plan.step)
        return settings.to_env()

    # ---- where a resume came from ----------------------------------------------------------------
    def step_started(self, restart: int, started_at: float) -> None:
        """The step of the last `launch_env` started (as restart `restart`; 0: the job's first step) at
        `started_at` (epoch s): watch its nodes' holdings for their resumes of its checkpoint."""
        launched, self._launched = self._launched, None
        self.resuming = None
        if launched is None:
            return
        step, sources = launched
        before = {s.node: held.last_resume if (held := self.holdings.get(s.node)) is not None else None
                  for s in sources}
        self.resuming = Resuming(step, sources, restart, started_at, before)

    def resume_line(self, holdings: Mapping[str, CheckpointHoldings], job_id: str, now: float, *,
                    step_ended: bool = False) -> Resumed | None:
        """The journal's line about the running step's resume, once every node of the step said its resume
        in its holdings (or, `step_ended`, with what they said: the rest as planned); None while waiting,
        when the step resumed from nothing, or once the line was given."""
        r = self.resuming
        if r is None:
            return None
        waiting = [s.node for s in r.sources if s.node not in r.said]
        r.said.update(resume_said(holdings, waiting, r.step, r.started_at, r.before))
        if len(r.said) < len(r.sources) and not step_ended:
            return None
        self.resuming = None
        return resumed_event(at=now, job_id=job_id, restart=r.restart, step=r.step, planned=r.sources, said=r.said)
