"""One rule for "owned by us, not writable by others" (`clusterctl.files.check_owned`), and every
place that trusts a file or directory others could reach asks it.

The table gives each part of the rule a row that passes only because of that part; the
properties say that loosening a mode never makes a refused thing trusted; the stories plant the
same defect (a group-writable file or directory of the right owner) at each of the five places.
"""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.errors import RunError
from clusterctl.files import UnsafePathError, check_owned
from clusterctl.healthd.breaker_ledger import BreakerLedger
from clusterctl.launcher.login.shared_reads import user_cache_dir
from clusterctl.launcher.login.supervisor import EXIT_DONE, Hooks, Supervisor
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.shared.runs import RunDir, create_run
from clusterctl.records.actions import Action
from clusterctl.records.job_health import HealthFinding, JobHealthRecord, write_job_health
from clusterctl.slurm.commands import Slurm
from tests.conftest import REPO
from tests.unit.test_supervisor_loop import Clock, ScriptedSlurm

ME, OTHER = 1000, 1001
FILE, DIRECTORY, LINK, FIFO = stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK, stat.S_IFIFO


def info(kind: int, mode: int, uid: int) -> os.stat_result:
    """A stat result as lstat/fstat would give it (mode, ino, dev, nlink, uid, gid, size, times)."""
    return os.stat_result((kind | mode, 1, 1, 1, uid, uid, 0, 0, 0, 0))


# Each row: what is checked, how, and the first rule it breaks (None: trusted).
TABLE = [
    ("a private file of ours", info(FILE, 0o600, ME), dict(kind="file"), None),
    ("a world-readable file of ours", info(FILE, 0o644, ME), dict(kind="file"), None),
    ("a directory of ours", info(DIRECTORY, 0o755, ME), dict(kind="directory"), None),
    # never a symlink, whatever it points to
    ("a symlink where a file belongs", info(LINK, 0o777, ME), dict(kind="file"), "a symlink"),
    ("a symlink where a directory belongs", info(LINK, 0o755, ME), dict(kind="directory"), "a symlink"),
    # what the caller expects
    ("a directory where a file belongs", info(DIRECTORY, 0o644, ME), dict(kind="file"), "not a regular file"),
    ("a fifo where a file belongs", info(FIFO, 0o644, ME), dict(kind="file"), "not a regular file"),
    ("a file where a directory belongs", info(FILE, 0o755, ME), dict(kind="directory"), "not a directory"),
    # the owner
    ("another user's file", info(FILE, 0o644, OTHER), dict(kind="file"), "owned by uid 1001"),
    ("root's file where only ours count", info(FILE, 0o644, 0), dict(kind="file"), "owned by uid 0"),
    ("root's file where root may own it", info(FILE, 0o644, 0), dict(kind="file", root_may_own=True), None),
    ("another user's file where root may own it", info(FILE, 0o644, OTHER), dict(kind="file", root_may_own=True),
     "not by uid 1000 or root"),
    # nobody else writes it
    ("a group-writable file of ours", info(FILE, 0o664, ME), dict(kind="file"), "writable by group or others"),
    ("an other-writable file of ours", info(FILE, 0o646, ME), dict(kind="file"), "writable by group or others"),
    ("a sticky world-writable directory of ours", info(DIRECTORY, 0o1777, ME), dict(kind="directory"),
     "writable by group or others"),
    ("a group-writable file of root", info(FILE, 0o664, 0), dict(kind="file", root_may_own=True),
     "writable by group or others"),
    # private: nobody else even reads or enters it
    ("a private directory of ours", info(DIRECTORY, 0o700, ME), dict(kind="directory", private=True), None),
    ("a group-readable directory where it must be private", info(DIRECTORY, 0o750, ME),
     dict(kind="directory", private=True), "open to group or others"),
    ("an other-enterable directory where it must be private", info(DIRECTORY, 0o701, ME),
     dict(kind="directory", private=True), "open to group or others"),
]


@pytest.mark.parametrize(("what", "found", "options", "problem"), TABLE, ids=[row[0] for row in TABLE])
def test_the_rule(what, found, options, problem):
    answer = check_owned(found, uid=ME, **options)
    if problem is None:
        assert answer is None, what
    else:
        assert answer is not None and problem in answer, (what, answer)


MODES = st.integers(0, 0o7777)
KINDS = st.sampled_from([FILE, DIRECTORY, LINK, FIFO])
UIDS = st.sampled_from([0, ME, OTHER])
OPTIONS = st.fixed_dictionaries({"kind": st.sampled_from(["file", "directory"]), "root_may_own": st.booleans(),
                                 "private": st.booleans()})


@given(KINDS, MODES, MODES, UIDS, OPTIONS)
def test_more_permissions_never_make_a_refused_thing_trusted(kind, mode, extra, uid, options):
    if check_owned(info(kind, mode, uid), uid=ME, **options) is not None:
        assert check_owned(info(kind, mode | extra, uid), uid=ME, **options) is not None


