"""The training program's side of multi-level checkpoints: `Checkpointer` (docs/checkpoint-tiers.md).

    ckpt = Checkpointer.from_env()          # None outside a clusterctl job with tiers on
    resume = ckpt.resume()                  # None, or Resume(step, directory): this slot's files, verified
    with ckpt.save_files(step) as d:        # every local rank of the node, the same step
        (d / f"rank-{rank}.json").write_text(...)
    ckpt.close()

A save returns once this rank's part is written (the last local rank to finish commits the node's
copy); local rank 0's background thread then sends the copy to the node's buddy, flushes it to
shared storage when due, applies retention and rewrites holdings.json.  A save never raises into
training because of a tier: what goes wrong is said once on stderr and the copy is not marked
complete.  Moving copies between nodes goes through a `CopyTransport` (TCP by default, imported
only when used), so tests pass a fake.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from clusterctl.checkpoint.copies import (
    MANIFEST_NAME,
    CopyError,
    ReceivedCopy,
    copy_verified,
    link_shards,
    shards_of,
    verify_copy,
)
from clusterctl.checkpoint.flush import Throttle, flush_copy
from clusterctl.checkpoint.tier import (
    abandoned_copies,
    LOCAL,
    NodeTier,
    TierRootError,
    attempt_token,
    budget_bytes,
    commit_copy,
    flocked,
    flush_due,
    mark_done,
    open_tier_root,
    plan_room,
    publish_once,
    shared_copy_dir,
    slot_name,
    step_name,
)
from clusterctl.errors import ClusterctlError
from clusterctl.records.checkpoint_holdings import LastResume
from clusterctl.records.checkpoint_manifest import CheckpointManifest, read_checkpoint_manifest
from clusterctl.records.checkpoint_settings import SETTINGS_ENV, CheckpointSettings
from clusterctl.records.node_report import parse_key
from clusterctl.records.resume_failure import EXIT_RESUME_FAILED, BadCopy, ResumeFailure, write_resume_failure
from clusterctl.records.tier_index import TierSlot, read_tier_slot
from clusterctl.records.versioned import RecordError

REPORT_KEY_ENV = "CLUSTERCTL_REPORT_KEY"
TRANSFER_TIMEOUT = 120.0
"""Seconds a push to the buddy or a fetch from it may take before it counts as failed."""
POLL_SECONDS = 0.2
READY = "ready"
"""In a save's control folder: every local rank's part is written; its content, the save's seconds."""
PEER_START_SECONDS = 60.0
"""How long a fetch waits for the peer's copy server to come up (every node's first rank starts one as
the step starts, so a resume on one node may ask before another node's server listens)."""
PUSH_RETRY_SECONDS = 5.0
"""After a buddy refused a push (no server yet, or busy), the next try comes this much later."""
"""How often local rank 0's thread looks for a newly committed copy (node-local tmpfs: a free listing)."""
_NONE = "-"


class CheckpointSetupError(ClusterctlError):
    """The job's checkpoint settings or environment are not usable (the message names the variable)."""

    exit_code = 13


@dataclass(frozen=True)
class Resume:
    """The checkpoint to resume from: its step, and the directory holding this node's slot's files
    (in the node's local tier, staged and verified; on shared storage when the local tier is unusable).
    `source` says where the files came from in a user's words (`this node's own copy`, `node2's copy
    on node3`, `shared storage`), `seconds` what staging them took; `tier` the tier they came from
    (`local`: this node's own copy; `buddy`: `of_node`'s copy held on node `held_on`; `shared`)."""

    step: int
    directory: Path
    source: str = ""
    seconds: float = 0.0
    tier: str = ""
    of_node: str = ""
    held_on: str = ""


class CopyService(Protocol):
    """A running copy server (the node's first rank serves fetches and receives its buddy's pushes)."""

    def close(self) -> None:
        """Stop serving."""


class CopyTransport(Protocol):
    """Moving copies between nodes (clusterctl.checkpoint.transport over TCP; a fake in tests).

    Any exception from `push` or `fetch` means the copy did not move; the caller carries on."""

    def push(self, host: str, port: int, key: bytes, copy_dir: Path, manifest: CheckpointManifest, *,
             timeout: float) -> None:
        """Send the copy in `copy_dir` to `host`'s server, which keeps it as its buddy copy of manifest.of_node."""

    def fetch(self, host: str, port: int, key: bytes, of_node: str, step: int, dest_dir: Path, *,
              timeout: float) -> ReceivedCopy:
        """Fetch `of_node`'s copy of `step` held on `host` into `dest_dir` (made, empty): its manifest and
        every shard's size and SHA-256 as measured while the bytes were written (a transport hashes
        what it receives; the caller loads a copy whose measurements equal its manifest without
        hashing it again, and never one whose measurements differ)."""

    def serve(self, tier_root: Path, node: str, key: bytes, port: int,
              on_received: Callable[[CheckpointManifest], None]) -> CopyService:
        """Start serving `tier_root` on `port`; `on_received` runs after a buddy copy lands."""


