"""Checkpoint tiers nobody resumes from go back to the node at the next job's start (issue 25: "nodes stay
healthy").  The prolog, root, removes another user's node-local directory once nothing of theirs runs on the
node, and the starting user's own run tiers once unused for `tier_keep_hours`; never through a path a user
could plant.  The decision's properties first, then the prolog on a real directory tree, as an admin sees it.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.engine import gate_verdict
from clusterctl.healthd.findings import Finding
from clusterctl.healthd.gate import GateReport, Problem
from clusterctl.healthd.node_tiers import LocalTiers
from clusterctl.healthd.policy import PolicyConfig
from clusterctl.healthd.stale_tiers import (
    DIRECTORY, OTHER, PLANTED, RUN_TRASH, RUN_TREE, SYMLINK, USER_DIR, USER_TRASH, Entry, NodeTiers, ReclaimSettings,
    UserDir, stale_tiers,
)
from clusterctl.prolog.run import run_prolog
from clusterctl.checkpoint import Checkpointer
from clusterctl.healthd.node_tiers import JobCgroups
from clusterctl.records.checkpoint_settings import CheckpointSettings
from clusterctl.records.healthd_job_start import JobStart, job_start_path, write_job_start
from tests.as_user import as_user
from tests.fakes import FakeCopyNetwork
from clusterctl.records.healthd_tier_reclaim import read_tier_reclaims
from tests.fakes import FakePartition

NOW = 1_800_000_000.0
HOUR = 3600.0
KEY, KEY2, KEY3 = "0123456789abcdef", "fedcba9876543210", "00000000deadbeef"


# ---- the decision (pure) ------------------------------------------------------------------------

UIDS = (0, 1000, 1001, 1002)
names_in_a_base = st.sampled_from([f"clusterctl-{u}" for u in UIDS] + [
    ".clusterctl-reclaim-1001-0badc0de", ".clusterctl-reclaim-1000-0badc0de", "clusterctl-01000", "clusterctl-1000x",
    "clusterctl-", "clusterctl--1", ".clusterctl-reclaim-1001-xyz", "ckpt-" + KEY, "clusterctl-1001 ",
    ".clusterctl-planted-1700000000-1002-1000", ".clusterctl-planted-x-1002-1000"])
names_in_a_user_dir = st.sampled_from([f"ckpt-{KEY}", f"ckpt-{KEY2}", f"ckpt-{KEY3}", f"ckpt-{'1' * 16}"]) \
    | st.sampled_from([f".clusterctl-reclaim-ckpt-{KEY}-0badc0de", "4242", "ckpt-0123", f"ckpt-{KEY}/..",
                       f"ckpt-{KEY.upper()}", f".clusterctl-reclaim-ckpt-{KEY}", "holdings.json", f"ckpt-{KEY} "])

@st.composite
def entries(draw, name: str, usual_owner: int | None) -> Entry:
    """Mostly what clusterctl makes (a private directory of the uid its name says), sometimes anything else."""
    usual = usual_owner is not None and draw(st.booleans())
    return Entry(name, DIRECTORY if usual else draw(st.sampled_from([DIRECTORY, SYMLINK, OTHER])),
                 usual_owner if usual and usual_owner is not None else draw(st.sampled_from(UIDS)),
                 0o700 if usual else draw(st.sampled_from([0o700, 0o755, 0o770, 0o777, 0o1777, 0o702])),
                 draw(st.none() | st.floats(NOW - 100 * HOUR, NOW + HOUR)))


@st.composite
def node_tiers(draw, job_uid: int | None = None) -> NodeTiers:
    """Tier bases holding some of the names above; the starting job's user's directory in half of them."""
    names = draw(st.lists(names_in_a_base, max_size=6, unique=True))
    if job_uid is not None and draw(st.booleans()):
        names = list(dict.fromkeys([f"clusterctl-{job_uid}", *names]))
    dirs = []
    for name in names:
        user = USER_DIR.fullmatch(name) or USER_TRASH.fullmatch(name) or PLANTED.fullmatch(name)
        uid = int(user.group(1)) if user else None
        children = tuple(draw(entries(child, uid))
                         for child in draw(st.lists(names_in_a_user_dir, max_size=5, unique=True)))
        dirs.append(UserDir(draw(st.sampled_from(["/dev/shm", "/local/nvme"])), draw(entries(name, uid)), children))
    return NodeTiers(tuple(dirs), frozenset(draw(st.lists(st.sampled_from(UIDS), max_size=3))))


job_starts = st.lists(st.builds(JobStart, job_id=st.just("9"), start=st.floats(NOW - 100 * HOUR, NOW),
                                uid=st.none() | st.sampled_from(UIDS)), max_size=3)


@st.composite
def scenes(draw) -> tuple[NodeTiers, list[JobStart], ReclaimSettings]:
    """What a node holds, the jobs started on it, and the prolog's settings."""
    rules = ReclaimSettings(draw(st.sampled_from(UIDS)), draw(st.floats(HOUR, 72 * HOUR)), NOW)
    return draw(node_tiers(rules.job_uid)), draw(job_starts), rules


