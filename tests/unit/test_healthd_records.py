"""healthd's cross-process files: each round-trips through its one definition, and a reader
refuses a file from a newer healthd with an error saying what to do."""

from __future__ import annotations

import json
import os

import pytest

from clusterctl.records.actions import Action
from clusterctl.records.healthd_actions import (
    PlannedAction, append_done, append_planned, read_action_journal,
)
from clusterctl.records.healthd_job_start import JobStart, job_start_path, read_job_start, write_job_start
from clusterctl.records.healthd_kmsg_cursor import KmsgCursor, cursor_path, read_kmsg_cursor, write_kmsg_cursor
from clusterctl.records.healthd_node_record import (
    NodeRecordEntry, append_node_record, node_record_path, read_node_record,
)
from clusterctl.records.healthd_tier_reclaim import (
    ReclaimedTree, TierReclaim, append_tier_reclaim, read_tier_reclaims, tier_reclaims_path,
)
from clusterctl.records.healthd_state import (
    Alert, GpuState, HealthdState, StateFinding, read_healthd_state, state_path, write_healthd_state,
)
from clusterctl.records.healthd_xid_history import (
    XidSighting, append_xid_sighting, read_xid_history, xid_history_path,
)
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.nodes import NodeState

XID_79 = StateFinding(kind="xid", xid=79, action=Action.DRAIN_REBOOT, reason="GPU has fallen off the bus",
                      source="nvml-event", at_ts=1795305600.0, gpu=3, uuid="GPU-3", jobs=("4242",), handled=True)
STATE = HealthdState(
    node="node3", pid=4321, policy_version="2026.11.1", updated_at=1795305601.5, started="2026-11-22T00:00:00Z",
    nvml_ok=True,
    gpus=(GpuState(0, "GPU-0", "0000:18:00"),
          GpuState(3, "GPU-3", "0000:5d:00", (XID_79,)),
          GpuState(10, "GPU-10", "0000:e0:00")),
    node_findings=(StateFinding("host-disk", Action.DRAIN_RESET, "a configured path is (nearly) full", "host",
                                1795305600.0, detail="/tmp 1.0% free", current=True),),
    pending_actions=1, slurm=NodeState("node3", "idle", ("DRAIN",), "healthd: xid 79 gpu3", ("gpu",)),
    alerts=(Alert("2026-11-22T00:00:00Z", "breaker-open", "healthd: ...", "2 of 4 nodes"),),
    loop_age_s={"periodic": 0.4}, dry_run=False)


def bump_version(path) -> None:
    """Rewrite the (first) record of `path` as a newer healthd would write it."""
    if path.suffix == ".jsonl":
        records = [json.loads(line) for line in path.read_text().splitlines()]
    else:
        records = [json.loads(path.read_text())]
    records[0]["version"] += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_state_round_trips(tmp_path):
    write_healthd_state(tmp_path, STATE)
    assert read_healthd_state(tmp_path) == STATE


def test_state_keeps_the_kind_and_the_xid_apart_for_readers_and_jq(tmp_path):
    write_healthd_state(tmp_path, STATE)
    stored = json.loads(state_path(tmp_path).read_text())
    finding = stored["gpus"]["3"]["findings"][0]
    assert (finding["kind"], finding["xid"], finding["what"]) == ("xid", 79, "xid 79")
    assert stored["verdict"] == "drain-reboot" and stored["gpus"]["3"]["verdict"] == "drain-reboot"


def test_state_from_a_newer_healthd_is_refused(tmp_path):
    write_healthd_state(tmp_path, STATE)
    bump_version(state_path(tmp_path))
    with pytest.raises(RecordError, match=r"state.json: healthd-state record version 2 is newer than this "
                                          r"clusterctl understands \(1\); upgrade clusterctl on this host"):
        read_healthd_state(tmp_path)


def test_no_state_file_is_no_state_and_a_damaged_one_says_so(tmp_path):
    assert read_healthd_state(tmp_path) is None
    state_path(tmp_path).write_text('{"kind": "healthd-state", "vers')
    with pytest.raises(RecordError, match="not a readable JSON record"):
        read_healthd_state(tmp_path)


def test_a_power_cut_while_writing_the_state_leaves_the_previous_state_readable(tmp_path, monkeypatch):
    write_healthd_state(tmp_path, STATE)

    def power_cut(fd):
        raise OSError("power cut before the new state was durable")

    monkeypatch.setattr(os, "fsync", power_cut)
    with pytest.raises(OSError, match="power cut"):
        write_healthd_state(tmp_path, HealthdState("node3", 1, "2026.11.1", 0.0, "2026-11-22T00:00:00Z", False))
    monkeypatch.undo()
    assert read_healthd_state(tmp_path) == STATE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_action_journal_round_trips_and_knows_what_is_pending(tmp_path):
    path = tmp_path / "actions.jsonl"
    drain = PlannedAction("drain-node3-1", "drain", "healthd: xid 79 gpu3 (GPU-3) drain-reboot 2026-11-22T00:00:00Z",
                          1795305600.0, XID_79)
    resume = PlannedAction("resume-node3-2", "resume", drain.reason, 1795305700.0)
    append_planned(path, drain)
    append_done(path, drain.id, "drained")
    append_planned(path, resume)
    journal = read_action_journal(path)
    assert journal.planned == (drain, resume) and journal.results == {drain.id: "drained"}
    assert journal.pending == (resume,)


