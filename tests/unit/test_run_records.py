"""The launcher's cross-process records: run journal, rank map, rank records, shared Slurm answers, run spec.

Each round-trips through its file, and a reader refuses what it does not understand (a newer
version, an unknown event) with one clear line instead of guessing.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.launcher.shared.runs import create_run
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.records.rank_map import JobRankMap, PlanSummary, RankMap, read_rank_map, write_rank_map
from clusterctl.records.rank_record import RankRecord, read_rank_record, write_rank_record
from clusterctl.records.run_journal import (
    AgentEnded, BlamedNode, Created, Decided, DecisionAction, Ending, EventKind, OutcomeKind, RecoveredInAllocation,
    Resumed, RunEnded,
    SlurmTimes, StragglerFound, Submitted, Submitting, SubmitLost, Waiting, append_run_event, read_run_journal,
)
from clusterctl.records.slurm_cache import CachedAnswer, cache_path, read_cached_answer, write_cached_answer
from clusterctl.records.versioned import RecordError
from tests.conftest import REPO

BLAME = BlamedNode("node3", "healthd: xid 79 gpu3", ("drained by healthd: healthd: xid 79 gpu3",), 9e9)
EVERY_EVENT = [
    Created(at=1.0, name="toy", source="job.toml"),
    Waiting(at=1.5, message="only 2 usable nodes"),
    Submitting(at=2.0, attempt=1, comment="clusterctl:r:1:ab"),
    Submitted(at=2.5, attempt=1, job_id="7", argv=("sbatch", "x.sbatch"), resume_from="/ck/step-9", exclude="node9"),
    Submitted(at=2.6, attempt=1, job_id="7", reconciled=True),
    Ending(at=3.0, attempt=1, job_id="7", blame=(BlamedNode("node3", "healthd: xid 79", ("evidence",)),)),
    Decided(at=4.0, attempt=1, job_id="7", state="CANCELLED", exit_code=None, outcome=OutcomeKind.NODE_FAILURE,
            message="blamed node3", blame=(BLAME,), checkpoint_step=20, checkpoint="/ck/step-20",
            action=DecisionAction.RESUBMIT, delay=2.0, times=SlurmTimes(2.0, 2.2, 3.9)),
    Decided(at=4.1, attempt=2, job_id=None, state="LOST", exit_code=None, outcome=OutcomeKind.NODE_FAILURE,
            message="vanished", blame=(), checkpoint_step=None, checkpoint=None, action=DecisionAction.RESUBMIT),
    SubmitLost(at=5.0, attempt=2, comment="clusterctl:r:2:cd"),
    StragglerFound(at=5.1, job_id="9", node="node2", ranks=(2, 3), ratio=2.5, seconds=0.5, reference=0.2, steps=32,
                   since_step=21, lost_s=9.6, evidence=("ranks 2-3 on node2 computed 0.5 s per step",),
                   hardware=("GPU 1: HW thermal slowdown (0x40)",), action="swapped",
                   blame=(BlamedNode("node2", "straggler", ("2.5x",), 9e9),), drain="drained"),
    RecoveredInAllocation(at=5.2, job_id="9", restart=1, blame=(BLAME,), nodes=("node1", "node4"),
                          given_back=("node2",), checkpoint_step=20, checkpoint="/ck/step-20",
                          phases=(("end_step", 0.4),), reason=""),
    RecoveredInAllocation(at=5.3, job_id="9", restart=2, blame=(BLAME,), nodes=("node3", "node4"),
                          agent="node4", took_over_from="node1"),
    AgentEnded(at=5.9, job_id="9", agent="node4", epoch=2, exit_code=0, outcome=OutcomeKind.COMPLETED,
               message="the step completed", blame=(BLAME,)),
    Resumed(at=5.95, job_id="9", restart=1, step=20, nodes=8, tiers=(("local", 6), ("buddy", 1), ("shared", 1)),
            buddy_copies=("node2's on node1",), reported=8, read_seconds=3.25, slowest_node="node4"),
    Resumed(at=5.96, job_id="9", restart=0, step=20, nodes=2, tiers=(("shared", 2),)),
    RunEnded(kind=EventKind.DONE, at=6.0, message="the run completed"),
    RunEnded(kind=EventKind.STOPPED, at=6.0, message="restart.max_restarts = 5 reached"),
    RunEnded(kind=EventKind.CANCELLED, at=6.0, message="cancelled by the user", jobs=("7", "8")),
]


# ---- run journal -------------------------------------------------------------------------
def test_every_journal_event_reads_back_as_written(tmp_path):
    journal = tmp_path / "journal.jsonl"
    for event in EVERY_EVENT:
        append_run_event(journal, event)
    assert read_run_journal(journal).events == tuple(EVERY_EVENT)


def test_a_journal_line_carries_kind_version_and_the_event_name(tmp_path):
    journal = tmp_path / "journal.jsonl"
    append_run_event(journal, Submitting(at=2.0, attempt=1, comment="c"))
    assert json.loads(journal.read_text()) == {"kind": "run-event", "version": 1, "event": "submitting", "at": 2.0,
                                               "attempt": 1, "comment": "c"}


def test_only_a_shrink_s_line_says_version_2_so_older_readers_keep_reading_the_rest(tmp_path):
    journal = tmp_path / "journal.jsonl"
    plain = RecoveredInAllocation(at=3.0, job_id="7", restart=1, blame=(), nodes=("node1",), given_back=(),
                                  checkpoint_step=None, checkpoint=None)
    shrunk = replace(plain, data_parallel_before=4, data_parallel_after=3)
    append_run_event(journal, plain)
    append_run_event(journal, shrunk)
    first, second = (json.loads(line) for line in journal.read_text().splitlines())
    assert (first["version"], second["version"]) == (1, 2)
    assert (second["data_parallel_before"], second["data_parallel_after"]) == (4, 3)
    assert read_run_journal(journal).events == (plain, shrunk)


def _journal_with(tmp_path: Path, line: dict) -> Path:
    journal = tmp_path / "journal.jsonl"
    append_run_event(journal, Created(at=1.0, name="toy"))
    journal.write_text(journal.read_text() + json.dumps(line) + "\n")
    return journal


def test_a_straggler_event_with_an_action_this_clusterctl_does_not_know_is_refused(tmp_path):
    good = json.loads(json.dumps({"kind": "run-event", "version": 1, "event": "straggler", "at": 5.1,
                                  **EVERY_EVENT[9].fields()}))
    journal = _journal_with(tmp_path, {**good, "action": "evicted"})
    with pytest.raises(RecordError, match=r"journal.jsonl:2: field `action` is 'evicted', which this clusterctl "
                                          r"does not know \(known: reported, excluded, swapped\)"):
        read_run_journal(journal)


@pytest.mark.parametrize(("change", "said"), [
    ({"tiers": {"tape": 1}}, "field `tiers` must map local, buddy, shared to node counts"),
    ({"tiers": {"local": -1}}, "field `tiers` must map"),
    ({"read_seconds": "fast"}, "field `read_seconds` has the wrong type"),
    ({"slowest_node": "node 4"}, "field `slowest_node`"),
])
def test_a_resumed_event_not_understood_is_refused_naming_the_field(tmp_path, change, said):
    event = next(e for e in EVERY_EVENT if isinstance(e, Resumed))
    good = json.loads(json.dumps({"kind": "run-event", "version": 1, "event": "resumed", "at": 5.95, **event.fields()}))
    with pytest.raises(RecordError, match=r"journal.jsonl:2: " + said):
        read_run_journal(_journal_with(tmp_path, {**good, **change}))


def test_a_journal_from_a_newer_clusterctl_is_refused(tmp_path):
    journal = _journal_with(tmp_path, {"kind": "run-event", "version": 3, "event": "submitted", "at": 2.0})
    with pytest.raises(RecordError, match=r"journal.jsonl:2: run-event record version 3 is newer than this "
                                          r"clusterctl understands \(2\); upgrade clusterctl"):
        read_run_journal(journal)


def test_a_shrink_reads_back_with_its_data_parallel_sizes_and_a_version_1_recovery_still_reads(tmp_path):
    shrank = RecoveredInAllocation(at=5.4, job_id="9", restart=3, blame=(BLAME,), nodes=("node1", "node3"),
                                   given_back=("node2", "node4"), checkpoint_step=40, data_parallel_before=8,
                                   data_parallel_after=4)
    journal = tmp_path / "new" / "journal.jsonl"
    journal.parent.mkdir()
    append_run_event(journal, shrank)
    line = json.loads(journal.read_text())
    assert (line["version"], line["data_parallel_before"], line["data_parallel_after"]) == (2, 8, 4)
    assert read_run_journal(journal).events == (shrank,) and shrank.shrank
    old = {key: value for key, value in line.items() if not key.startswith("data_parallel")}
    read = read_run_journal(_journal_with(tmp_path, {**old, "version": 1})).events[1]
    assert isinstance(read, RecoveredInAllocation)
    assert (read.data_parallel_before, read.data_parallel_after, read.shrank) == (None, None, False)


@pytest.mark.parametrize("size", [0, -2, "8", 2.5, True])
def test_a_recovery_with_a_data_parallel_size_not_understood_is_refused(tmp_path, size):
    event = RecoveredInAllocation(at=5.4, job_id="9", restart=3, blame=(BLAME,), nodes=("node1",))
    line = {"kind": "run-event", "version": 2, "event": "recovered-in-allocation", "at": 5.4, **event.fields(),
            "data_parallel_after": size}
    with pytest.raises(RecordError, match=r"journal.jsonl:2: field `data_parallel_after`"):
        read_run_journal(_journal_with(tmp_path, line))


def test_an_unknown_journal_event_is_refused_not_skipped(tmp_path):
    journal = _journal_with(tmp_path, {"kind": "run-event", "version": 1, "event": "forgiven", "at": 2.0,
                                       "node": "node3"})
    with pytest.raises(RecordError, match=r"journal.jsonl:2: field `event` is 'forgiven', which this clusterctl "
                                          r"does not know"):
        read_run_journal(journal)


def test_an_unknown_decision_is_refused(tmp_path):
    line = {"kind": "run-event", "version": 1, "event": "decided", "at": 2.0, "attempt": 1, "job_id": "7",
            "state": "FAILED", "exit_code": 1, "outcome": "node-failure", "message": "m", "blame": [],
            "checkpoint_step": None, "action": "requeue-elsewhere"}
    with pytest.raises(RecordError, match="field `action` is 'requeue-elsewhere'"):
        read_run_journal(_journal_with(tmp_path, line))


def test_a_journal_written_before_versions_is_still_read(tmp_path):
    journal = tmp_path / "journal.jsonl"
    journal.write_text(json.dumps({"event": "created", "at": 1.0, "name": "toy", "source": "t.toml"}) + "\n"
                       + json.dumps({"event": "submitted", "at": 2.0, "attempt": 1, "job_id": "7", "argv": [],
                                     "resume_from": None, "exclude": None}) + "\n")
    assert read_run_journal(journal).events == (Created(at=1.0, name="toy", source="t.toml"),
                                                Submitted(at=2.0, attempt=1, job_id="7"))


def test_a_torn_last_journal_line_is_skipped_and_reported(tmp_path):
    journal = tmp_path / "journal.jsonl"
    append_run_event(journal, Created(at=1.0, name="toy"))
    with journal.open("a") as out:
        out.write('{"kind": "run-event", "version": 1, "event": "subm')
    read = read_run_journal(journal)
    assert read.events == (Created(at=1.0, name="toy"),) and read.unreadable_lines == (2,)


def test_a_run_end_must_be_an_ending_kind():
    with pytest.raises(ValueError, match="does not end a run"):
        RunEnded(kind=EventKind.SUBMITTED, at=1.0)


# ---- rank map ----------------------------------------------------------------------------
SUMMARY = PlanSummary("tiles of 2 (dp) × 2 (pp)", 1, 4, 2)


@given(st.lists(st.sampled_from([f"node{i}" for i in range(9)]), min_size=1, max_size=6, unique=True),
       st.sampled_from([1, 4, 8]), st.integers(1024, 65535))
def test_a_rank_map_reads_back_as_written(slots, gpus_per_node, port):
    import tempfile
    record = JobRankMap("42", "node[0-8]", RankMap(tuple(slots), gpus_per_node), port, ("node9",), SUMMARY,
                        {"strategy": SUMMARY.strategy})
    with tempfile.TemporaryDirectory() as job_dir:
        write_rank_map(Path(job_dir), record)
        assert read_rank_map(Path(job_dir)) == record


def test_a_rank_map_keeps_the_slots_scripts_read(tmp_path):
    write_rank_map(tmp_path, JobRankMap("42", "node[1-3]", RankMap(("node3", "node1"), 8), 20042))
    document = json.loads((tmp_path / "rankmap.json").read_text())
    assert document["slots"] == ["node3", "node1"] and document["world_size"] == 16
    assert (document["kind"], document["version"]) == ("rank-map", 1)


def test_a_rank_map_from_a_newer_clusterctl_is_refused(tmp_path):
    write_rank_map(tmp_path, JobRankMap("42", "node[1-3]", RankMap(("node3", "node1"), 8), 20042))
    document = json.loads((tmp_path / "rankmap.json").read_text())
    (tmp_path / "rankmap.json").write_text(json.dumps({**document, "version": 2}))
    with pytest.raises(RecordError, match="rank-map record version 2 is newer than this clusterctl understands"):
        read_rank_map(tmp_path)


def test_a_rank_map_without_slots_is_refused(tmp_path):
    write_rank_map(tmp_path, JobRankMap("42", "node[1-3]", RankMap(("node3",), 8), 20042))
    document = json.loads((tmp_path / "rankmap.json").read_text())
    (tmp_path / "rankmap.json").write_text(json.dumps({**document, "slots": []}))
    with pytest.raises(RecordError, match="field `slots` must be a non-empty list of node names"):
        read_rank_map(tmp_path)


# ---- rank records ------------------------------------------------------------------------
RANK = RankRecord(rank=9, node="node1", hostname="node1.cluster", pid=4242, local_rank=1, started=1.5e9,
                  slurm_procid="9", slurm_localid="1", slurm_nodeid="1", cuda_visible_devices="0,1,2,3,4,5,6,7")


def test_a_rank_record_reads_back_as_written(tmp_path):
    assert read_rank_record(write_rank_record(tmp_path, RANK)) == RANK


def test_a_rank_record_from_a_newer_clusterctl_is_refused(tmp_path):
    path = write_rank_record(tmp_path, RANK)
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 7}))
    with pytest.raises(RecordError, match="rank-record record version 7 is newer than this clusterctl understands"):
        read_rank_record(path)


# ---- shared Slurm answers ----------------------------------------------------------------
def test_a_cached_slurm_answer_reads_back_as_written(tmp_path):
    answer = CachedAnswer("squeue", 1e9, 77, '{"jobs": []}')
    write_cached_answer(tmp_path, answer)
    assert read_cached_answer(tmp_path, "squeue") == answer and read_cached_answer(tmp_path, "sinfo") is None


def test_a_cached_slurm_answer_from_a_newer_clusterctl_is_refused(tmp_path):
    path = write_cached_answer(tmp_path, CachedAnswer("sinfo", 1e9, 77, "{}"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 3}))
    with pytest.raises(RecordError, match="slurm-cache record version 3 is newer"):
        read_cached_answer(tmp_path, "sinfo")


def test_a_damaged_cached_answer_is_a_clear_error(tmp_path):
    cache_path(tmp_path, "squeue").write_text('{"kind": "slurm-cache", "ver')
    with pytest.raises(RecordError, match=r"\.slurm-squeue\.json: not a readable JSON record"):
        read_cached_answer(tmp_path, "squeue")


# ---- the run's spec ----------------------------------------------------------------------
def test_a_runs_spec_reads_back_as_written(tmp_path):
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    assert create_run(tmp_path / "run", spec, "").spec() == spec


def test_a_runs_spec_from_a_newer_clusterctl_is_refused(tmp_path):
    run = create_run(tmp_path / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    path = run.path / "spec.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 2}))
    with pytest.raises(RecordError, match="run-spec record version 2 is newer than this clusterctl understands"):
        run.spec()


def test_a_runs_spec_written_before_versions_is_still_read(tmp_path):
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    run = create_run(tmp_path / "run", spec, "")
    (run.path / "spec.json").write_text(json.dumps(spec.to_dict()))
    assert run.spec() == spec


def test_a_runs_spec_with_a_field_this_version_lacks_is_a_clear_error(tmp_path):
    run = create_run(tmp_path / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    path = run.path / "spec.json"
    document = json.loads(path.read_text())
    document["job"]["gpu_kind"] = "h100"
    path.write_text(json.dumps(document))
    with pytest.raises(RecordError, match=r"spec.json: not a run spec this clusterctl can read \(TypeError"):
        run.spec()