def _found(node: NodeTiers, base: str, name: str) -> UserDir:
    [found] = [d for d in node.dirs if (d.base, d.entry.name) == (base, name)]
    return found


@settings(max_examples=400, deadline=None)
@given(scene=scenes())
def test_only_the_exact_layout_is_ever_removed(scene):
    """A real directory owned by the uid its name says, nobody else may write it; inside it only a run's tier."""
    node, starts, rules = scene
    for reclaim in stale_tiers(node, starts, rules).reclaims:
        found = _found(node, reclaim.base, reclaim.parent or reclaim.name)
        user = USER_DIR.fullmatch(found.entry.name) or USER_TRASH.fullmatch(found.entry.name) \
            or PLANTED.fullmatch(found.entry.name)
        assert user is not None and int(user.group(1)) == reclaim.uid == found.entry.owner
        assert found.entry.kind == DIRECTORY and not found.entry.mode & 0o022
        if reclaim.parent:
            [child] = [c for c in found.children if c.name == reclaim.name]
            assert RUN_TREE.fullmatch(child.name) or RUN_TRASH.fullmatch(child.name)
            assert child.kind == DIRECTORY and child.owner == reclaim.uid == rules.job_uid


@settings(max_examples=400, deadline=None)
@given(scene=scenes())
def test_the_starting_users_fresh_tiers_and_their_directory_are_never_removed(scene):
    node, starts, rules = scene
    for reclaim in stale_tiers(node, starts, rules).reclaims:
        if reclaim.uid != rules.job_uid or USER_TRASH.fullmatch(reclaim.name) or RUN_TRASH.fullmatch(reclaim.name) \
                or PLANTED.fullmatch(reclaim.name):  # what they planted under another's name is no tier of theirs
            continue
        assert reclaim.parent, "the starting user's own directory was removed whole"
        [child] = [c for c in _found(node, reclaim.base, reclaim.parent).children if c.name == reclaim.name]
        assert child.last_used is not None and rules.now - child.last_used >= rules.keep_seconds


@settings(max_examples=400, deadline=None)
@given(scene=scenes())
def test_nothing_of_another_user_with_a_process_or_a_recent_job_here_is_removed(scene):
    node, starts, rules = scene
    present = node.running_uids | {s.uid for s in starts if s.uid is not None and s.start >= node.booted}
    for reclaim in stale_tiers(node, starts, rules).reclaims:
        if not USER_TRASH.fullmatch(reclaim.name):  # what an interrupted reclaim renamed: nobody's any more
            assert reclaim.uid not in present or reclaim.uid == rules.job_uid


@settings(max_examples=200, deadline=None)
@given(scene=scenes())
def test_another_users_directory_with_nothing_of_theirs_on_the_node_is_removed(scene):
    node, starts, rules = scene
    present = node.running_uids | {s.uid for s in starts if s.uid is not None and s.start >= node.booted}
    removed = {(r.base, r.name) for r in stale_tiers(node, starts, rules).reclaims if not r.parent}
    for found in node.dirs:
        user = USER_DIR.fullmatch(found.entry.name)
        if (user and int(user.group(1)) not in present | {rules.job_uid} and found.entry.kind == DIRECTORY
                and found.entry.owner == int(user.group(1)) and not found.entry.mode & 0o022):
            assert (found.base, found.entry.name) in removed


