"""The one field vocabulary every record reads with (clusterctl.records.versioned): each reader either
returns a value of its kind or refuses with a RecordError naming the field, and a field a later release
added reads as its default when an older writer left it out."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.records.run_journal import Submitted, read_run_journal
from clusterctl.records.versioned import (
    RecordError, count_field, dated_field, field, finite_field, node_field, nodes_field, number_field,
    number_or_none_field, seconds_field, strings_field, text_field, text_or_none_field, whole_field,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**400, 10**400) | st.integers(-2**70, 2**70) | st.floats()
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10)

READERS = {
    "number": number_field, "number or null": number_or_none_field, "whole": whole_field, "count": count_field,
    "seconds": seconds_field, "strings": strings_field, "node": node_field, "nodes": nodes_field,
    "finite count": lambda body, key, where: finite_field(body, key, where, what="a finite count"),
    "text": lambda body, key, where: text_field(body, key, where, limit=8),
    "printable text": lambda body, key, where: text_field(body, key, where, limit=8, printable=True),
    "text or null": lambda body, key, where: text_or_none_field(body, key, where, limit=8),
    "dated": lambda body, key, where: dated_field(body, key, 1.0, where),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(READERS)), json_values)
def test_every_reader_reads_its_kind_or_names_the_field(kind: str, value: object) -> None:
    try:
        got = READERS[kind]({"f": value}, "f", "x.json")
    except RecordError as exc:
        assert str(exc).startswith("x.json: ") and "`f`" in str(exc)
        return
    if kind in ("number", "seconds", "finite count"):
        assert isinstance(got, float)
    if kind in ("seconds", "finite count"):
        assert math.isfinite(got) and got >= 0
    if kind in ("whole", "count"):
        assert type(got) is int and got >= 0
    if kind in ("strings", "nodes"):
        assert isinstance(got, tuple) and all(isinstance(s, str) for s in got)


@pytest.mark.parametrize("kind", sorted(READERS))
def test_a_missing_field_is_named(kind: str) -> None:
    with pytest.raises(RecordError, match=r"^x.json: missing field `f`$"):
        READERS[kind]({}, "f", "x.json")


def test_an_absent_field_with_a_default_reads_as_the_default_and_a_present_one_is_still_checked() -> None:
    assert field({}, "f", str, "x.json", default="") == ""
    assert strings_field({}, "f", "x.json", default=()) == ()
    assert number_or_none_field({}, "f", "x.json", default=None) is None
    assert number_field({"f": 2}, "f", "x.json", default=0.0) == 2.0
    with pytest.raises(RecordError, match="field `f` has the wrong type"):
        field({"f": 3}, "f", str, "x.json", default="")
    with pytest.raises(RecordError, match="field `f`: "):
        nodes_field({"f": ["-rf"]}, "f", "x.json", default=())


def test_a_journal_line_from_before_a_field_existed_reads_as_its_default(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    journal.write_text(json.dumps({"kind": "run-event", "version": 1, "event": "submitted", "at": 1.0,
                                   "attempt": 1, "job_id": "42"}) + "\n")
    assert read_run_journal(journal).events == (Submitted(at=1.0, attempt=1, job_id="42"),)


def test_a_journal_line_with_a_number_too_large_for_a_float_is_refused_with_its_line(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    journal.write_text('{"kind": "run-event", "version": 1, "event": "waiting", "at": 1' + "0" * 400
                       + ', "message": "m"}\n')
    with pytest.raises(RecordError, match=r"journal.jsonl:1: field `at` is too large a number"):
        read_run_journal(journal)
