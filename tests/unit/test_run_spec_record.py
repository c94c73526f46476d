"""spec.json, the run's effective spec (clusterctl.records.run_spec): written once when the run is made,
read back as the same spec; byte for byte what clusterctl wrote before it was a record; refused with a
clear line when it is another kind or from a newer clusterctl."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import RunError
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.shared.runs import RunDir, create_run
from clusterctl.records.run_spec import RunSpecRecord, read_run_spec, run_spec_path, write_run_spec
from clusterctl.records.versioned import RecordError
from tests.conftest import REPO

SPEC = REPO / "examples" / "toy_trainer.toml"


def test_a_new_runs_spec_json_is_the_header_and_the_spec_and_reads_back_as_the_same_spec(tmp_path: Path) -> None:
    spec = load_spec(SPEC)
    run = create_run(tmp_path / "run", spec, "")
    written = (tmp_path / "run" / "spec.json").read_text()
    # What clusterctl wrote before spec.json was a record of its own: the same bytes.
    assert written == json.dumps({"kind": "run-spec", "version": 1, **spec.to_dict()}, indent=2, sort_keys=True) + "\n"
    assert stat.S_IMODE((tmp_path / "run" / "spec.json").stat().st_mode) == 0o600
    assert run.spec() == spec
    assert read_run_spec(tmp_path / "run") == RunSpecRecord(json.loads(json.dumps(spec.to_dict())))


spec_fields = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in ("kind", "version")),
                              st.none() | st.booleans() | st.integers() | st.text(max_size=8)
                              | st.lists(st.integers(), max_size=3), max_size=6)


@settings(max_examples=50, deadline=None)
@given(spec_fields)
def test_the_record_round_trips_through_its_file(fields: dict) -> None:
    import tempfile
    with tempfile.TemporaryDirectory() as where:
        write_run_spec(Path(where), RunSpecRecord(fields))
        assert read_run_spec(Path(where)) == RunSpecRecord(fields)
        assert json.loads(run_spec_path(Path(where)).read_text()) == {"kind": "run-spec", "version": 1, **fields}


def test_a_spec_json_from_before_the_header_reads_as_version_1() -> None:
    assert RunSpecRecord.from_json({"job": {"name": "x"}}, "spec.json") == RunSpecRecord({"job": {"name": "x"}})


@pytest.mark.parametrize(("document", "message"), [
    ({"kind": "run-event", "version": 1}, "spec.json: not a run-spec record (kind 'run-event')"),
    ({"kind": "run-spec", "version": 2, "job": {}},
     "spec.json: run-spec record version 2 is newer than this clusterctl understands (1); upgrade clusterctl"),
    ({"kind": "run-spec"}, "spec.json: run-spec record without a version number"),
    ([1, 2], "spec.json: not a run-spec record (expected a JSON object)"),
])
def test_another_kind_or_a_newer_version_is_refused_with_a_clear_line(document: object, message: str) -> None:
    with pytest.raises(RecordError) as refused:
        RunSpecRecord.from_json(document, "spec.json")
    assert str(refused.value).startswith(message)


def test_a_run_whose_spec_json_is_newer_says_so_and_one_without_is_not_a_run(tmp_path: Path) -> None:
    run = create_run(tmp_path / "run", load_spec(SPEC), "")
    path = tmp_path / "run" / "spec.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 9}))
    with pytest.raises(RecordError, match=r"spec.json: run-spec record version 9 is newer"):
        run.spec()
    path.unlink()
    with pytest.raises(RunError, match="is not a clusterctl run \\(no spec.json\\)"):
        RunDir(tmp_path / "run").spec()
