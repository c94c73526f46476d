"""What the agent knows the nodes hold in their checkpoint tiers, and what it writes about it
(docs/checkpoint-tiers.md).

The nodes' holdings reach the agent in their reports (no per-node file on shared storage, no Slurm
call); the agent keeps the newest of each node and records them in the job's inventory (one file per
job, rewritten at most every INVENTORY_EVERY seconds while they change, and once each step is launched or
before the agent ends: never one per node or per second, never between a failure and the step that
recovers from it), and for a checkpoint every slot of which has reached shared storage writes
`<shared>/tiers/step-<N>/complete.json` once (launcher/shared/checkpoint_inventory.py).  Which checkpoints
are flushed whole is `clusterctl.launcher.pure.checkpoint_tiers.flushed_whole`; this module reads and writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from clusterctl.launcher.pure.checkpoint_tiers import FlushedCheckpoint, flushed_whole
from clusterctl.launcher.shared.checkpoint_inventory import (
    copies_of, flushed_checkpoints, flushed_copies, inventory_text, newest_inventory, read_inventory, step_dir,
    write_complete, write_inventory,
)
from clusterctl.records.checkpoint_holdings import CheckpointHoldings
from clusterctl.records.checkpoint_manifest import CheckpointManifest
from clusterctl.records.versioned import RecordError
from clusterctl.text import one_line

INVENTORY_EVERY = 30.0
"""Seconds between two rewrites of the job's inventory while holdings keep changing (a checkpoint's pushes
and flushes reach the agent over a few heartbeats; at 12,500 nodes the inventory is ~10 MB)."""


class InventoryFile:
    """The job's inventory file (`<job>/` in launcher/shared/checkpoint_inventory.py): written when the
    holdings changed since it was, at most every INVENTORY_EVERY s, or now when asked."""

    def __init__(self, job_dir: Path, say: Callable[[str], None], monotonic: Callable[[], float]) -> None:
        self.job_dir, self.say, self.monotonic = job_dir, say, monotonic
        self.pending = False
        """The holdings changed since the file was written."""
        self._fragments: dict[str, tuple[CheckpointHoldings, str]] = {}
        """Per node, its holdings' text in the inventory (inventory_text's `fragments`)."""
        self._written = ""
        self._written_at = -INVENTORY_EVERY

    def write_due(self, holdings: Mapping[str, CheckpointHoldings]) -> None:
        """Write `holdings` when they changed and the file was written INVENTORY_EVERY s ago or more."""
        if self.pending and self.monotonic() - self._written_at >= INVENTORY_EVERY:
            self.write(holdings)

    def write_pending(self, holdings: Mapping[str, CheckpointHoldings]) -> None:
        """Write `holdings` now when they changed since the file was written."""
        if self.pending:
            self.write(holdings)

    def write(self, holdings: Mapping[str, CheckpointHoldings]) -> None:
        """Write `holdings` now, if their text changed since it was last written."""
        self.pending = False
        self._written_at = self.monotonic()
        text = inventory_text(holdings, self._fragments)
        if text == self._written:
            return
        try:
            write_inventory(self.job_dir, text)
            self._written = text
        except OSError as exc:
            self.say(f"cannot write the job's checkpoint inventory in {self.job_dir} ({exc.strerror}): a "
                     "resubmitted job resumes from the nodes' reports and shared storage only")


class TierHoldings:
    """Every node's newest checkpoint holdings, the checkpoints flushed whole to shared storage, and both
    as copies (checkpoint manifests) for a resume plan."""

    def __init__(self, run_dir: Path, job_dir: Path, shared: str, say: Callable[[str], None],
                 monotonic: Callable[[], float]) -> None:
        self.run_dir, self.shared, self.say = run_dir, shared, say
        self.holdings: dict[str, CheckpointHoldings] = {}
        """Every node's newest holdings (a node's holdings replace its earlier ones)."""
        self.completed: set[int] = set()
        """Steps whose complete.json is written (or found)."""
        self.inventory = InventoryFile(job_dir, say, monotonic)
        self._manifests: dict[str, tuple[CheckpointHoldings, tuple[CheckpointManifest, ...]]] = {}
        """Per node, its holdings as copies (`copies_of`), made when they are observed: a resume plan, on
        the recovery's critical path, does not convert (and check) 75,000 copies at 12,500 nodes again."""
        self._flushed: dict[FlushedCheckpoint, tuple[CheckpointManifest, ...]] = {}
        """Each checkpoint flushed whole as copies (`flushed_copies`), by its complete.json."""

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
        """Take the nodes' newest holdings (from their reports) and mark every checkpoint now flushed whole;
        the inventory is written later (`record_due`, `record_pending`)."""
        changed = False
        for node, held in holdings.items():
            if held.copies_refused is not None:
                # What a node's copy server refused is for the agent's summary only: a stranger's connections
                # must not rewrite the inventory on shared storage, nor take a resume plan's time.
                held = replace(held, copies_refused=None)
            before = self.holdings.get(node)
            if before is held or before == held:
                continue
            self.holdings[node] = held
            self._manifests[node] = (held, copies_of(held))
            changed = True
        if changed:
            self.inventory.pending = True
            self._mark_flushed()

    def record_due(self) -> None:
        """Write the job's inventory when holdings changed since it was written and it was written
        INVENTORY_EVERY s ago or more."""
        self.inventory.write_due(self.holdings)

    def record_pending(self) -> None:
        """Write the job's inventory now when holdings changed since it was written."""
        self.inventory.write_pending(self.holdings)

    def record(self) -> None:
        """Write the job's inventory now, if it changed since it was last written."""
        self.inventory.write(self.holdings)

    def copies(self) -> list[CheckpointManifest]:
        """Every copy a resume can read: the nodes' (as they report them) and those of each checkpoint
        flushed whole to shared storage now (its complete.json read there; a damaged one is said)."""
        copies: list[CheckpointManifest] = []
        for node, held in self.holdings.items():
            made = self._manifests.get(node)
            if made is None or made[0] is not held:  # taken from the previous job's inventory
                made = self._manifests[node] = (held, copies_of(held))
            copies.extend(made[1])
        flushed, problems = flushed_checkpoints(self.shared)
        for line in problems:
            self.say(line)
        self.completed.update(f.step for f in flushed)
        # Kept for the checkpoints on shared storage now only (one removed from there is forgotten).
        self._flushed = {checkpoint: self._flushed_copies(checkpoint) for checkpoint in flushed}
        for made_flushed in self._flushed.values():
            copies.extend(made_flushed)
        return copies

    def _flushed_copies(self, flushed: FlushedCheckpoint) -> tuple[CheckpointManifest, ...]:
        made = self._flushed.get(flushed)
        if made is None:
            made = self._flushed[flushed] = flushed_copies(flushed)
        return made

    def _mark_flushed(self) -> None:
        """complete.json for every checkpoint each slot of which some node reports flushed."""
        for checkpoint in flushed_whole(self.holdings.values(), self.completed):
            try:
                write_complete(self.shared, checkpoint)
                self.completed.add(checkpoint.step)
                self._flushed_copies(checkpoint)  # what the next plan reads back from complete.json
            except OSError as exc:
                self.say(f"cannot mark checkpoint {checkpoint.step} flushed in "
                         f"{step_dir(self.shared, checkpoint.step)} ({exc.strerror}); trying again at the next change")