@settings(max_examples=300, deadline=None)
@given(scene=scenes())
def test_only_a_users_directory_another_user_made_is_moved_aside_and_nothing_is_both_moved_and_removed(scene):
    node, starts, rules = scene
    plan = stale_tiers(node, starts, rules)
    for move in plan.moves:
        found = _found(node, move.base, move.name)
        assert USER_DIR.fullmatch(move.name) and int(USER_DIR.fullmatch(move.name).group(1)) == move.uid
        assert found.entry.owner == move.owner not in (move.uid, 0)
        assert PLANTED.fullmatch(move.new_name)
    assert not {(m.base, m.name) for m in plan.moves} & {(r.base, r.parent or r.name) for r in plan.reclaims}


# ---- the prolog on a real tree, as an admin sees it ----------------------------------------------

def healthy(*args, **kwargs) -> GateReport:
    return GateReport(problems=[])


def make_tier(user_dir: Path, key: str, uid: int, *, age_hours: float = 0.0, shard_bytes: int = 4096) -> Path:
    """A run's tier as the checkpoint code leaves it on node3 (a local copy and a buddy's), owned by `uid`, its
    directories last changed `age_hours` ago."""
    tree = user_dir / f"ckpt-{key}"
    for copy in (tree / "node3" / "local" / "step-000000000040", tree / "node3" / "buddy" / "node4" / "step-000000000040"):
        copy.mkdir(parents=True, mode=0o700)
        (copy / "shard-0").write_bytes(os.urandom(shard_bytes))
        (copy / "manifest.json").write_text("{}")
    (tree / "node3" / "holdings.json").write_text("{}")
    own(user_dir, uid)
    when = time.time() - age_hours * HOUR
    for folder in [tree, *(p for p in tree.rglob("*") if p.is_dir())]:
        os.utime(folder, (when, when))
    return tree


def own(path: Path, uid: int) -> None:
    """`path` and everything below it owned by `uid` (the test runs as root)."""
    for item in [path, *path.rglob("*")]:
        os.lchown(item, uid, uid)


def user_dir(base: Path, uid: int, *, owner: int | None = None, mode: int = 0o700) -> Path:
    path = base / f"clusterctl-{uid}"
    path.mkdir(mode=mode)
    os.chmod(path, mode)
    own(path, uid if owner is None else owner)
    return path


@pytest.fixture()
def node(tmp_path):
    """A node's /dev/shm (root's, 1777) and healthd's config pointing at it; an /etc-like directory nearby."""
    if os.geteuid() != 0:
        pytest.skip("the story gives trees to other users (chown): run as root")
    base = tmp_path / "shm"
    base.mkdir()
    os.chmod(base, 0o1777)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    config = HealthdConfig(node="node3", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib",
                           kmsg=tmp_path / "kmsg", job_records_dir=tmp_path / "records", disk_paths=(),
                           tier_bases=(str(base),), checks=CheckLimits(expected_gpus=0))
    return base, etc, config


def prolog(config: HealthdConfig, *, uid: int = 1000, running: frozenset[int] = frozenset({0}), **kwargs) -> int:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_UID": str(uid), "SLURMD_NODENAME": "node3"}
    # The node booted an hour before the test's now (not this machine's boot: a job start's note counts from it).
    tiers = LocalTiers(config.tier_bases, running_uids=lambda: running, booted=lambda: time.time() - 3600)
    return run_prolog(env, FakePartition(20), config, node_check=healthy, tiers=tiers, **kwargs)