def test_action_journal_skips_and_reports_a_line_torn_by_a_crash(tmp_path):
    path = tmp_path / "actions.jsonl"
    append_planned(path, PlannedAction("a1", "drain", "healthd: x", 1.0))
    with open(path, "a") as f:
        f.write('{"kind": "healthd-action", "version": 1, "done": "a1", "res')
    journal = read_action_journal(path)
    assert [a.id for a in journal.pending] == ["a1"] and journal.torn_lines == (2,)


def test_action_journal_from_a_newer_healthd_is_refused(tmp_path):
    path = tmp_path / "actions.jsonl"
    append_planned(path, PlannedAction("a1", "drain", "healthd: x", 1.0))
    bump_version(path)
    with pytest.raises(RecordError, match="actions.jsonl: record 1: healthd-action record version 2 is newer"):
        read_action_journal(path)


def test_job_start_round_trips(tmp_path):
    record = JobStart("42", 1795305600.25, (0, 1, 3))
    write_job_start(tmp_path, record)
    assert read_job_start(tmp_path, "42") == record
    assert read_job_start(tmp_path, "43") is None


def test_job_start_from_a_newer_prolog_is_refused(tmp_path):
    write_job_start(tmp_path, JobStart("42", 1.0))
    bump_version(job_start_path(tmp_path, "42"))
    with pytest.raises(RecordError, match="healthd-job-start record version 2 is newer"):
        read_job_start(tmp_path, "42")


def test_node_record_round_trips(tmp_path):
    entry = NodeRecordEntry("2026-11-22T00:00:00Z", "prolog", "7", "node3", ("gpu2 remap-failure: ...",),
                            "drained: healthd: remap-failure gpu2 drain-rma 2026-11-22T00:00:00Z")
    append_node_record(tmp_path, entry)
    append_node_record(tmp_path, entry)
    assert read_node_record(tmp_path) == (entry, entry)


def test_node_record_from_a_newer_hook_is_refused(tmp_path):
    append_node_record(tmp_path, NodeRecordEntry("2026-11-22T00:00:00Z", "prolog", "7", "node3", (), "x"))
    bump_version(node_record_path(tmp_path))
    with pytest.raises(RecordError, match="healthd-node-record record version 2 is newer"):
        read_node_record(tmp_path)


RECLAIM = TierReclaim("2026-11-22T00:00:00Z", "7", "node3", 0.25, (
    ReclaimedTree("/dev/shm/clusterctl-1001", 1001, 2, 3_000_000_000, "no process of uid 1001 on this node"),
    ReclaimedTree("/dev/shm/clusterctl-1000/ckpt-0123456789abcdef", 1000, 1, 0, "not used for 31 h",
                  error="not removed whole (1 error(s); the first: x: Device or resource busy)")))


def test_tier_reclaims_round_trip(tmp_path):
    append_tier_reclaim(tmp_path, RECLAIM)
    append_tier_reclaim(tmp_path, RECLAIM)
    assert read_tier_reclaims(tmp_path) == (RECLAIM, RECLAIM)
    assert RECLAIM.freed_bytes == 3_000_000_000


def test_tier_reclaims_from_a_newer_prolog_are_refused(tmp_path):
    append_tier_reclaim(tmp_path, RECLAIM)
    bump_version(tier_reclaims_path(tmp_path))
    with pytest.raises(RecordError, match="healthd-tier-reclaim record version 2 is newer"):
        read_tier_reclaims(tmp_path)


def test_a_reclaimed_tree_with_a_field_this_reader_does_not_know_is_refused(tmp_path):
    record = RECLAIM.to_json()
    record["trees"][0]["inode"] = 12
    tier_reclaims_path(tmp_path).write_text(json.dumps(record) + "\n")
    with pytest.raises(RecordError, match="tree 1: unknown field `inode`"):
        read_tier_reclaims(tmp_path)


def test_xid_history_round_trips(tmp_path):
    sightings = (XidSighting(1.0, 13, "nvml-event", 1, "GPU-1", ("101",)), XidSighting(2.0, 79, "kmsg"))
    for sighting in sightings:
        append_xid_sighting(tmp_path, sighting)
    assert read_xid_history(tmp_path) == sightings


def test_xid_history_from_a_newer_healthd_is_refused(tmp_path):
    append_xid_sighting(tmp_path, XidSighting(1.0, 13, "nvml-event"))
    bump_version(xid_history_path(tmp_path))
    with pytest.raises(RecordError, match="healthd-xid record version 2 is newer"):
        read_xid_history(tmp_path)


def test_kmsg_cursor_round_trips(tmp_path):
    assert read_kmsg_cursor(tmp_path) is None
    write_kmsg_cursor(tmp_path, KmsgCursor("boot-a", 1207))
    assert read_kmsg_cursor(tmp_path) == KmsgCursor("boot-a", 1207)


def test_kmsg_cursor_from_a_newer_healthd_is_refused(tmp_path):
    write_kmsg_cursor(tmp_path, KmsgCursor("boot-a", 1207))
    bump_version(cursor_path(tmp_path))
    with pytest.raises(RecordError, match="healthd-kmsg-cursor record version 2 is newer"):
        read_kmsg_cursor(tmp_path)
