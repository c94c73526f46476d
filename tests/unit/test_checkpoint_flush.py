"""Flushing a node's copy to shared storage: the token bucket on a fake clock, and a flushed copy
that is complete, checked against its manifest, and never half-written under its final name."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.checkpoint.copies import CopyError, shards_of, verify_copy
from clusterctl.checkpoint.flush import Throttle, flush_copy
from clusterctl.records.checkpoint_manifest import CheckpointManifest, read_checkpoint_manifest


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_throttle_lets_a_second_of_bytes_through_then_paces_the_rest() -> None:
    clock = FakeClock()
    throttle = Throttle(1000, clock, clock.sleep)
    throttle.take(1000)
    assert clock.slept == [], "one second's worth goes at once"
    for _ in range(4):
        throttle.take(500)
    assert sum(clock.slept) == pytest.approx(2.0)
    clock.now += 10  # idle: the bucket refills, but only to one second's worth
    throttle.take(1000)
    assert sum(clock.slept) == pytest.approx(2.0)
    throttle.take(3000)  # larger than the bucket: goes into debt, paid by one sleep
    assert clock.slept[-1] == pytest.approx(3.0)


def test_an_unlimited_throttle_never_sleeps() -> None:
    clock = FakeClock()
    throttle = Throttle(0, clock, clock.sleep)
    throttle.take(10**12)
    assert clock.slept == []


def local_copy(tmp_path: Path) -> tuple[Path, CheckpointManifest]:
    copy = tmp_path / "local" / "step-000000000010"
    (copy / "rank-3").mkdir(parents=True)
    (copy / "rank-3" / "__0_0.distcp").write_bytes(b"weights" * 100)
    (copy / "params.json").write_text("{}")
    manifest = CheckpointManifest(step=10, of_node="node2", tier="local", held_on="node2", shards=shards_of(copy),
                                  written_at=1.0, save_seconds=0.5, slot=1, slots=4)
    return copy, manifest


def test_a_flushed_copy_is_complete_on_shared_storage(tmp_path: Path) -> None:
    copy, manifest = local_copy(tmp_path)
    clock = FakeClock()
    flushed = flush_copy(copy, manifest, tmp_path / "shared", 1, Throttle(100, clock, clock.sleep))
    final = tmp_path / "shared" / "tiers" / "step-000000000010" / "slot-000001"
    assert read_checkpoint_manifest(final / "manifest.json") == flushed
    assert (flushed.tier, flushed.held_on, flushed.of_node, flushed.slot, flushed.shards) == \
        ("shared", None, "node2", 1, manifest.shards)
    assert verify_copy(final, flushed) == ""
    assert sum(clock.slept) == pytest.approx((manifest.total_bytes - 100) / 100)
    assert [p.name for p in final.parent.iterdir()] == ["slot-000001"]


def test_a_copy_changed_since_its_manifest_is_not_flushed(tmp_path: Path) -> None:
    copy, manifest = local_copy(tmp_path)
    (copy / "params.json").write_text("[]")
    with pytest.raises(CopyError, match="do not match"):
        flush_copy(copy, manifest, tmp_path / "shared", 1, Throttle(0))
    assert list((tmp_path / "shared" / "tiers" / "step-000000000010").iterdir()) == []