def test_a_job_start_gives_the_node_back_what_nobody_will_resume_from(node, capsys):
    """uid 1000 starts a job.  uid 1001 left two runs' tiers and has nothing on the node: gone.  uid 1000's own
    run untouched for 30 h: gone; its run saved an hour ago (the resubmission's fast resume) and its job
    directories: kept.  uid 1002 has a process here, uid 1003 a job whose prolog just ran: kept whole."""
    base, _etc, config = node
    mine = user_dir(base, 1000)
    stale = make_tier(mine, KEY, 1000, age_hours=30, shard_bytes=1 << 20)
    fresh = make_tier(mine, KEY2, 1000, age_hours=1)
    (mine / "4242" / "0" / "node3" / "progress").mkdir(parents=True)
    own(mine, 1000)
    os.utime(mine / "4242", (time.time() - 90 * HOUR,) * 2)
    gone_user = user_dir(base, 1001)
    make_tier(gone_user, KEY, 1001, shard_bytes=1 << 20)
    make_tier(gone_user, KEY3, 1001)
    busy = user_dir(base, 1002)
    make_tier(busy, KEY, 1002, age_hours=50)
    arriving = user_dir(base, 1003)
    make_tier(arriving, KEY, 1003, age_hours=50)
    write_job_start(config.journal_dir, JobStart("8", time.time() - 5, None, 1003))

    assert prolog(config, running=frozenset({0, 1002})) == 0

    assert not stale.exists() and not gone_user.exists()
    assert fresh.exists() and (mine / "4242" / "0" / "node3" / "progress").is_dir()
    assert (busy / f"ckpt-{KEY}").exists() and (arriving / f"ckpt-{KEY}").exists()
    assert sorted(p.name for p in base.iterdir()) == ["clusterctl-1000", "clusterctl-1002", "clusterctl-1003"]
    err = capsys.readouterr().err
    assert re.search(r"clusterctl-prolog: job 7: reclaimed 4\.\d MB of stale checkpoint tiers in \d+\.\d\d s: ", err)
    assert re.search(re.escape(f"{base}/clusterctl-1000/ckpt-{KEY} (uid 1000, 1 run(s), ") + r"2\.\d MB: "
                     + re.escape("not used for 30 h (kept 24 h for a resume))"), err)
    assert re.search(re.escape(f"{base}/clusterctl-1001 (uid 1001, 2 run(s), ") + r"2\.\d MB: "
                     + re.escape("no process of uid 1001 on this node and no job of theirs on it)"), err)
    [record] = read_tier_reclaims(config.journal_dir)
    assert (record.job_id, record.node) == ("7", "node3")
    assert [(t.path, t.uid, t.runs, t.error) for t in record.trees] == [
        (f"{base}/clusterctl-1000/ckpt-{KEY}", 1000, 1, None), (f"{base}/clusterctl-1001", 1001, 2, None)]
    assert record.freed_bytes > 4 << 20  # two 1 MiB shards in each of the two stale runs' tiers


def test_planted_paths_are_never_followed_and_are_left_alone_with_a_line_in_slurmds_log(node, capsys):
    """Another user plants `clusterctl-1004` as a symlink to an /etc-like directory, makes a directory named
    for uid 1005 (moved aside, never looked into), and one open to everyone; uid 1000's own directory holds a
    `ckpt-*` symlink to /etc; the departed uid 1001 left a symlink to /etc inside its directory.  Only 1001's
    directory goes, and of it only the link itself."""
    base, etc, config = node
    (base / "clusterctl-1004").symlink_to(etc)
    os.lchown(base / "clusterctl-1004", 1004, 1004)
    user_dir(base, 1005, owner=1006)
    user_dir(base, 1007, mode=0o777)
    mine = user_dir(base, 1000)
    (mine / f"ckpt-{KEY}").symlink_to(etc)
    os.lchown(mine / f"ckpt-{KEY}", 1000, 1000)
    os.utime(mine / f"ckpt-{KEY}", (time.time() - 90 * HOUR,) * 2, follow_symlinks=False)
    departed = user_dir(base, 1001)
    (departed / "escape").symlink_to(etc)
    (departed / f"ckpt-{KEY}").symlink_to(etc)
    os.utime(etc, (time.time() - 90 * HOUR,) * 2)

    assert prolog(config) == 0

    assert (etc / "shadow").read_text().startswith("root:")
    assert (base / "clusterctl-1004").is_symlink() and not os.path.lexists(base / "clusterctl-1005")
    [moved] = base.glob(".clusterctl-planted-*-1006-1005")
    assert moved.is_dir() and moved.stat().st_uid == 1006
    assert (base / "clusterctl-1007").is_dir() and (mine / f"ckpt-{KEY}").is_symlink()
    assert not departed.exists() and not os.path.lexists(departed)
    err = capsys.readouterr().err
    assert f"{base}/clusterctl-1004: a symlink, not followed; left alone" in err
    assert (f"{base}/clusterctl-1005 was made by uid 1006, not by uid 1005 (planted: it locks uid 1005's jobs out of "
            f"their node-local directory here): moved aside to {moved}") in err
    assert f"{base}/clusterctl-1007: writable by group or others (mode 777); left alone" in err
    assert f"{base}/clusterctl-1000/ckpt-{KEY}: a symlink, not a run's tier of uid 1000; left alone" in err
    assert [t.path for t in read_tier_reclaims(config.journal_dir)[0].trees] == [f"{base}/clusterctl-1005",
                                                                                  f"{base}/clusterctl-1001"]


