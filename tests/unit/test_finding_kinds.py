"""A finding's kind is one closed vocabulary: every kind healthd produces is in it, each has a policy
row, and each goes through the state file and the job-health record as the very string written
before the vocabulary was closed (records stay readable across versions)."""

from __future__ import annotations

import json

import pytest

from clusterctl.healthd.findings import Finding
from clusterctl.healthd.policy import judge
from clusterctl.records.actions import Action
from clusterctl.records.finding_kind import FINDING_KINDS
from clusterctl.records.gpu_evidence import SLOWDOWN_FINDINGS
from clusterctl.records.healthd_state import GpuState, HealthdState, read_healthd_state, write_healthd_state
from clusterctl.records.healthd_state import StateFinding
from clusterctl.records.job_health import HealthFinding, JobHealthRecord, read_job_health, write_job_health
from clusterctl.records.versioned import RecordError

T0 = 1795305600.0

WRITTEN_BEFORE = {
    "xid", "gpu-lost", "gpu-missing", "ecc-dbe", "remap-failure", "remap-uncorrectable", "remap-pending",
    "retired-pages", "retired-pending", "nvlink-down", "thermal", "thermal-sustained", "clock-events",
    "recovery-action", "nvml-hang", "nvml-error", "nvml-unavailable", "host-memory", "host-disk", "host-disk-full",
    "host-readonly",
}
"""Every kind a producer wrote (grep of healthd/ at the time the vocabulary was closed)."""
ADDED_SINCE = (
    "ib-port-down", "ib-port-slow", "ib-errors", "ib-link-flap", "pcie-degraded", "nvlink-errors", "storage-hung",
    "storage-error", "diagnostic-failed", "roce-retransmits",
)
"""Kinds added since, in the order added (a kind is only ever added, at the end)."""


def test_the_vocabulary_is_exactly_the_kinds_written_so_far():
    before = FINDING_KINDS[:len(WRITTEN_BEFORE)]
    assert set(before) == WRITTEN_BEFORE and FINDING_KINDS[len(WRITTEN_BEFORE):] == ADDED_SINCE
    assert set(SLOWDOWN_FINDINGS) <= set(FINDING_KINDS)  # what the launcher reads in `healthd evidence`


@pytest.mark.parametrize("kind", FINDING_KINDS)
def test_every_kind_has_a_policy_row(kind):
    verdict = judge(Finding(kind, "periodic", T0, gpu=0, xid=79 if kind == "xid" else None,
                            value=1 if kind == "recovery-action" else None))
    assert verdict.rule != "unclassified"


def test_every_kind_round_trips_through_the_state_file_and_the_job_health_record(tmp_path):
    findings = tuple(StateFinding(kind, Action.WARN, "seen", "periodic", T0, gpu=0) for kind in FINDING_KINDS)
    state = HealthdState(node="node3", pid=1, policy_version="p", updated_at=T0, started="2026-11-22T00:00:00Z",
                         nvml_ok=True, gpus=(GpuState(0, "GPU-0", "0000:18:00", findings),))
    write_healthd_state(tmp_path / "run", state)
    raw = json.loads((tmp_path / "run" / "state.json").read_text())
    assert [f["kind"] for f in raw["gpus"]["0"]["findings"]] == list(FINDING_KINDS)  # the strings themselves
    back = read_healthd_state(tmp_path / "run")
    assert back is not None and back.gpus[0].findings == findings

    record = JobHealthRecord(job_id="42", node="node3", window_start="2026-11-22T00:00:00Z",
                             window_end="2026-11-22T00:01:00Z", written_at="2026-11-22T00:01:00Z", gpus=(0,),
                             findings=tuple(HealthFinding(kind, Action.WARN, "seen", "healthd") for kind in FINDING_KINDS))
    path = write_job_health(tmp_path / "records", record)
    assert [f["kind"] for f in json.loads(path.read_text())["findings"]] == list(FINDING_KINDS)
    assert read_job_health(path) == record


def test_a_record_with_a_kind_outside_the_vocabulary_is_refused_naming_the_file(tmp_path):
    record = JobHealthRecord(job_id="42", node="node3", window_start="2026-11-22T00:00:00Z",
                             window_end="2026-11-22T00:01:00Z", written_at="2026-11-22T00:01:00Z", gpus=(0,),
                             findings=(HealthFinding("xid", Action.WARN, "seen", "healthd", xid=13),))
    path = write_job_health(tmp_path, record)
    path.write_text(path.read_text().replace('"kind": "xid"', '"kind": "gpu-on-fire"'))
    with pytest.raises(RecordError, match=f"{path}.*unknown finding kind 'gpu-on-fire'"):
        read_job_health(path)


def test_every_kind_belongs_to_exactly_one_check_family():
    from clusterctl.healthd.checks import FAMILIES

    declared = [kind for family in FAMILIES for kind in family.kinds]
    assert sorted(declared) == sorted(FINDING_KINDS)
    assert all(row.kind in family.kinds for family in FAMILIES for row in family.conditions)
