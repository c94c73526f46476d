"""The records multi-level checkpoints pass between processes (settings, a node's holdings, the step's
tier index, a node's failed resume): each reads back as written, and anything a reader does not exactly
understand is a RecordError naming where and what, never a traceback."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.records.checkpoint_holdings import (
    CheckpointHoldings, CopyRefusals, HeldCopy, LastResume, read_holdings, write_holdings)
from clusterctl.records.checkpoint_settings import SETTINGS_ENV, CheckpointSettings
from clusterctl.records.resume_failure import (
    BadCopy, ResumeFailure, read_resume_failures, write_resume_failure)
from clusterctl.records.tier_index import TierSlot, read_tier_slot, tier_index_text, write_tier_index
from clusterctl.records.versioned import RecordError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TIER_SETTINGS = CheckpointSettings(run_key="0123456789abcdef", local_base="/dev/shm", shared_dir="/runs/r/ckpt",
                                   tier_index="/runs/r/jobs/7/launch-2/tiers.idx", port=23456, keep=3,
                                   flush_every_steps=100, local_budget_bytes=10**9, shared_bytes_per_second=1e9,
                                   resume_step=200)


def test_the_steps_settings_travel_in_one_environment_variable_and_read_back_the_same():
    assert CheckpointSettings.from_env(TIER_SETTINGS.to_env()) == TIER_SETTINGS
    assert CheckpointSettings.from_env({}) is None
    assert str(TIER_SETTINGS.tier_root("node3", 1000)) == "/dev/shm/clusterctl-1000/ckpt-0123456789abcdef/node3"
    with pytest.raises(ValueError, match="not a node name"):
        TIER_SETTINGS.tier_root("../node3")


@pytest.mark.parametrize(("change", "said"), [
    ({"port": 70000}, "field `port` is 70000"),
    ({"local_base": "scratch"}, "local_base 'scratch' must be an absolute path"),
    ({"version": 2}, "newer than this clusterctl understands"),
    ({"colour": "red"}, "unknown field `colour`"),
    ({"flush_at_end": "yes"}, "field `flush_at_end` has the wrong type"),
])
def test_settings_not_understood_are_refused_naming_the_variable_and_the_key(change, said):
    data = {**TIER_SETTINGS.to_json(), **change}
    with pytest.raises(RecordError, match=said) as caught:
        CheckpointSettings.from_env({SETTINGS_ENV: json.dumps(data)})
    assert str(caught.value).startswith(SETTINGS_ENV)
    with pytest.raises(RecordError, match="not a readable JSON record"):
        CheckpointSettings.from_env({SETTINGS_ENV: "{not json"})


def test_a_nodes_holdings_read_back_as_written_and_a_missing_file_is_none(tmp_path):
    holdings = CheckpointHoldings("node3", (HeldCopy(200, "node3", "local", 2, 4, 1.7e9, 0.5),
                                            HeldCopy(200, "node2", "buddy", 1, 4, 1.7e9, 0.25),
                                            HeldCopy(100, "node3", "shared", 2, 4, 1.6e9, 3.0)), 1.7e9)
    path = write_holdings(tmp_path / "holdings.json", holdings)
    assert read_holdings(path) == holdings
    assert read_holdings(tmp_path / "none.json") is None
    path.write_text(json.dumps({**holdings.to_json(), "copies": [{**holdings.copies[0].to_json(), "slot": 9}]}))
    with pytest.raises(RecordError, match=r"copies\[0\]: field `slot` is 9: a slot of a map of 4"):
        read_holdings(path)
    (tmp_path / "link.json").symlink_to(path)
    with pytest.raises(RecordError):
        read_holdings(tmp_path / "link.json")


def test_a_nodes_last_resume_reads_back_with_its_holdings_and_a_version_1_file_is_read_as_none(tmp_path):
    resumed = LastResume(200, "buddy", "node2", "node4", 1.25, 1.7e9)
    holdings = CheckpointHoldings("spare1", (HeldCopy(200, "spare1", "local", 1, 4, 1.7e9, 0.5),), 1.7e9, resumed)
    path = write_holdings(tmp_path / "holdings.json", holdings)
    assert read_holdings(path) == holdings
    shared = CheckpointHoldings("node1", (), 1.7e9, LastResume(200, "shared", "node1", "", 9.5, 1.7e9))
    assert CheckpointHoldings.from_json(json.loads(json.dumps(shared.to_json())), "x") == shared
    older = {k: v for k, v in CheckpointHoldings("node3").to_json().items() if k not in ("last_resume", "copies_refused")}
    assert CheckpointHoldings.from_json({**older, "version": 1}, "x") == CheckpointHoldings("node3")


@pytest.mark.parametrize(("change", "said"), [
    ({"version": 2}, "unknown field `copies_refused`"),
    ({"version": 4}, "newer than this clusterctl understands"),
    ({"last_resume": {"step": 200, "tier": "tape", "of_node": "node2", "held_on": "node4", "seconds": 1, "at": 2}},
     "last_resume: field `tier` is 'tape'"),
    ({"last_resume": {"step": 200, "tier": "buddy", "of_node": "node2", "held_on": "", "seconds": 1, "at": 2}},
     "a buddy copy is held on a node"),
    ({"last_resume": {"step": 200, "tier": "local", "of_node": "n1", "held_on": "n1", "seconds": -1, "at": 2}},
     "field `seconds` is -1"),
    ({"last_resume": {"step": 200, "tier": "local", "of_node": "n1", "held_on": "n1", "seconds": 1, "at": 2,
                      "colour": "red"}}, "unknown field `colour`"),
])
def test_a_last_resume_not_understood_is_refused_naming_the_key(change, said):
    data = {**CheckpointHoldings("spare1", (), 1.0, LastResume(200, "local", "n1", "n1", 1.0, 2.0)).to_json(), **change}
    with pytest.raises(RecordError, match=said):
        CheckpointHoldings.from_json(data, "holdings.json")
    with pytest.raises(RecordError, match="missing field `last_resume`"):
        CheckpointHoldings.from_json({k: v for k, v in data.items() if k not in ("last_resume", "copies_refused")}
                                     | {"version": 2}, "x")


def test_what_a_nodes_copy_server_refused_reads_back_and_older_holdings_are_read_as_none_refused(tmp_path):
    refused = CopyRefusals.of(1.7e9, {"wrong key": 10, "per peer": 2})
    assert refused == CopyRefusals(1.7e9, (("per peer", 2), ("wrong key", 10))) and refused.total == 12
    holdings = CheckpointHoldings("node3", (HeldCopy(200, "node3", "local", 2, 4, 1.7e9, 0.5),), 1.7e9,
                                  LastResume(200, "local", "node3", "node3", 1.0, 1.7e9), refused)
    path = write_holdings(tmp_path / "holdings.json", holdings)
    assert read_holdings(path) == holdings
    assert json.loads(path.read_text())["copies_refused"] == {"since": 1.7e9, "counts": {"per peer": 2, "wrong key": 10}}
    version_2 = {k: v for k, v in holdings.to_json().items() if k != "copies_refused"} | {"version": 2}
    assert CheckpointHoldings.from_json(version_2, "x") == replace(holdings, copies_refused=None)
    assert CopyRefusals.of(1.7e9, {}) is None and CopyRefusals.of(1.7e9, {"busy": 0}) is None
    assert CopyRefusals.of(1.7e9, {"a reason from a newer server": 3}) == CopyRefusals(1.7e9, (("broken", 3),))


@pytest.mark.parametrize(("change", "said"), [
    ({"counts": {}}, "field `counts` must count one or more of busy, handshakes"),
    ({"counts": {"bored": 1}}, "field `counts` must count one or more of"),
    ({"counts": {"busy": 0}}, "field `counts` lists a reason with no connection refused"),
    ({"counts": {"busy": -1}}, "field `busy` is -1"),
    ({"counts": {"busy": True}}, "field `busy` has the wrong type"),
    ({"since": float("nan")}, "field `since` is nan"),
    ({"colour": "red"}, "unknown field `colour`"),
])
def test_copy_refusals_not_understood_are_refused_naming_the_key(change, said):
    data = CheckpointHoldings("node3", (), 1.0, None, CopyRefusals(1.0, (("busy", 1),))).to_json()
    with pytest.raises(RecordError, match=f"copies_refused: (counts: )?{said}"):
        CheckpointHoldings.from_json({**data, "copies_refused": {**data["copies_refused"], **change}}, "holdings.json")
    with pytest.raises(RecordError, match="missing field `copies_refused`"):
        CheckpointHoldings.from_json({k: v for k, v in data.items() if k != "copies_refused"}, "x")


def test_each_node_reads_only_its_own_slots_line_of_the_tier_index(tmp_path):
    slots = [TierSlot("node3", "node7", "local", "node3", "node3"), TierSlot("spare1", "node1", "buddy", "node2", "node4"),
             TierSlot("node1", "-", "shared", "node1", "-")]
    path = write_tier_index(tmp_path / "tiers.idx", 200, slots)
    assert [read_tier_slot(path, s) for s in range(3)] == [(200, 3, slot) for slot in slots]
    assert read_tier_slot(write_tier_index(tmp_path / "fresh.idx", None, [TierSlot("node1", "node2")]), 0) == \
        (None, 1, TierSlot("node1", "node2"))
    with pytest.raises(RecordError, match="no slot 3: the map has 3"):
        read_tier_slot(path, 3)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(RecordError, match="damaged or half-copied"):
        read_tier_slot(path, 0)


def test_a_node_reads_a_few_hundred_bytes_of_a_tier_index_of_any_size(tmp_path, monkeypatch):
    import os

    from clusterctl.records import tier_index
    slots = [TierSlot(f"gpu{i:05d}", f"gpu{(i + 32) % 12500:05d}", "local", f"gpu{i:05d}", f"gpu{i:05d}")
             for i in range(12500)]
    path = write_tier_index(tmp_path / "tiers.idx", 1200, slots)
    read: list[int] = []
    real = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        data = real(fd, size, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr(tier_index.os, "pread", pread)
    assert read_tier_slot(path, 6250) == (1200, 12500, slots[6250])
    assert sum(read) < 400
    long_header = tmp_path / "long.idx"  # a header past the first read (never written so): read on
    text = path.read_text()
    head, rest = text.split("\n", 1)
    long_header.write_text(head[:-1] + " " * 300 + "}\n" + rest)
    assert read_tier_slot(long_header, 1)[2] == slots[1]


def test_a_fresh_start_names_no_copy_and_a_resume_names_every_slots():
    with pytest.raises(ValueError, match="a resume step names where every slot's part is"):
        tier_index_text(200, [TierSlot("node1"), TierSlot("node2", "-", "shared", "node2")])
    with pytest.raises(ValueError, match="names whose part it is"):
        TierSlot("node1", "-", "shared")


def test_a_nodes_failed_resume_reads_back_and_outside_text_stays_on_one_line(tmp_path):
    failure = ResumeFailure("node2", 200, "no copy of slot 1 verified\n(tried 2)",
                            (BadCopy(200, "node2", "buddy", "node3", "fails its checksum (shard rank-1.json)"),))
    write_resume_failure(tmp_path, failure)
    [read] = read_resume_failures(tmp_path)
    assert read.why == "no copy of slot 1 verified\\n(tried 2)" and read.bad_copies == failure.bad_copies
    assert read.bad_copies[0].key == (200, "node2", "buddy", "node3")
    assert read_resume_failures(tmp_path / "elsewhere") == []


@SETTINGS
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
                    max_leaves=20),
       st.sampled_from(["settings", "holdings", "failure"]))
def test_any_json_is_read_as_a_record_or_refused_as_one(data, which):
    base = {"settings": TIER_SETTINGS.to_json(), "holdings": CheckpointHoldings("node1").to_json(),
            "failure": ResumeFailure("node1", 1, "why").to_json()}[which]
    for candidate in (data, {**base, **data} if isinstance(data, dict) else data):
        try:
            if which == "settings":
                CheckpointSettings.from_json(candidate, "x")
            elif which == "holdings":
                CheckpointHoldings.from_json(candidate, "x")
            else:
                ResumeFailure.from_json(candidate, "x")
        except RecordError:
            pass


@SETTINGS
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=5))
def test_any_bytes_as_a_tier_index_are_read_or_refused(tmp_path_factory, raw, slot):
    path = tmp_path_factory.mktemp("idx") / "tiers.idx"
    path.write_bytes(raw)
    try:
        read_tier_slot(path, slot)
    except RecordError:
        pass