def test_what_a_stopped_prolog_left_half_removed_goes_at_the_next_job_start(node):
    """slurmd stopped a prolog in the middle of a removal: the tree had been renamed first, so no job ever
    reads half a tier, and the next prolog finishes it, whoever's it was."""
    base, _etc, config = node
    left = base / ".clusterctl-reclaim-1001-0badc0de"
    left.mkdir(mode=0o700)
    make_tier(left, KEY, 1001)
    mine = user_dir(base, 1000)
    half = mine / f".clusterctl-reclaim-ckpt-{KEY}-0badc0de"
    half.mkdir(mode=0o700)
    (half / "node3").mkdir()
    own(mine, 1000)

    assert prolog(config, running=frozenset({0, 1001})) == 0

    assert sorted(p.name for p in base.iterdir()) == ["clusterctl-1000"] and list(mine.iterdir()) == []
    assert {t.why for t in read_tier_reclaims(config.journal_dir)[0].trees} == {"left by an interrupted reclaim"}


def test_a_cleanup_that_fails_is_one_line_in_slurmds_log_and_the_job_starts(node, capsys):
    base, _etc, config = node
    departed = user_dir(base, 1001)

    def process_table_unreadable() -> frozenset[int]:
        raise PermissionError(13, "Permission denied", "/proc")

    code = run_prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "1000"}, FakePartition(20), config, node_check=healthy,
                      tiers=LocalTiers(config.tier_bases, running_uids=process_table_unreadable))
    assert code == 0 and departed.exists()
    assert "job 7: stale checkpoint tiers not reclaimed: PermissionError: [Errno 13] Permission denied: '/proc'" \
           in capsys.readouterr().err


def test_without_the_jobs_uid_nothing_is_reclaimed(node, capsys):
    base, _etc, config = node
    departed = user_dir(base, 1001)
    assert run_prolog({"SLURM_JOB_ID": "7"}, FakePartition(20), config, node_check=healthy,
                      tiers=LocalTiers(config.tier_bases, running_uids=frozenset)) == 0
    assert departed.exists()
    assert "SLURM_JOB_UID is not a uid: stale checkpoint tiers not reclaimed" in capsys.readouterr().err


def test_a_base_a_user_could_swap_entries_in_is_not_looked_into(node, capsys):
    """A base that is not root's (a user's scratch directory listed by mistake) or a symlink to one."""
    base, etc, config = node
    scratch = base.parent / "scratch"
    scratch.mkdir()
    os.chown(scratch, 1001, 1001)
    user_dir(scratch, 1002)
    assert prolog(replace(config, tier_bases=(str(scratch),))) == 0
    assert (scratch / "clusterctl-1002").exists()
    assert f"{scratch}: owned by uid 1001, mode 755: a tier base must be root's" in capsys.readouterr().err


def test_removals_stop_at_the_prologs_budget_and_wait_for_the_next_job(node, capsys):
    base, _etc, config = node
    departed = user_dir(base, 1001)
    late = itertools.count(0.0, config.hook_timeout).__next__  # each look at the clock: one whole budget later
    assert prolog(config, clock=late) == 0
    assert departed.exists()
    assert "out of time: 1 stale checkpoint tier(s) left for the next job's prolog" in capsys.readouterr().err


def test_a_refused_job_reclaims_nothing(node):
    """The node is drained: the job runs elsewhere, and what is on the node waits for the node's next job."""
    def lost_gpu(*args, **kwargs) -> GateReport:
        finding = Finding("gpu-lost", "prolog", time.time(), gpu=1, detail="NVML_ERROR_GPU_IS_LOST")
        return GateReport(problems=[Problem(finding, gate_verdict(finding, PolicyConfig()))])

    base, _etc, config = node
    departed = user_dir(base, 1001)
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "1000", "SLURMD_NODENAME": "node3"}
    assert run_prolog(env, FakePartition(20), config, node_check=lost_gpu,
                      tiers=LocalTiers(config.tier_bases, running_uids=frozenset)) == 1
    assert departed.exists()


