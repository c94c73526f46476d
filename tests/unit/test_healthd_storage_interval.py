"""The shared-storage probe runs at each node's own time in every `storage_interval_s`, not on every periodic
pass: what an admin sees on a pinned clock (passes every 15 s, no sleeps), across a fleet's names, and in
healthd.toml's errors."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.healthd.checks.storage import StorageLimits, StorageProbe, probe_phase
from clusterctl.healthd.config import ConfigError, load_config

T0 = 1795305600.0
PASS = 15.0


class Fleet:
    """One node's probe on a pinned clock: `passes(n)` runs n periodic passes 15 s apart."""

    def __init__(self, node: str = "node00042", run=None, limits: StorageLimits | None = None) -> None:
        self.now = T0
        self.runs: list[float] = []
        self.limits = limits or StorageLimits()
        self.probe = StorageProbe(lambda: self.now - T0 + 100.0, run or self._passes, node=node)

    def _passes(self, path: str) -> None:
        self.runs.append(self.now)

    def passes(self, count: int, paths: tuple[str, ...] = ("/lustre/ckpt",)) -> list[list[str]]:
        """The kinds found on each of `count` passes."""
        seen = []
        for _ in range(count):
            seen.append([finding.kind for finding in self.probe.check(list(paths), self.limits, self.now)])
            self.now += PASS
        return seen


def test_a_node_probes_once_per_storage_interval_at_its_own_time_not_on_every_pass():
    fleet = Fleet()
    fleet.passes(int(6 * 3600 / PASS))  # six hours of 15-s passes: 1,440 of them
    assert len(fleet.runs) == 18  # one every 20 min, not 1,440
    gaps = [later - earlier for earlier, later in zip(fleet.runs, fleet.runs[1:])]
    assert all(1200 <= gap < 1200 + PASS for gap in gaps)
    offset = probe_phase("node00042") * 1200
    assert all(0 <= (at - offset) % 1200 < PASS for at in fleet.runs)  # its own slot, on the wall clock
    assert fleet.runs[0] - T0 < 1200  # not at start: a fleet restarted together does not probe together


def test_a_shorter_interval_set_on_a_reload_is_followed_from_then_on():
    fleet = Fleet(limits=StorageLimits(storage_interval_s=3600))
    fleet.passes(int(3600 / PASS))
    assert len(fleet.runs) == 1
    fleet.limits = StorageLimits(storage_interval_s=60)
    fleet.runs.clear()
    fleet.passes(int(3600 / PASS))
    assert len(fleet.runs) == 60


def test_a_failed_probe_stands_on_every_pass_until_a_probe_passes():
    broken = [True]

    def run(path: str) -> None:
        fleet.runs.append(fleet.now)
        if broken[0]:
            raise OSError(5, "Input/output error", path)

    fleet = Fleet(run=run)
    before = fleet.passes(int(1200 / PASS))  # the first slot comes within one interval
    first = next(i for i, kinds in enumerate(before) if kinds)
    assert before[first:] == [["storage-error"]] * (len(before) - first) and len(fleet.runs) == 1
    broken[0] = False
    after = fleet.passes(int(1200 / PASS))  # the next probe passes: clean from then on
    assert len(fleet.runs) == 2 and after[-1] == [] and ["storage-error"] in after


def test_a_hung_probe_is_reported_hung_on_every_pass_with_no_second_probe_across_its_slots():
    release = threading.Event()
    started: list[str] = []

    def hangs(path: str) -> None:
        started.append(path)
        release.wait(60)

    fleet = Fleet(run=hangs, limits=StorageLimits(storage_timeout_s=0.1, storage_interval_s=60))
    try:
        seen = fleet.passes(int(1200 / PASS))  # 20 slots go by while it hangs
        first = next(i for i, kinds in enumerate(seen) if kinds)
        assert seen[first:] == [["storage-hung"]] * (len(seen) - first)
        assert started == ["/lustre/ckpt"]
    finally:
        release.set()


def test_a_path_removed_on_a_reload_is_no_longer_reported():
    def fails(path: str) -> None:
        raise OSError(2, "No such file or directory", path)

    fleet = Fleet(run=fails)
    seen = fleet.passes(int(1200 / PASS), ("/lustre/ckpt", "/nfs/home"))
    assert seen[-1] == ["storage-error", "storage-error"]
    assert fleet.passes(1, ("/nfs/home",)) == [["storage-error"]]


@given(st.text(st.characters(whitelist_categories=("Ll", "Nd"), whitelist_characters="-"), min_size=1,
               max_size=12))
@settings(max_examples=8, deadline=None)
def test_a_fleets_probes_spread_over_the_interval_whatever_its_names(prefix):
    """12,500 nodes, 1,200 s: about 156 probes start in any 15-s pass; never a burst of the whole fleet."""
    nodes = [f"{prefix}{i:05d}" for i in range(12_500)]
    per_pass = [0] * 80
    for node in nodes:
        phase = probe_phase(node)
        assert 0 <= phase < 1 and phase == probe_phase(node)
        per_pass[int(phase * 80)] += 1
    assert max(per_pass) <= 2 * 12_500 / 80  # binomial around 156 (sd 12): 312 is far out of reach
    assert min(per_pass) > 0


def test_the_storage_interval_is_read_from_healthd_toml(tmp_path):
    path = tmp_path / "healthd.toml"
    path.write_text('storage_paths = ["/lustre/ckpt"]\n\n[checks]\nstorage_interval_s = 3600\n')
    assert load_config(path).checks.storage_interval_s == 3600
    assert StorageLimits().storage_interval_s == 1200


@pytest.mark.parametrize("value", ["0", "-60", "5", "nan", "inf", "1e9", '"20m"', "true"])
def test_a_bad_storage_interval_is_an_error_naming_file_line_and_key(tmp_path: Path, value):
    path = tmp_path / "healthd.toml"
    path.write_text(f'storage_paths = ["/lustre/ckpt"]\n\n[checks]\nstorage_interval_s = {value}\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}:4: key `checks.storage_interval_s` must be a number between "
                                        f"15 and 86400")
    assert raised.value.key == "checks.storage_interval_s"
