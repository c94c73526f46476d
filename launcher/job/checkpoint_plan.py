"""The agent's side of multi-level checkpoints (docs/checkpoint-tiers.md): the resume plan across tiers,
and what a step is told about it.

What every node holds, the job's inventory and complete.json are `tier_holdings.TierHoldings`; where a
resume came from (the journal's `Resumed` line) is `resume_watch.ResumeWatch`.  Before each step the agent
plans the resume here (`resume_point`: the newest checkpoint complete across the tiers of the nodes
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
from pathlib import Path

from clusterctl.launcher.job.resume_watch import Resuming, ResumeWatch
# INVENTORY_EVERY stays importable from here: the bench compares this module across versions.
from clusterctl.launcher.job.tier_holdings import INVENTORY_EVERY as INVENTORY_EVERY
from clusterctl.launcher.job.tier_holdings import TierHoldings
from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.pure.checkpoint_tiers import (
    ResumePlan, buddy_map, holding_nodes, plan_resume_from_copies, slot_sources,
)
from clusterctl.launcher.pure.preflight import MASTER_PORTS
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.checkpoint_inventory import gone_from, tiers_checkpoint
from clusterctl.node_dir import node_tmp_base
from clusterctl.records.checkpoint_holdings import CheckpointHoldings
from clusterctl.records.checkpoint_settings import CheckpointSettings
from clusterctl.records.resume_failure import read_resume_failures
from clusterctl.records.run_journal import Resumed
from clusterctl.records.tier_index import FILE_NAME as TIER_INDEX_NAME
from clusterctl.records.tier_index import NONE, TierSlot, write_tier_index
from clusterctl.records.versioned import RecordError
from clusterctl.text import one_line


def run_key(run_dir: Path) -> str:
    """The run's name on a node's fast tier: 16 hex digits of its directory's path (the same for every job
    of the run, so a resubmitted job finds the copies its predecessor left on a node)."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


class TierPlanner:
    """One job's resume plans across checkpoint tiers, over what its nodes hold (`TierHoldings`) and with
    where each resume came from (`ResumeWatch`)."""

    def __init__(self, run_dir: Path, job_dir: Path, spec: JobSpec, environ: Mapping[str, str],
                 say: Callable[[str], None], monotonic: Callable[[], float] = time.monotonic) -> None:
        self.job_dir, self.spec, self.say = job_dir, spec, say
        shared = spec.checkpoint_dir(str(run_dir))
        if not shared:
            raise ValueError("multi-level checkpoints need [checkpoint] dir (the spec's check says so)")
        self.shared = shared
        self.local_base = spec.checkpoint.local_dir or str(node_tmp_base(environ))
        self.key = run_key(run_dir)
        self.held = TierHoldings(run_dir, job_dir, shared, say, monotonic)
        self.problems: dict[tuple[int, str, str, str | None], str] = {}
        """Copies a resume could not load (by checkpoint_tiers.copy_key), and why."""
        self.failed: dict[int, int] = {}
        """Failed resumes so far, by checkpoint step."""
        self.plan: ResumePlan | None = None
        self.resumes = ResumeWatch()

    # ---- what the nodes hold (TierHoldings) ------------------------------------------------------
    def load_previous(self) -> None:
        """Take the holdings the run's newest inventory records (see TierHoldings.load_previous)."""
        self.held.load_previous()

    def observe(self, holdings: Mapping[str, CheckpointHoldings]) -> None:
        """Take the nodes' newest holdings (from their reports) and mark every checkpoint now flushed whole; the
        inventory is written later (`record_due`, `record_pending`)."""
        self.held.observe(holdings)

    def record_due(self) -> None:
        """Write the job's inventory when holdings changed since it was written and it was written
        INVENTORY_EVERY s ago or more (the agent's periodic work: an agent that takes the job over, or the
        run's next job, finds holdings at most that old)."""
        self.held.record_due()

    def record_pending(self) -> None:
        """Write the job's inventory now when holdings changed since it was written: once a step is launched
        (at 12,500 nodes the ~10 MB take most of a second, kept off the recovery's critical path) and before
        the agent ends (the run's next job plans from it)."""
        self.held.record_pending()

    def record(self) -> None:
        """Write the job's inventory now, if it changed since it was last written."""
        self.held.record()

    # ---- resuming ---------------------------------------------------------------------------------
    def resume_point(self, present: Iterable[str]) -> Checkpoint | None:
        """Plan the next step's resume: the newest checkpoint complete across the tiers of the nodes
        `present` (any other node's copies count as gone) and checkpoints flushed whole to shared storage,
        every checkpoint passed over said; None: none (the program starts afresh).  The plan is kept for
        `launch_env`; the inventory is not written here (on the recovery's critical path): the agent writes
        it once the step is launched (`record_pending`).  The checkpoint's `path` is its folder on shared
        storage, which holds it only once flushed; its `from_tiers` says what the nodes' tiers give of it."""
        here = set(present)
        copies = self.held.copies()
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
        self.resumes.launched(plan.step, tuple(sources))
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

    # ---- where a resume came from (ResumeWatch) ---------------------------------------------------
    @property
    def resuming(self) -> Resuming | None:
        """The running step's resume, until its journal line is written."""
        return self.resumes.resuming

    def step_started(self, restart: int, started_at: float) -> None:
        """The step of the last `launch_env` started (as restart `restart`; 0: the job's first step) at
        `started_at` (epoch s): watch its nodes' holdings for their resumes of its checkpoint."""
        self.resumes.step_started(restart, started_at, self.held.holdings)

    def resume_line(self, holdings: Mapping[str, CheckpointHoldings], job_id: str, now: float, *,
                    step_ended: bool = False) -> Resumed | None:
        """The journal's line about the running step's resume (see ResumeWatch.resume_line)."""
        return self.resumes.resume_line(holdings, job_id, now, step_ended=step_ended)