def test_a_job_still_running_here_for_longer_than_the_keep_time_keeps_its_users_tiers():
    # Another user's 3-day job has this node between two steps (no process of theirs here just now).
    now = 1_800_000_000.0
    node = NodeTiers((UserDir("/dev/shm", Entry("clusterctl-2000", DIRECTORY, 2000, 0o700),
                              (Entry("ckpt-0123456789abcdef", DIRECTORY, 2000, 0o700),)),), frozenset({0}),
                     booted=now - 30 * 24 * 3600)
    started = JobStart("77", now - 72 * 3600, None, 2000)
    assert stale_tiers(node, [started], ReclaimSettings(1000, 24 * 3600, now)).reclaims == ()
    # A note from before the node booted is a crash's leftover: that user's tier goes.
    rebooted = NodeTiers(node.dirs, node.running_uids, booted=now - 3600)
    assert [r.name for r in stale_tiers(rebooted, [started], ReclaimSettings(1000, 24 * 3600, now)).reclaims] == [
        "clusterctl-2000"]


def test_a_tier_of_very_many_files_is_removed_a_prologs_time_at_a_time_never_holding_a_job_start(node):
    """A departed user left a tier of many small files: a prolog with no time left renames it and stops; the
    next one, with time, finishes it (nothing of it is ever read again meanwhile: it has its trash name)."""
    base, _etc, config = node
    departed = user_dir(base, 1001)
    tree = make_tier(departed, KEY, 1001)
    for i in range(300):
        (tree / "node3" / f"shard-{i}").write_bytes(b"x")
    own(departed, 1001)
    door = LocalTiers(config.tier_bases, running_uids=lambda: frozenset({0}))
    [reclaim] = stale_tiers(door.look(1000), (), ReclaimSettings(1000, 24 * 3600, 1_800_000_000.0)).reclaims
    first = door.remove(reclaim, 0.0)
    assert first.error is not None and first.error.startswith("out of time") and not departed.exists()
    [left] = [p.name for p in base.iterdir()]
    assert left.startswith(".clusterctl-reclaim-1001-")
    [again] = stale_tiers(door.look(1000), (), ReclaimSettings(1000, 24 * 3600, 1_800_000_000.0)).reclaims
    assert again.why == "left by an interrupted reclaim"
    assert door.remove(again, 60.0).error is None and list(base.iterdir()) == []


# ---- a planted directory, a long job's tier: as a second real user sees it --------------------------

VICTIM, PLANTER = 65533, 65534


@pytest.fixture()
def shm():
    """A node's /dev/shm every user can reach (root's, 1777), with healthd's config pointing at it; the runs'
    shared checkpoint directory beside it."""
    if os.geteuid() != 0:
        pytest.skip("plays two users: needs root to become them")
    place = Path(tempfile.mkdtemp(prefix="clusterctl-node-", dir="/tmp"))
    place.chmod(0o755)
    base = place / "shm"
    base.mkdir()
    base.chmod(0o1777)
    (place / "shared").mkdir()
    (place / "shared").chmod(0o1777)
    config = HealthdConfig(node="node3", state_dir=place / "run", journal_dir=place / "lib", kmsg=place / "kmsg",
                           job_records_dir=place / "records", disk_paths=(), tier_bases=(str(base),),
                           checks=CheckLimits(expected_gpus=0))
    yield base, config
    shutil.rmtree(place)


def job_prolog(config: HealthdConfig, job: str, uid: int, running: frozenset[int] = frozenset({0})) -> int:
    env = {"SLURM_JOB_ID": job, "SLURM_JOB_UID": str(uid), "SLURMD_NODENAME": "node3"}
    tiers = LocalTiers(config.tier_bases, running_uids=lambda: running, booted=lambda: time.time() - 3600)
    return run_prolog(env, FakePartition(20), config, node_check=healthy, tiers=tiers)


