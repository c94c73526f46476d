"""The testbed's root under /tmp is made fresh and owned by root, and never used through a link."""

from __future__ import annotations

import os
import stat

import pytest

pytest.importorskip("clusterctl_testbed", reason="tests the testbed package: pip install -e ./testbed")

from clusterctl_testbed.cluster import Testbed  # noqa: E402
from clusterctl_testbed.layout import Layout  # noqa: E402
from clusterctl_testbed.private_root import ROOT_MODE, ensure_private_root  # noqa: E402
from clusterctl_testbed import system  # noqa: E402

ME = os.geteuid()


def test_a_missing_root_and_its_missing_parents_are_made_owned_and_closed_to_writers(tmp_path):
    root = tmp_path / "ctd" / "t27"
    os.umask(old := os.umask(0o000))  # a umask that leaves everything open must not matter
    try:
        assert ensure_private_root(root, uid=ME) == root
    finally:
        os.umask(old)
    for path in (root, root.parent):
        info = os.lstat(path)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == ME and stat.S_IMODE(info.st_mode) == ROOT_MODE


def test_an_existing_root_of_its_own_is_kept(tmp_path):
    root = tmp_path / "ctb"
    root.mkdir(mode=0o755)
    (root / "log").mkdir()
    ensure_private_root(root, uid=ME)
    assert (root / "log").is_dir()


def test_a_symlink_planted_at_the_root_is_refused_and_never_followed(tmp_path):
    target = tmp_path / "etc"
    target.mkdir()
    (target / "passwd").write_text("keep me")
    root = tmp_path / "ctb"
    root.symlink_to(target)
    with pytest.raises(system.TestbedError, match="a symlink"):
        ensure_private_root(root, uid=ME)
    # `down` must not empty what the link points at.
    with pytest.raises(system.TestbedError, match="a symlink"):
        Testbed(Layout(root=root, namespace_prefix="t27f-none-")).down(quiet=True)
    assert (target / "passwd").read_text() == "keep me"


def test_a_root_writable_by_others_is_refused(tmp_path):
    root = tmp_path / "ctb"
    root.mkdir()
    root.chmod(0o777)
    with pytest.raises(system.TestbedError, match="writable by group or others"):
        ensure_private_root(root, uid=ME)


def test_a_root_made_by_another_user_is_refused(tmp_path):
    root = tmp_path / "ctb"
    root.mkdir(mode=0o755)
    with pytest.raises(system.TestbedError, match=rf"owned by uid {ME} \(mode [0-7]+\), not by uid {ME + 1}"):
        ensure_private_root(root, uid=ME + 1)


def test_a_file_at_the_root_is_refused(tmp_path):
    root = tmp_path / "ctb"
    root.write_text("")
    with pytest.raises(system.TestbedError, match="not a directory"):
        ensure_private_root(root, uid=ME)


def test_a_parent_planted_in_a_directory_everyone_writes_is_refused_too(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (shared / "ctd").symlink_to(elsewhere)  # /tmp/ctd, planted before the compose testbed's first `up`
    with pytest.raises(system.TestbedError, match=f"{shared}/ctd: a symlink"):
        ensure_private_root(shared / "ctd" / "t27", uid=ME)
    assert not list(elsewhere.iterdir())
