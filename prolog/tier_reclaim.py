"""The prolog's reclaim of checkpoint tiers nobody will resume from, before a job starts (which trees:
healthd/stale_tiers.py, pure; the removal: healthd/node_tiers.py, the `TierDoor`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from clusterctl.clock import utc
from clusterctl.files import owner_label
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.hook_common import job_id, job_uid, node_name, say
from clusterctl.healthd.node_tiers import TierDoor
from clusterctl.healthd.stale_tiers import TRASH_PREFIX, MoveAside, ReclaimSettings, size, stale_tiers
from clusterctl.records.healthd_job_start import read_job_starts
from clusterctl.records.healthd_tier_reclaim import ReclaimedTree, TierReclaim, append_tier_reclaim

SAID_TREES = 8
"""Trees named in slurmd's log line at most (the journal keeps them all)."""


def reclaim_stale_tiers(environ: Mapping[str, str], config: HealthdConfig, tiers: TierDoor, *, deadline: float,
                        clock: Callable[[], float] = time.monotonic) -> tuple[ReclaimedTree, ...]:
    """Remove the checkpoint tiers on this node nobody will resume from (healthd/stale_tiers.py says which),
    before the job of `environ` starts; what was removed or tried, also said in slurmd's log and appended to
    `<journal_dir>/tier-reclaims.jsonl`.

    Never fails the prolog: an error is one line in slurmd's log and the job starts.  No removal starts past
    `deadline` (on `clock`): what is left waits for the next job's prolog."""
    job = job_id(environ) or "unknown"
    try:
        return _reclaim(job, node_name(environ, config), job_uid(environ), config, tiers, deadline, clock)
    except Exception as exc:  # noqa: BLE001 - a cleanup must never keep a job from a healthy node
        say("prolog", f"job {job}: stale checkpoint tiers not reclaimed: {exc.__class__.__name__}: {exc}")
        return ()


def _reclaim(job: str, node: str, uid: int | None, config: HealthdConfig, tiers: TierDoor, deadline: float,
             clock: Callable[[], float]) -> tuple[ReclaimedTree, ...]:
    if uid is None:
        say("prolog", f"job {job}: SLURM_JOB_UID is not a uid: stale checkpoint tiers not reclaimed")
        return ()
    began = clock()
    held = tiers.look(uid)
    starts, _unreadable = read_job_starts(config.journal_dir)  # the epilog says what it cannot read
    plan = stale_tiers(held, starts, ReclaimSettings(uid, config.tier_keep_hours * 3600, time.time(), job))
    done = _move_planted(job, plan.moves, tiers, deadline, clock)
    moved = len(done)
    notes = [*held.notes, *plan.left_alone]
    for note in notes[:SAID_TREES]:  # a user can plant any number of look-alikes: a few said, the rest counted
        say("prolog", f"job {job}: {note}")
    if len(notes) > SAID_TREES:
        say("prolog", f"job {job}: and {len(notes) - SAID_TREES} more names like a checkpoint tier's left alone")
    for reclaim in plan.reclaims:
        if clock() >= deadline:
            say("prolog", f"job {job}: out of time: {len(plan.reclaims) - len(done) + moved} stale checkpoint tier(s) "
                           "left for the next job's prolog")
            break
        if reclaim.uid != uid and not reclaim.parent and not reclaim.name.startswith(TRASH_PREFIX) \
                and reclaim.uid in tiers.running_uids():
            continue  # a job of theirs started here since the look (a shared node): theirs again
        removed = tiers.remove(reclaim, max(deadline - clock(), 0.0))
        done.append(ReclaimedTree(reclaim.path, reclaim.uid, reclaim.runs, removed.freed_bytes, reclaim.why,
                                  removed.error))
    if not done:
        return ()
    if len(done) > moved:
        _say_reclaimed(job, config, done[moved:], max(clock() - began, 0.0))
    seconds = max(clock() - began, 0.0)
    try:
        append_tier_reclaim(config.journal_dir, TierReclaim(utc(time.time()), job, node, round(seconds, 3),
                                                            tuple(done)))
    except OSError as exc:
        say("prolog", f"job {job}: reclaim not recorded in {config.journal_dir}: {exc}")
    return tuple(done)


def _move_planted(job: str, moves: tuple[MoveAside, ...], tiers: TierDoor, deadline: float,
                  clock: Callable[[], float]) -> list[ReclaimedTree]:
    """Move each planted `clusterctl-<uid>` aside (a rename each; the first few said in slurmd's log, every one
    in the journal) until `deadline`; what the journal keeps of them."""
    done: list[ReclaimedTree] = []
    for move in moves:
        if clock() >= deadline:
            break
        error = tiers.move_aside(move)
        base, owner = move.base.rstrip("/"), owner_label(move.owner)
        if len(done) < SAID_TREES:
            say("prolog", f"job {job}: {move.path} was made by {owner}, not by uid {move.uid} (planted: it locks "
                           f"uid {move.uid}'s jobs out of their node-local directory here): "
                           + (f"moved aside to {base}/{move.new_name}" if error is None else f"NOT moved aside: {error}"))
        done.append(ReclaimedTree(move.path, move.owner, 0, 0, f"planted by {owner} for uid {move.uid}: moved aside "
                                                               f"to {base}/{move.new_name}", error))
    if len(done) > SAID_TREES:
        say("prolog", f"job {job}: and {len(done) - SAID_TREES} more planted directories moved aside")
    return done


def _say_reclaimed(job: str, config: HealthdConfig, done: list[ReclaimedTree], seconds: float) -> None:
    said = [f"{tree.path} (uid {tree.uid}, {tree.runs} run(s), {size(tree.freed_bytes)}: {tree.why})"
            + (f" NOT removed: {tree.error}" if tree.error is not None else "") for tree in done[:SAID_TREES]]
    if len(done) > SAID_TREES:
        said.append(f"{len(done) - SAID_TREES} more in {config.journal_dir}")
    say("prolog", f"job {job}: reclaimed {size(sum(t.freed_bytes for t in done))} of stale checkpoint tiers in "
                   f"{seconds:.2f} s: " + "; ".join(said))