@given(KINDS, MODES, UIDS, OPTIONS)
def test_private_and_root_only_narrow_or_widen_the_rule_they_name(kind, mode, uid, options):
    found = info(kind, mode, uid)
    if check_owned(found, uid=ME, **{**options, "private": True}) is None:
        assert check_owned(found, uid=ME, **{**options, "private": False}) is None
    if check_owned(found, uid=ME, **{**options, "root_may_own": False}) is None:
        assert check_owned(found, uid=ME, **{**options, "root_may_own": True}) is None


@given(KINDS, MODES, UIDS, OPTIONS)
def test_trusted_means_every_part_of_the_rule_holds(kind, mode, uid, options):
    if check_owned(info(kind, mode, uid), uid=ME, **options) is None:
        assert kind == (FILE if options["kind"] == "file" else DIRECTORY)
        assert uid == ME or (uid == 0 and options["root_may_own"])
        assert not mode & 0o022 and not (options["private"] and mode & 0o077)


def test_a_path_is_read_without_following_a_symlink(tmp_path):
    mine = tmp_path / "mine"
    mine.write_text("")
    mine.chmod(0o644)
    (tmp_path / "link").symlink_to(mine)
    assert check_owned(mine, uid=os.getuid(), kind="file") is None
    assert "a symlink" in (check_owned(tmp_path / "link", uid=os.getuid(), kind="file") or "")
    with pytest.raises(FileNotFoundError):
        check_owned(tmp_path / "missing", uid=os.getuid(), kind="file")


# ---- the same planted defect at each place that trusts what others could reach ---------------------

def test_a_run_whose_journal_its_group_may_write_is_not_supervised(tmp_path):
    run = create_run(tmp_path / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    run.journal_path.chmod(0o664)
    with pytest.raises(RunError, match="writable by group or others"):
        run.check_owned()


def test_a_run_whose_spec_is_a_directory_is_not_supervised(tmp_path):
    run = tmp_path / "run"
    (run / "spec.json").mkdir(parents=True)
    with pytest.raises(RunError, match="not a regular file"):
        RunDir(run).check_owned()


def test_a_cache_directory_its_group_may_enter_is_not_used(tmp_path):
    assert user_cache_dir(tmp_path, os.getuid()) is not None
    (tmp_path / f".clusterctl-{os.getuid()}").chmod(0o750)
    assert user_cache_dir(tmp_path, os.getuid()) is None


def test_a_per_job_records_directory_its_group_may_write_is_refused(tmp_path):
    records = tmp_path / "records"
    (records / "71").mkdir(parents=True)
    (records / "71").chmod(0o775)
    record = JobHealthRecord(job_id="71", node="node3", window_start="2026-11-22T15:00:00Z",
                             window_end="2026-11-22T15:05:00Z", written_at="2026-11-22T15:05:01Z")
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        write_job_health(records, record)


def test_a_breaker_directory_its_group_may_write_is_refused(tmp_path):
    root = tmp_path / "breaker"
    root.mkdir()
    root.chmod(0o775)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        BreakerLedger(root, "node1", now=lambda: 0.0).holds("gpu")


def test_an_epilog_record_its_group_may_write_is_no_evidence(tmp_path):
    run = create_run(tmp_path / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    records = tmp_path / "records"
    record = JobHealthRecord(job_id="1", node="node2", window_start="2026-11-22T15:00:00Z",
                             window_end="2026-11-22T15:05:00Z", written_at="2026-11-22T15:05:01Z",
                             findings=(HealthFinding(kind="xid", action=Action.DRAIN_RESET, reason="GPU fell off the bus",
                                                     source="healthd", xid=79, gpu=3),))

    def script() -> None:
        if list(slurm.jobs) == ["1"] and slurm.jobs["1"]["job_state"] == "RUNNING":
            # the epilog's identity wrote it, but its group may rewrite it: no evidence against node2
            write_job_health(records, record).chmod(0o664)
            slurm.end("1", "FAILED", 1 << 8)
        elif list(slurm.jobs) == ["1", "2"]:
            slurm.end("2", "COMPLETED")
    slurm.on_poll = script
    said: list[str] = []
    hooks = Hooks(clock=clock.time, sleep=clock.sleep, say=said.append)
    assert Supervisor(RunDir(run.path), Slurm(slurm), "/py", records, hooks, evidence_grace=0.0).supervise() == EXIT_DONE
    assert [e for e in run.events() if e.event == "decided"][0].outcome == "program-failure"
    assert any("not written by the epilog" in line and "writable by group or others" in line for line in said)


def test_every_place_asks_the_one_rule():
    """Each of the five places calls check_owned (no private copy of the rule is left behind)."""
    for path in ("clusterctl/files.py", "launcher/login/shared_reads.py", "launcher/shared/runs.py",
                 "launcher/login/attempt_evidence.py", "healthd/breaker_ledger.py"):
        text = (REPO / path).read_text()
        assert "check_owned(" in text, path
        assert "S_IWGRP" not in text or path == "clusterctl/files.py", path