class TcpTransport:
    """The default transport: clusterctl.checkpoint.transport, imported when first used (a training
    program that never moves a copy never loads the socket code)."""

    def push(self, host: str, port: int, key: bytes, copy_dir: Path, manifest: CheckpointManifest, *,
             timeout: float) -> None:
        """See CopyTransport.push."""
        from clusterctl.checkpoint.transport import push_copy

        push_copy(host, port, key, copy_dir, manifest, timeout=timeout)

    def fetch(self, host: str, port: int, key: bytes, of_node: str, step: int, dest_dir: Path, *,
              timeout: float) -> ReceivedCopy:
        """See CopyTransport.fetch."""
        from clusterctl.checkpoint.transport import fetch_copy

        return fetch_copy(host, port, key, of_node, step, dest_dir, timeout=timeout)

    def serve(self, tier_root: Path, node: str, key: bytes, port: int,
              on_received: Callable[[CheckpointManifest], None]) -> CopyService:
        """See CopyTransport.serve."""
        from clusterctl.checkpoint.transport import CopyServer

        return CopyServer(tier_root, node, key, port, on_received=on_received).start()


@dataclass(frozen=True)
class _SaveTarget:
    step: int
    control: Path
    staging: Path
    tier: str  # "local" or "shared"


class Checkpointer:
    """One rank's door to the node's checkpoint tiers (see the module docstring and docs/checkpoint-tiers.md).

    `node` is the node's name in the rank map, `slot` its slot there (of `slots`), `rank` the global
    rank, `local_rank` / `local_ranks` this rank among the node's.  Local rank 0 starts the copy
    server, and the background thread unless `background` is False (then whoever drives it calls
    `tend()`, as the tests do)."""

    def __init__(self, settings: CheckpointSettings, *, node: str, slot: int, slots: int, rank: int,
                 local_rank: int, local_ranks: int, key: bytes, transport: CopyTransport | None = None,
                 attempt: str = "0", uid: int | None = None, stderr: TextIO | None = None,
                 poll_seconds: float = POLL_SECONDS, timeout: float = TRANSFER_TIMEOUT,
                 background: bool = True) -> None:
        self.settings, self.node, self.slot, self.slots = settings, node, slot, slots
        self.rank, self.local_rank, self.local_ranks = rank, local_rank, local_ranks
        self._key, self._attempt, self._timeout = key, attempt, timeout
        self._transport: CopyTransport = transport or TcpTransport()
        self._stderr = stderr
        self.shared_dir = Path(settings.shared_dir)
        self._said: set[str] = set()
        self._line: TierSlot | None = None
        self._resume_step = settings.resume_step
        if settings.tier_index:
            try:
                index_step, self.slots, self._line = read_tier_slot(Path(settings.tier_index), slot)
            except (OSError, RecordError, ValueError) as exc:
                raise CheckpointSetupError(f"cannot read this node's line (slot {slot}) of the tier index "
                                           f"{settings.tier_index}: {exc}") from None
            if index_step is not None:
                self._resume_step = index_step
        self.tier: NodeTier | None = None
        self._tier_problem = ""
        root = settings.tier_root(node, uid)
        try:
            self.tier = NodeTier(open_tier_root(root, Path(settings.local_base), uid=uid), node)
        except TierRootError:
            raise
        except OSError as exc:
            self._tier_problem = f"the node's checkpoint directory {root} cannot be made ({exc.strerror or exc})"
        self._resumed: Resume | None = None
        self._last_saved: _SaveTarget | None = None
        self._lock = threading.Lock()  # holdings and retention: the thread and the server's callback
        self._stop = threading.Event()
        self._handled: set[int] = set()
        self._pushed: set[int] = set()
        self._next_push = 0.0
        self._flushed: set[int] = set()
        self._holdings_seen: object = None
        self._server: CopyService | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.bad_copies: tuple[BadCopy, ...] = ()
        """The copies resume() found unusable before the one it used (each also said on stderr)."""
        if local_rank == 0 and self.tier is not None:
            self._start_background(poll_seconds if background else None)

    # ---- from the environment -----------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, *,
                 transport: CopyTransport | None = None) -> Checkpointer | None:
        """The checkpointer this rank's environment describes; None when CLUSTERCTL_CHECKPOINT is unset
        (not a clusterctl job with checkpoint tiers).  CheckpointSetupError naming the variable when a
        setting is malformed or a variable the job sets is missing."""
        try:
            settings = CheckpointSettings.from_env(environ)
        except RecordError as exc:
            raise CheckpointSetupError(f"${SETTINGS_ENV} is malformed: {exc}") from None
        if settings is None:
            return None
        node = environ.get("SLURMD_NODENAME", "")
        if not node:
            raise CheckpointSetupError(f"${SETTINGS_ENV} is set but $SLURMD_NODENAME is not: run the program "
                                       "under clusterctl in a Slurm job")
        rank = _env_whole(environ, ("RANK",))
        local_rank = _env_whole(environ, ("LOCAL_RANK",))
        local_ranks = _env_whole(environ, ("LOCAL_WORLD_SIZE",))
        slot = _env_whole(environ, ("NODE_RANK", "GROUP_RANK"))
        world = _env_whole(environ, ("WORLD_SIZE",), default=local_ranks * (slot + 1))
        if local_ranks < 1 or local_rank >= local_ranks:
            raise CheckpointSetupError(f"$LOCAL_RANK={local_rank} is not a rank of $LOCAL_WORLD_SIZE={local_ranks}")
        try:
            key = parse_key(environ.get(REPORT_KEY_ENV, ""), f"${REPORT_KEY_ENV}")
        except RecordError as exc:
            raise CheckpointSetupError(f"{exc} (the job's key, which copies between nodes are signed with)") from None
        return cls(settings, node=node, slot=slot, slots=max(world // local_ranks, slot + 1), rank=rank,
                   local_rank=local_rank, local_ranks=local_ranks, key=key, transport=transport,
                   attempt=attempt_token(environ))

    # ---- resume --------------------------------------------------------------------------------

    def resume(self) -> Resume | None:
        """The checkpoint to resume from, this slot's files staged into the local tier and verified; None
        for a fresh start.  The first local rank stages, the others wait for it and reuse its copy.
        When no copy verifies: writes `<launch dir>/resume-failed/<node>.json`, says so on stderr and
        raises SystemExit(EXIT_RESUME_FAILED)."""
        step = self._resume_step
        if step is None:
            if self.local_rank == 0:
                self._drop_abandoned(None)
            return None
        began = time.monotonic()
        if self.tier is None:
            resumed, bad = self._resume_in_place(step, [])
            return self._resumed_or_exit(step, self._timed(resumed, began), bad, first=True)
        note = self.tier.root / f".tmp-resume-{self._attempt}"
        with flocked(self.tier.stage_lock):
            if note.exists():
                text = note.read_text()
                if text.startswith("ok "):
                    staged = json.loads(text[3:])
                    self._resumed = Resume(step, Path(staged["directory"]), staged["source"], staged["seconds"],
                                           staged.get("tier", ""), staged.get("of_node", ""),
                                           staged.get("held_on", ""))
                    return self._resumed
                return self._resumed_or_exit(step, None, [], first=False)
            resumed, bad = self._stage(step)
            resumed = self._timed(resumed, began)
            if resumed is not None:
                self._drop_abandoned(step)
                self._record_resume(resumed)
            note.write_text("ok " + json.dumps({"directory": str(resumed.directory), "source": resumed.source,
                                                "seconds": resumed.seconds, "tier": resumed.tier,
                                                "of_node": resumed.of_node, "held_on": resumed.held_on})
                            if resumed else "failed")
        return self._resumed_or_exit(step, resumed, bad, first=True)

    def _record_resume(self, resumed: Resume) -> None:
        """Put the resume in the node's holdings (its reporter carries it to the agent, which journals one
        line per resumed step: where every node's files came from and how long the slowest read took).
        A holdings file that cannot be written costs only that line's read time."""
        assert self.tier is not None
        try:
            last = LastResume(resumed.step, resumed.tier or "shared", resumed.of_node or self.node,
                              resumed.held_on, resumed.seconds, time.time())
            with self._lock:
                self._rewrite_holdings(force=True, resumed=last)
        except (OSError, ValueError) as exc:
            self._print(f"cannot record the resume in the node's checkpoint holdings ({exc})")

    def _drop_abandoned(self, step: int | None) -> None:
        """Remove this node's copies of steps after `step` (all for a fresh start): the old timeline's."""
        if self.tier is None:
            return
        with self._lock:
            gone = abandoned_copies(self.tier.copies_on_disk(), step)
            self.tier.remove(gone)
            if gone:
                self._rewrite_holdings(force=True)

    def _timed(self, resumed: Resume | None, began: float) -> Resume | None:
        """`resumed` with the time staging took, said in one line (by the rank that staged it)."""
        if resumed is None:
            return None
        resumed = dataclasses.replace(resumed, seconds=round(time.monotonic() - began, 3))
        self._print(f"resuming step {resumed.step} on {self.node}: slot {self.slot}'s files from "
                    f"{resumed.source} in {resumed.seconds:.2f} s")
        return resumed

    def _resumed_or_exit(self, step: int, resumed: Resume | None, bad: list[BadCopy], *, first: bool) -> Resume:
        self.bad_copies = tuple(bad)
        if resumed is not None:
            for copy in bad:
                self._print(f"step {step}: passed over {copy.of_node}'s {copy.tier} copy"
                            f"{f' on {copy.held_on}' if copy.held_on and copy.tier == 'buddy' else ''}: "
                            f"the copy {copy.problem}")
            self._resumed = resumed
            return resumed
        if not first:  # the node's stager said why and wrote the record; its other ranks just leave
            raise SystemExit(EXIT_RESUME_FAILED)
        problems = "; ".join(f"the {b.tier} copy {b.problem}" for b in bad) or "no copy was found"
        why = f"no copy of slot {self.slot}'s files of step {step} verifies ({problems})"
        where = ""
        if first and self.settings.tier_index:
            path = write_resume_failure(Path(self.settings.tier_index).parent,
                                        ResumeFailure(node=self.node, step=step, why=why, bad_copies=tuple(bad)))
            where = f"; wrote {path}"
        self._print(f"cannot resume on {self.node}: {why}{where}; exiting with {EXIT_RESUME_FAILED}")
        raise SystemExit(EXIT_RESUME_FAILED)

    def _stage(self, step: int) -> tuple[Resume | None, list[BadCopy]]:
        assert self.tier is not None
        bad: list[BadCopy] = []
        line = self._line
        planned = line.tier if line is not None else _NONE
        own = self.tier.local_copy(step)
        manifest = self.tier.manifest(own) if planned in (LOCAL, _NONE) else None
        # The plan's tier first, then the farther ones: a nearer copy the plan passed over may be of
        # an earlier save of the same step (before a resume from an older one), not the plan's.
        if manifest is not None and (manifest.slot, manifest.slots) == (self.slot, self.slots):
            problem = verify_copy(own, manifest)
            if not problem:
                return Resume(step, own, "this node's own copy", tier=LOCAL, of_node=self.node,
                              held_on=self.node), bad
            bad.append(BadCopy(step, manifest.of_node, "local", self.node, problem))
        if line is not None and line.tier == "buddy" and line.held_on not in (_NONE, ""):
            try:
                staging = self._fresh_dir(f".tmp-stage-{step:012d}-{self._attempt}")
            except OSError:
                return self._resume_in_place(step, bad)  # nowhere to stage: shared storage, read in place
            try:
                if line.held_on == self.node:
                    # Kept here already: linked into the staging folder (no byte moves), then hashed once.
                    source = self.tier.buddy_copy(line.of_node, step)
                    fetched = read_checkpoint_manifest(source / MANIFEST_NAME)
                    link_shards(source, staging, [s.name for s in fetched.shards])
                    problem = self._check_staged(staging, fetched, step)
                else:
                    # The transport hashed every byte as it wrote it: its measurements are checked
                    # against the manifest instead of reading the copy a second time.
                    received = self._fetch_waiting(line.held_on, line.of_node, step, staging)
                    fetched = received.manifest
                    problem = self._check_identity(fetched, step) or received.problem()
            except Exception as exc:  # a dead, unreachable or refusing buddy is one more bad copy
                problem = f"cannot be fetched ({exc})"
            if not problem and (resumed := self._commit_staged(staging, fetched, step)) is not None:
                return resumed, bad
            if not problem:
                return self._resume_in_place(step, bad)
            bad.append(BadCopy(step, line.of_node, "buddy", line.held_on, problem))
            shutil.rmtree(staging, ignore_errors=True)
        return self._resume_from_shared(step, bad)

    def _fetch_waiting(self, host: str, of_node: str, step: int, staging: Path) -> ReceivedCopy:
        """Fetch through the transport, trying again while the peer's server is not up yet (every node's
        first rank starts its server as the step starts), for at most PEER_START_SECONDS."""
        deadline = time.monotonic() + PEER_START_SECONDS
        while True:
            try:
                return self._transport.fetch(host, self.settings.port, self._key, of_node, step, staging,
                                             timeout=self._timeout)
            except Exception as exc:
                if not getattr(exc, "retryable", False) or time.monotonic() >= deadline:
                    raise
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(mode=0o700)
            time.sleep(0.5)

    def _resume_from_shared(self, step: int, bad: list[BadCopy]) -> tuple[Resume | None, list[BadCopy]]:
        assert self.tier is not None
        source = shared_copy_dir(self.shared_dir, step, self.slot)
        of_node = self._line.of_node if self._line is not None and self._line.of_node != _NONE else self.node
        try:
            manifest = read_checkpoint_manifest(source / MANIFEST_NAME)
        except FileNotFoundError:
            bad.append(BadCopy(step, of_node, "shared", None, f"is not on shared storage ({source})"))
            return None, bad
        except (OSError, RecordError) as exc:
            bad.append(BadCopy(step, of_node, "shared", None, f"has an unreadable manifest ({exc})"))
            return None, bad
        staging = self.tier.root / f".tmp-stage-{step:012d}-{self._attempt}"
        problem = self._check_identity(manifest, step)
        try:
            self._fresh_dir(staging.name)
            # Hashed as it is copied: shared storage is read once and the staged copy not again.
            problem = problem or copy_verified(source, staging, manifest)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            return self._resume_in_place(step, bad)  # the local tier is full or broken: read shared directly
        if problem:
            shutil.rmtree(staging, ignore_errors=True)
            bad.append(BadCopy(step, manifest.of_node, "shared", None, problem))
            return None, bad
        resumed = self._commit_staged(staging, manifest, step)
        return (resumed, bad) if resumed is not None else self._resume_in_place(step, bad)

    def _resume_in_place(self, step: int, bad: list[BadCopy]) -> tuple[Resume | None, list[BadCopy]]:
        source = shared_copy_dir(self.shared_dir, step, self.slot)
        try:
            manifest = read_checkpoint_manifest(source / MANIFEST_NAME)
        except (OSError, RecordError) as exc:
            bad.append(BadCopy(step, self.node, "shared", None, f"cannot be read ({exc})"))
            return None, bad
        problem = self._check_staged(source, manifest, step)
        if problem:
            bad.append(BadCopy(step, manifest.of_node, "shared", None, problem))
            return None, bad
        return Resume(step, source, "shared storage (read in place)", tier="shared", of_node=manifest.of_node), bad

    def _check_staged(self, directory: Path, manifest: CheckpointManifest, step: int) -> str:
        return self._check_identity(manifest, step) or verify_copy(directory, manifest)

    def _check_identity(self, manifest: CheckpointManifest, step: int) -> str:
        if (manifest.step, manifest.slot) != (step, self.slot):
            return f"is of step {manifest.step}, slot {manifest.slot}, not step {step}, slot {self.slot}"
        return ""

    def _commit_staged(self, staging: Path, source: CheckpointManifest, step: int) -> Resume | None:
        """The verified copy in `staging` made this node's local copy of `step`; None when the local
        tier cannot take it (the caller reads shared storage in place)."""
        assert self.tier is not None
        local = CheckpointManifest(step=step, of_node=self.node, tier=LOCAL, held_on=self.node,
                                   shards=source.shards, written_at=source.written_at,
                                   save_seconds=source.save_seconds, slot=self.slot, slots=self.slots)
        try:
            (staging / MANIFEST_NAME).unlink(missing_ok=True)
            commit_copy(staging, self.tier.local_copy(step), local)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            return None
        where = "shared storage" if source.tier == "shared" else \
            f"{source.of_node}'s copy on {source.held_on}" if source.held_on and source.held_on != self.node else \
            f"{source.of_node}'s copy kept on this node"
        shared = source.tier == "shared"
        return Resume(step, self.tier.local_copy(step), where, tier="shared" if shared else "buddy",
                      of_node=source.of_node, held_on="" if shared else source.held_on or self.node)

    def _fresh_dir(self, name: str) -> Path:
        assert self.tier is not None
        path = self.tier.root / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o700)
        return path

    # ---- save ----------------------------------------------------------------------------------

    @contextmanager
    def save_files(self, step: int) -> Iterator[Path]:
        """This rank's part of step `step`'s checkpoint: write its files into the directory yielded
        (shared by the node's local ranks: give each rank's files their own names, or a `rank-<r>/`
        folder).  Returns once the part is written; the last local rank commits the node's copy.
        An OSError while writing drops this step on this node (said on stderr), never raises."""
        began = time.monotonic()
        target = self._begin_save(step)
        if target is None:
            scratch = Path(tempfile.mkdtemp(prefix="clusterctl-unsaved-"))
            try:
                yield scratch
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        try:
            yield target.staging
        except OSError as exc:
            self._print(f"step {step} is not saved on {self.node}: writing {target.staging} failed "
                        f"({exc.strerror or exc}); training goes on")
            return
        self._finish_save(target, time.monotonic() - began)

    def save_state(self, step: int, state_dict: dict[str, Any]) -> None:
        """Save `state_dict` (tensors, Stateful objects) with torch.distributed.checkpoint into this
        rank's `rank-<rank>/` folder of step `step`'s copy."""
        from clusterctl.checkpoint import torch_state

        with self.save_files(step) as directory:
            torch_state.save_rank_state(directory / f"rank-{self.rank}", state_dict)

    def load_state(self, state_dict: dict[str, Any]) -> None:
        """Load, in place, this rank's state dict from the checkpoint resume() found."""
        from clusterctl.checkpoint import torch_state

        if self._resumed is None:
            raise ClusterctlError("load_state: there is nothing to load (resume() found no checkpoint, or was "
                                  "not called)")
        torch_state.load_rank_state(self._resumed.directory / f"rank-{self.rank}", state_dict)

    def _control_dir(self, step: int) -> Path:
        if self.tier is not None:
            return self.tier.root / f".tmp-save-{step:012d}-{self._attempt}"
        return self.shared_dir / "tiers" / step_name(step) / f".tmp-save-{slot_name(self.slot)}-{self._attempt}"

    def _begin_save(self, step: int) -> _SaveTarget | None:
        try:
            control = self._control_dir(step)
            try:
                control.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError:
                if self.tier is None:
                    raise
                self._tier_problem = f"the node's checkpoint directory {self.tier.root} is not writable"
                self.tier = None  # and so the next saves go to shared storage directly, too
                control = self._control_dir(step)
                control.mkdir(mode=0o700, parents=True, exist_ok=True)
            where = control / "where"
            decision = where.read_text() if where.exists() else None
            won = False
            if decision is None:
                decision, won = publish_once(where, self._decide(step))
            tier, _, reason = decision.partition("\n")
            if tier == LOCAL and self.tier is not None:
                staging = self.tier.root / f".tmp-step-{step:012d}-{self._attempt}"
            else:
                tier = "shared"
                if won:
                    self._say_once("shared", f"{self.node}: saving step {step} to shared storage directly, not "
                                             f"the node's local tier: {reason} (said once; any later save "
                                             "that does not fit goes there too)")
                staging = (self.shared_dir / "tiers" / step_name(step)
                           / f".tmp-{slot_name(self.slot)}-{self._attempt}")
            staging.mkdir(mode=0o700, parents=True, exist_ok=True)
            return _SaveTarget(step, control, staging, tier)
        except OSError as exc:
            self._print(f"step {step} is not saved on {self.node}: neither the local tier nor shared storage "
                        f"can be written ({exc}); training goes on")
            return None

    def _decide(self, step: int) -> str:
        """Where the node saves step `step` (the first local rank to save it decides for all): `local`,
        or `shared` and why."""
        if self.tier is None:
            return f"shared\n{self._tier_problem}"
        mine = (".tmp-save-", ".tmp-step-", ".tmp-stage-", ".tmp-resume-", ".committer-")
        # Saves of this attempt still being committed in the background (every rank done) are kept too.
        pending = [c.name.split("-")[2] for c in self.tier.root.glob(f".tmp-save-*-{self._attempt}")
                   if (c / READY).exists()]
        self.tier.clean_stale(mine, keep=(f".tmp-save-{step:012d}-{self._attempt}",
                                          f".tmp-step-{step:012d}-{self._attempt}",
                                          f".tmp-resume-{self._attempt}", f".committer-{self._attempt}",
                                          *(f".tmp-save-{n}-{self._attempt}" for n in pending),
                                          *(f".tmp-step-{n}-{self._attempt}" for n in pending)))
        try:
            copies = self.tier.copies_on_disk()
            own = sorted((c for c in copies if c.tier == LOCAL), key=lambda c: c.step)
            estimate = own[-1].size if own else 0  # a save is about as large as the one before it
            budget = budget_bytes(self.settings.local_budget_bytes, self.tier.filesystem_bytes())
            room = plan_room(copies, estimate, self.settings.keep, budget)
            if room is None:
                held = sum(c.size for c in copies)
                return (f"shared\nthe local tier's budget is {budget} bytes; it holds {held} and this save needs "
                        f"about {estimate} more")
            with self._lock:
                self.tier.remove(room)
            probe = self.tier.root / f".tmp-step-{step:012d}-{self._attempt}"
            probe.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            return f"shared\nthe node's checkpoint directory {self.tier.root} cannot be written ({exc.strerror})"
        return LOCAL

    def _finish_save(self, target: _SaveTarget, seconds: float) -> None:
        try:
            self._last_saved = target
            if not mark_done(target.control, self.local_rank, self.local_ranks):
                return
            if target.tier == LOCAL and self.tier is not None and self._committer_marker().exists():
                # Hashing every shard (for the manifest) takes about as long as writing it: the node's first
                # rank does it in the background, so training waits only for the write to memory.
                publish_once(target.control / READY, f"{seconds:.6f}")
                return
            shards = shards_of(target.staging)
            if target.tier == LOCAL:
                self._commit_local(target, shards, seconds)
            else:
                self._commit_shared(target.staging, target.step, shards, seconds)
            shutil.rmtree(target.control, ignore_errors=True)
        except (OSError, CopyError, ValueError) as exc:
            shutil.rmtree(target.control, ignore_errors=True)
            self._print(f"step {target.step} is not saved on {self.node}: committing the node's copy failed "
                        f"({exc}); training goes on")

    def _committer_marker(self) -> Path:
        """Present while local rank 0 of this attempt commits the node's saves in the background."""
        assert self.tier is not None
        return self.tier.root / f".committer-{self._attempt}"

    def _commit_ready(self) -> None:
        """Local rank 0's background work: commit the node's saves whose every rank is done (READY), oldest
        first: list and hash the shards, write the manifest, rename into place."""
        assert self.tier is not None
        for control in sorted(self.tier.root.glob(f".tmp-save-*-{self._attempt}")):
            if not (control / READY).exists():
                continue
            step = int(control.name.split("-")[2])
            target = _SaveTarget(step, control, self.tier.root / f".tmp-step-{step:012d}-{self._attempt}", LOCAL)
            try:
                seconds = float((control / READY).read_text() or 0)
                self._commit_local(target, shards_of(target.staging), seconds)
            except (OSError, CopyError, ValueError) as exc:
                self._print(f"step {step} is not saved on {self.node}: committing the node's copy failed "
                            f"({exc}); training goes on")
            shutil.rmtree(control, ignore_errors=True)

    def _commit_local(self, target: _SaveTarget, shards: tuple[Any, ...], seconds: float) -> None:
        assert self.tier is not None
        manifest = CheckpointManifest(step=target.step, of_node=self.node, tier=LOCAL, held_on=self.node,
                                      shards=shards, written_at=time.time(), save_seconds=round(seconds, 6),
                                      slot=self.slot, slots=self.slots)
        others = sum(c.size for c in self.tier.copies_on_disk() if not (c.tier == LOCAL and c.step == target.step))
        budget = budget_bytes(self.settings.local_budget_bytes, self.tier.filesystem_bytes())
        if others + manifest.total_bytes > budget:
            # Larger than the estimate the decision was made on: moved to shared storage, never left half-kept.
            shared = flush_copy(target.staging, manifest, self.shared_dir, self.slot, Throttle(0))
            self.tier.note_flushed(shared)
            shutil.rmtree(target.staging, ignore_errors=True)
            self._say_once("shared", f"{self.node}: step {target.step}'s copy ({manifest.total_bytes} bytes) went to shared "
                                     f"storage: the local tier's budget is {budget} bytes and it holds {others}")
            return
        commit_copy(target.staging, self.tier.local_copy(target.step), manifest)

    def _commit_shared(self, staging: Path, step: int, shards: tuple[Any, ...], seconds: float) -> None:
        manifest = CheckpointManifest(step=step, of_node=self.node, tier="shared", held_on=None, shards=shards,
                                      written_at=time.time(), save_seconds=round(seconds, 6), slot=self.slot,
                                      slots=self.slots)
        done = commit_copy(staging, shared_copy_dir(self.shared_dir, step, self.slot), manifest)
        if self.tier is not None:
            self.tier.note_flushed(done)

    # ---- local rank 0: the copy server and the background thread --------------------------------

    def _start_background(self, poll_seconds: float | None) -> None:
        assert self.tier is not None
        # From here on local rank 0's thread (or whoever calls tend()) commits the node's saves.
        self._committer_marker().touch(mode=0o600)
        try:
            self._server = self._transport.serve(self.tier.root, self.node, self._key, self.settings.port,
                                                 self._received)
        except Exception as exc:  # no server: this node's copies cannot be fetched, training goes on
            self._say_once("serve", f"cannot serve copies on port {self.settings.port}: {exc}; other nodes "
                                    "cannot fetch this node's copies")
        # Copies from before this step: the newest is sent to the (maybe new) buddy again and flushed
        # when due and not on shared storage yet; older ones were dealt with then.
        self._handled.update(m.step for _, m in self.tier.local_copies()[:-1])
        if poll_seconds is not None:
            self._thread = threading.Thread(target=self._run, args=(poll_seconds,), name="clusterctl-checkpoint",
                                            daemon=True)
            self._thread.start()

    def _run(self, poll_seconds: float) -> None:
        while not self._stop.wait(poll_seconds):
            self.tend()

    def tend(self) -> None:
        """One round of local rank 0's background work (the thread calls it every poll; tests may call it):
        push the newest new copy to the buddy, flush the due ones, apply retention, rewrite holdings."""
        if self.tier is None:
            return
        try:
            self._commit_ready()
            copies = self.tier.local_copies()
            new = [(path, m) for path, m in copies if m.step not in self._handled]
            # Only the newest goes to the buddy: when saves outpace the network, older ones are moot.
            if copies and copies[-1][1].step not in self._pushed and time.monotonic() >= self._next_push:
                self._push(*copies[-1])
            for path, manifest in new:
                if flush_due(manifest.step, self.settings.flush_every_steps) and not self._on_shared(manifest):
                    self._flush(path, manifest)
            self._handled.update(m.step for _, m in new)
            with self._lock:
                if new:
                    self.tier.apply_retention(self.settings.keep)
                self._rewrite_holdings()
        except Exception as exc:  # the contract: never break training; the next round tries again
            self._say_once("tend", f"checkpoint background work failed ({type(exc).__name__}: {exc}); "
                                   "it is tried again")

    def _on_shared(self, manifest: CheckpointManifest) -> bool:
        """Whether this copy is on shared storage already: flushed by this node, or the copy a resume
        staged from (its shards are there, the same ones)."""
        if manifest.step in self._flushed:
            return True
        try:
            shared = read_checkpoint_manifest(shared_copy_dir(self.shared_dir, manifest.step, self.slot)
                                              / MANIFEST_NAME)
        except (OSError, RecordError):
            return False
        if shared.shards != manifest.shards:
            return False  # an older save of the same step, before a resume from an earlier one
        self._flushed.add(manifest.step)
        return True

    def _flush(self, path: Path, manifest: CheckpointManifest) -> None:
        assert self.tier is not None
        try:
            shared = flush_copy(path, manifest, self.shared_dir, self.slot,
                                Throttle(self.settings.shared_bytes_per_second))
        except (CopyError, OSError) as exc:
            self._say_once("flush", f"cannot flush step {manifest.step} to shared storage: {exc}")
            return
        self.tier.note_flushed(shared)
        self._flushed.add(manifest.step)

    def _push(self, path: Path, manifest: CheckpointManifest) -> None:
        buddy = self._line.buddy if self._line is not None else _NONE
        if buddy in (_NONE, "", self.node):
            self._pushed.add(manifest.step)
            self._say_once("no-buddy", "this node has no buddy in the tier index: its copies stay on this node "
                                       "(and on shared storage when flushed)")
            return
        try:
            self._transport.push(buddy, self.settings.port, self._key, path, manifest, timeout=self._timeout)
        except Exception as exc:  # a gone or refusing buddy: the copy stays local
            if getattr(exc, "retryable", False):  # its server is not up yet, or busy: try again a little later
                self._next_push = time.monotonic() + PUSH_RETRY_SECONDS
            else:
                self._pushed.add(manifest.step)
            self._say_once(f"push:{buddy}", f"cannot send copies to buddy {buddy} ({exc}); they stay on this "
                                            "node (and on shared storage when flushed) until it answers; said once")
            return
        self._pushed.add(manifest.step)

    def _received(self, manifest: CheckpointManifest) -> None:
        """The copy server's callback: a buddy copy landed here."""
        if self.tier is None:
            return
        with self._lock:
            self.tier.apply_retention(self.settings.keep)
            self._rewrite_holdings(force=True)

    def _rewrite_holdings(self, *, force: bool = False, resumed: LastResume | None = None) -> None:
        assert self.tier is not None
        seen = ([m.step for _, m in self.tier.local_copies()],
                [(m.of_node, m.step) for _, m in self.tier.buddy_copies()],
                [m.step for m in self.tier.flushed()])
        if force or seen != self._holdings_seen:
            self.tier.write_holdings(resumed)
            self._holdings_seen = seen

    # ---- the end ---------------------------------------------------------------------------------

    def close(self, *, finished: bool = True) -> None:
        """Wait for the background work; in local rank 0, flush the newest local copy when
        settings.flush_at_end and it is not on shared storage yet.  `finished` (the default: the
        program calls close() when its training is done) then empties the node's tier of this run,
        own and buddy copies alike: the node's memory or disk goes back to the next job.  A program
        that ends otherwise (an error; `with Checkpointer...` leaving on an exception) keeps them for
        the resume that follows.  Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.local_rank != 0 or self.tier is None:
            return
        last = self._last_saved
        if last is not None and last.tier == LOCAL:
            deadline = time.monotonic() + self._timeout
            # The last local rank commits (rank 0 may finish its part first): wait until the commit is
            # done, whichever way it went (the committer removes the control folder).
            while last.control.exists() and time.monotonic() < deadline:
                if self._thread is None:  # nobody else commits the node's saves: this rank does
                    self._commit_ready()
                time.sleep(0.05)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.tend()
        copies = self.tier.local_copies()
        if self.settings.flush_at_end and copies and not self._on_shared(copies[-1][1]):
            self._flush(*copies[-1])
            with self._lock:
                self._rewrite_holdings()
        if self._server is not None:
            self._server.close()
        if finished:
            self._empty_tier()

    def _empty_tier(self) -> None:
        """The run's copies on this node, removed (training is done); the holdings say so."""
        assert self.tier is not None
        with self._lock:
            self.tier.remove(self.tier.copies_on_disk())
            self._rewrite_holdings(force=True)
        kept = len(self.tier.copies_on_disk())
        self._print(f"training done on {self.node}: its checkpoint copies are removed from {self.tier.root}"
                    + (f" ({kept} could not be)" if kept else ""))

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: object, *_exc: object) -> None:
        self.close(finished=exc_type is None)

    # ---- saying things ---------------------------------------------------------------------------

    def _print(self, message: str) -> None:
        print(f"clusterctl.checkpoint: {message}", file=self._stderr or sys.stderr, flush=True)

    def _say_once(self, kind: str, message: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            self._print(message)


def _env_whole(environ: Mapping[str, str], names: tuple[str, ...], default: int | None = None) -> int:
    for name in names:
        value = environ.get(name)
        if value is None or value == "":
            continue
        try:
            number = int(value)
        except ValueError:
            raise CheckpointSetupError(f"${name}={value!r} is not a whole number") from None
        if number < 0:
            raise CheckpointSetupError(f"${name}={value!r} is negative")
        return number
    if default is not None:
        return default
    raise CheckpointSetupError(f"${SETTINGS_ENV} is set but ${' / $'.join(names)} is not: run the program under "
                               "clusterctl (srun style) or torchrun")


__all__ = ["Checkpointer", "CheckpointSetupError", "CopyService", "CopyTransport", "Resume", "TcpTransport"]