def training_on_node3(base: Path, job: str, steps: tuple[int, ...] = (1,)) -> tuple[bool, str]:
    """What the job's rank on node3 sees as it sets up its checkpoints and saves (run in the job's user's
    process): whether it has a local tier, and what it said on stderr."""
    import io
    import sys

    said = io.StringIO()
    sys.stderr = said
    settings = CheckpointSettings(run_key=KEY, local_base=str(base), shared_dir=str(base.parent / "shared" / job),
                                  tier_index="", port=4711)
    environ = {**settings.to_env(), "SLURMD_NODENAME": "node3", "RANK": "0", "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "0", "CLUSTERCTL_REPORT_KEY": "00" * 32, "SLURM_JOB_ID": job}
    ckpt = Checkpointer.from_env(environ, transport=FakeCopyNetwork())
    assert ckpt is not None
    for step in steps:
        with ckpt.save_files(step) as directory:
            (directory / "rank-0.json").write_text("{}")
    local = ckpt.tier is not None
    ckpt.close(finished=False)
    return local, said.getvalue()


def test_a_directory_another_user_planted_costs_its_victim_only_the_fast_tier_until_the_next_prolog(shm, capsys):
    """nobody (65534) makes /dev/shm/clusterctl-65533 before uid 65533's job lands on the node.  The job does not
    die: its checkpoints go to shared storage, with a warning naming the planted directory and its owner.  The
    next job's prolog (root) moves the plant aside, without reading it, and the user has their fast tier back."""
    base, config = shm

    def plant() -> None:
        (base / f"clusterctl-{VICTIM}").mkdir(mode=0o700)
        (base / f"clusterctl-{VICTIM}" / "theirs").write_text("the planter's")

    assert as_user(PLANTER, plant) == ("ok", None)

    outcome, (local, said) = as_user(VICTIM, lambda: training_on_node3(base, "41"))
    assert outcome == "ok" and not local
    assert (f"warning: node3: the node's local checkpoint tier is not used: {base}/clusterctl-{VICTIM} belongs to "
            f"uid {PLANTER} (nobody) (owned by uid {PLANTER} (mode 700), not by uid {VICTIM}; planted by another "
            "user?): this node's checkpoints go to shared storage (the next tier)") in said
    assert "saving step 1 to shared storage directly" in said

    assert job_prolog(config, "42", VICTIM, running=frozenset({0, PLANTER})) == 0

    [moved] = base.glob(f".clusterctl-planted-*-{PLANTER}-{VICTIM}")
    assert (moved / "theirs").read_text() == "the planter's" and moved.stat().st_uid == PLANTER
    assert (f"clusterctl-prolog: job 42: {base}/clusterctl-{VICTIM} was made by uid {PLANTER} (nobody), not by uid "
            f"{VICTIM} (planted: it locks uid {VICTIM}'s jobs out of their node-local directory here): moved aside "
            f"to {moved}") in capsys.readouterr().err
    outcome, (local, said) = as_user(VICTIM, lambda: training_on_node3(base, "42"))
    assert outcome == "ok" and local and "warning" not in said
    # Once nothing of the planter's is on the node, what was moved aside goes like any directory of theirs.
    assert job_prolog(config, "43", VICTIM) == 0
    assert not moved.exists() and (base / f"clusterctl-{VICTIM}" / f"ckpt-{KEY}").is_dir()


def test_a_long_jobs_tier_is_kept_however_long_it_goes_unchanged_while_the_job_runs_here(shm):
    """uid 65533's job 51 checkpoints once, then trains for 30 h without a save; the same user's job 52 lands on
    the node: its prolog keeps 51's tier (51 still runs here).  Once 51's epilog has run, job 53's prolog
    reclaims it."""
    base, config = shm
    assert job_prolog(config, "51", VICTIM) == 0
    assert as_user(VICTIM, lambda: training_on_node3(base, "51"))[1][0]
    tier = base / f"clusterctl-{VICTIM}" / f"ckpt-{KEY}"
    when = time.time() - 30 * HOUR
    for folder in [tier, *(p for p in tier.rglob("*") if p.is_dir())]:
        os.utime(folder, (when, when))

    assert job_prolog(config, "52", VICTIM, running=frozenset({0, VICTIM})) == 0
    assert tier.is_dir()

    job_start_path(config.journal_dir, "51").unlink()  # what 51's epilog does
    job_start_path(config.journal_dir, "52").unlink()
    assert job_prolog(config, "53", VICTIM) == 0
    assert not tier.exists()


def test_a_job_with_a_process_in_its_slurm_cgroup_runs_here(tmp_path):
    """The node's running jobs, from its processes' cgroups (v2 and v1 layouts): nothing asked of Slurm."""
    proc = tmp_path / "proc"
    for pid, text in (("101", "0::/system.slice/slurmstepd.scope/job_77/step_extern/user/task_0\n"),
                      ("102", "12:memory:/slurm/uid_1000/job_78/step_0\n4:pids:/slurm/uid_1000/job_78/step_0\n"),
                      ("103", "0::/user.slice/user-1000.slice/session-4.scope\n"), ("self", "0::/job_79\n")):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cgroup").write_text(text)
    (proc / "104").mkdir()  # a process gone meanwhile
    assert JobCgroups(proc).job_ids() == frozenset({"77", "78"})
