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

`Checkpointer` is the door the ranks call; the work is its parts': `resume.py` (`Resumer`),
`save.py` (`Saver`), `worker.py` (`TierWorker`: local rank 0's copy server and background thread),
sharing what `place.py` holds and moving copies through `link.py`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TextIO

from clusterctl.checkpoint.link import TRANSFER_TIMEOUT, CopyLink, CopyService, CopyTransport, TcpTransport
from clusterctl.checkpoint.place import RankPlace, TierHold, Voice
from clusterctl.checkpoint.resume import Resume, Resumer
from clusterctl.checkpoint.save import Saver
from clusterctl.checkpoint.tier import NodeTier, attempt_token
from clusterctl.checkpoint.worker import POLL_SECONDS, TierWorker
from clusterctl.errors import ClusterctlError
from clusterctl.records.checkpoint_settings import SETTINGS_ENV, CheckpointSettings
from clusterctl.records.node_report import REPORT_KEY_ENV, parse_key
from clusterctl.records.resume_failure import BadCopy
from clusterctl.records.tier_index import TierSlot, read_tier_slot
from clusterctl.records.versioned import RecordError


class CheckpointSetupError(ClusterctlError):
    """The job's checkpoint settings or environment are not usable (the message names the variable)."""

    exit_code = 13


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
                 background: bool = True, job_id: str = "") -> None:
        self.settings, self.node, self.slot, self.slots = settings, node, slot, slots
        self.rank, self.local_rank, self.local_ranks = rank, local_rank, local_ranks
        self.shared_dir = Path(settings.shared_dir)
        resume_step, line = settings.resume_step, None
        if settings.tier_index:
            resume_step, line = self._read_tier_index(resume_step)
        self._hold = TierHold.open(settings.tier_root(node, uid), Path(settings.local_base), node, uid, job_id)
        place = RankPlace(settings, node, slot, self.slots, rank, local_rank, local_ranks, attempt, line)
        voice = Voice(stderr)
        if self._hold.tier is None and local_rank == 0:
            voice.say(f"warning: {node}: {self._hold.problem}")
        link = CopyLink(transport or TcpTransport(), key, settings.port, timeout)
        self._resumer = Resumer(place, self._hold, voice, link, resume_step)
        self._saver = Saver(place, self._hold, voice)
        self._worker = TierWorker(place, self._hold, voice, link, self._saver)
        self._closed = False
        if local_rank == 0 and self.tier is not None:
            self._worker.start(poll_seconds if background else None)

    def _read_tier_index(self, resume_step: int | None) -> tuple[int | None, TierSlot]:
        """This node's line of the step's tier index (`self.slots` set from it), and the step to resume
        from: the index's, else `resume_step`."""
        try:
            index_step, self.slots, line = read_tier_slot(Path(self.settings.tier_index), self.slot)
        except (OSError, RecordError, ValueError) as exc:
            raise CheckpointSetupError(f"cannot read this node's line (slot {self.slot}) of the tier index "
                                       f"{self.settings.tier_index}: {exc}") from None
        return (index_step if index_step is not None else resume_step), line

    @property
    def tier(self) -> NodeTier | None:
        """The node's local tier; None when it cannot be used (every save then goes to shared storage)."""
        return self._hold.tier

    @tier.setter
    def tier(self, tier: NodeTier | None) -> None:
        self._hold.tier = tier

    @property
    def bad_copies(self) -> tuple[BadCopy, ...]:
        """The copies resume() found unusable before the one it used (each also said on stderr)."""
        return self._resumer.bad_copies

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
                   attempt=attempt_token(environ), job_id=environ.get("SLURM_JOB_ID", ""))

    # ---- resume and save -----------------------------------------------------------------------

    def resume(self) -> Resume | None:
        """The checkpoint to resume from, this slot's files staged into the local tier and verified; None
        for a fresh start.  The first local rank stages, the others wait for it and reuse its copy.
        When no copy verifies: writes `<launch dir>/resume-failed/<node>.json`, says so on stderr and
        raises SystemExit(EXIT_RESUME_FAILED)."""
        return self._resumer.resume()

    def save_files(self, step: int) -> AbstractContextManager[Path]:
        """This rank's part of step `step`'s checkpoint: write its files into the directory yielded
        (shared by the node's local ranks: give each rank's files their own names, or a `rank-<r>/`
        folder).  Returns once the part is written; the last local rank commits the node's copy.
        An OSError while writing drops this step on this node (said on stderr), never raises."""
        return self._saver.save_files(step)

    def save_state(self, step: int, state_dict: dict[str, Any]) -> None:
        """Save `state_dict` (tensors, Stateful objects) with torch.distributed.checkpoint into this
        rank's `rank-<rank>/` folder of step `step`'s copy."""
        from clusterctl.checkpoint import torch_state

        with self.save_files(step) as directory:
            torch_state.save_rank_state(directory / f"rank-{self.rank}", state_dict)

    def load_state(self, state_dict: dict[str, Any]) -> None:
        """Load, in place, this rank's state dict from the checkpoint resume() found."""
        from clusterctl.checkpoint import torch_state

        resumed = self._resumer.resumed
        if resumed is None:
            raise ClusterctlError("load_state: there is nothing to load (resume() found no checkpoint, or was "
                                  "not called)")
        torch_state.load_rank_state(resumed.directory / f"rank-{self.rank}", state_dict)

    # ---- local rank 0's background work, and the end -------------------------------------------

    def tend(self) -> None:
        """One round of local rank 0's background work (the thread calls it every poll; tests may call it):
        push the newest new copy to the buddy, flush the due ones, apply retention, rewrite holdings."""
        self._worker.tend()

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
        self._worker.close(finished=finished)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: object, *_exc: object) -> None:
        self.close(finished=exc_type is None)


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
