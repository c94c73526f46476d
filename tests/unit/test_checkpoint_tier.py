"""A node's checkpoint tier: what retention removes, whether a save fits the budget, which steps are
flushed (properties of the pure deciders), and the tier root's ownership rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.checkpoint.tier import (
    CopyOnDisk,
    TierRootError,
    budget_bytes,
    flush_due,
    open_tier_root,
    plan_room,
    retention_victims,
)

copies = st.lists(st.builds(CopyOnDisk, tier=st.sampled_from(["local", "buddy"]),
                            of_node=st.sampled_from(["node1", "node2", "node3"]),
                            step=st.integers(0, 50), size=st.integers(0, 1000)),
                  max_size=30, unique_by=lambda c: (c.tier, c.of_node, c.step))


def groups(found: list[CopyOnDisk]) -> dict[tuple[str, str], list[int]]:
    by: dict[tuple[str, str], list[int]] = {}
    for copy in found:
        by.setdefault((copy.tier, copy.of_node), []).append(copy.step)
    return by


@given(copies, st.integers(-1, 5))
def test_retention_keeps_the_newest_keep_of_each_group_and_never_the_newest_copy(
        found: list[CopyOnDisk], keep: int) -> None:
    victims = retention_victims(found, keep)
    assert set(victims) <= set(found)
    left = groups([c for c in found if c not in set(victims)])
    for group, steps in groups(found).items():
        assert max(steps) in left[group], "the newest complete copy of a group is never removed"
        assert sorted(left[group]) == sorted(steps)[-max(keep, 1):]


@given(copies, st.integers(0, 3000), st.integers(1, 4), st.integers(0, 20000))
def test_room_for_a_save_is_made_only_from_copies_retention_would_remove(
        found: list[CopyOnDisk], estimate: int, keep: int, budget: int) -> None:
    room = plan_room(found, estimate, keep, budget)
    retained_anyway = set(retention_victims(found, keep))
    if room is None:
        most = set(retention_victims([c for c in found if c.tier == "local"], keep - 1)) | retained_anyway
        assert sum(c.size for c in found if c not in most) + estimate > budget
        return
    assert sum(c.size for c in found if c not in set(room)) + estimate <= budget
    for group, steps in groups(found).items():
        assert max(steps) in [c.step for c in found if c not in set(room) and (c.tier, c.of_node) == group]
    assert all(c in retained_anyway or c.tier == "local" for c in room)


@given(st.integers(0, 10**6), st.integers(0, 1000))
def test_a_step_is_flushed_every_kth_step_or_always_when_k_is_zero(step: int, every: int) -> None:
    assert flush_due(step, every) == (every == 0 or step % every == 0)
    assert flush_due(step * every, every)


def test_the_budget_is_the_setting_or_a_quarter_of_the_filesystem() -> None:
    assert budget_bytes(5000, 10**9) == 5000
    assert budget_bytes(0, 4000) == 1000


def test_the_tier_root_is_made_private(tmp_path: Path) -> None:
    base = tmp_path / "base"
    root = base / f"clusterctl-{os.getuid()}" / "ckpt-0123456789abcdef" / "node1"
    assert open_tier_root(root, base) == root
    assert {p.stat().st_mode & 0o777 for p in (root, root.parent, root.parent.parent)} == {0o700}
    assert open_tier_root(root, base) == root, "reused as it is"


def test_a_tier_root_open_to_others_or_planted_as_a_symlink_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "base"
    root = base / f"clusterctl-{os.getuid()}" / "ckpt-0123456789abcdef" / "node1"
    open_tier_root(root, base)
    root.chmod(0o755)
    with pytest.raises(TierRootError, match="open to group or others"):
        open_tier_root(root, base)
    root.rmdir()
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o700)
    root.symlink_to(elsewhere)
    with pytest.raises(TierRootError, match="a symlink"):
        open_tier_root(root, base)
