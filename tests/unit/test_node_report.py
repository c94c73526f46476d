"""A node's report to its job's agent: signed, bounded, and refused by kind when it is not ours."""

from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import given, strategies as st

from clusterctl.launcher.job.report_channel import ReportInbox, ReportSender
from clusterctl.records.node_report import (
    MAGIC, MAX_DATAGRAM, MAX_RANKS, NodeHealth, NodeReport, RankBeat, ReportRefused, decode, encode, parse_key,
)
from clusterctl.records.rank_progress import PHASES, RankProgress
from clusterctl.records.versioned import RecordError

KEY = bytes(range(32))
seconds = st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=0, max_value=2**31)


@st.composite
def reports(draw: st.DrawFn) -> NodeReport:
    node = draw(st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True))
    ranks = tuple(RankBeat(RankProgress(rank, node, draw(counts), draw(st.sampled_from(PHASES)), draw(seconds),
                                        draw(counts), draw(seconds), draw(counts), draw(seconds)),
                           draw(st.sampled_from(["running", "stopped", "gone", "unknown"])), draw(seconds))
                  for rank in draw(st.lists(counts, max_size=8, unique=True)))
    health = NodeHealth(draw(st.sampled_from(["ok", "drain", "unknown"])),
                        tuple(draw(st.lists(st.text(max_size=100), max_size=4))), draw(seconds))
    return NodeReport(draw(st.from_regex(r"[0-9]{1,8}", fullmatch=True)), "restart-1", node, draw(counts),
                      draw(seconds), ranks, health)


@given(reports())
def test_a_report_decodes_to_what_was_sent(report: NodeReport) -> None:
    assert decode(encode(report, KEY), KEY, "test") == report


def sample(ranks: int = 8) -> NodeReport:
    now = time.time()
    return NodeReport("42", "0", "gpu00001", 1, now,
                      tuple(RankBeat(RankProgress(r, "gpu00001", 10, "step", now, 100 + r, 1.5, 3, now))
                            for r in range(ranks)), NodeHealth("ok", (), now))


def forged_body(change: dict[str, object]) -> bytes:
    import hashlib
    import hmac
    body = json.dumps({**sample().to_json(), **change}).encode()
    return MAGIC + hmac.digest(KEY, body, hashlib.sha256) + body


@pytest.mark.parametrize("datagram, kind", [
    (encode(sample(), os.urandom(32)), "unsigned"),
    (b"GET / HTTP/1.1\r\n\r\n", "foreign"),
    (MAGIC + b"\0" * (MAX_DATAGRAM), "too large"),
    (encode(sample(), KEY)[:-5], "unsigned"),
])
def test_a_datagram_from_outside_the_job_is_refused_before_its_body_is_read(datagram: bytes, kind: str) -> None:
    with pytest.raises(ReportRefused) as caught:
        decode(datagram, KEY, "report from 10.0.0.9:4000")
    assert caught.value.kind == kind and "10.0.0.9:4000" in str(caught.value)


@pytest.mark.parametrize("change, said", [
    ({"sent_at": float("nan")}, "unreadable"), ({"version": 9}, "version"), ({"node": "-rf"}, "node"),
    ({"ranks": [{}] * (MAX_RANKS + 1)}, "at most"), ({"health": {"verdict": "fine", "evidence": [], "state_at": 0}},
                                                      "verdict"),
])
def test_a_signed_but_malformed_report_is_refused_saying_what_is_wrong(change: dict[str, object], said: str) -> None:
    datagram = forged_body(change)
    with pytest.raises(ReportRefused) as caught:
        decode(datagram, KEY, "report")
    assert said in str(caught.value) or said == caught.value.kind


RANK_FIELDS = ("rank", "step", "pid", "compute_steps", "at", "compute_s", "alive_at", "stopped_since", "phase",
               "process")
HOSTILE = st.one_of(st.just(-1), st.just(-0.5), st.just(True), st.just(False), st.just(None), st.just("7"),
                    st.just([1]), st.just({"a": 1}), st.just(1e400), st.floats(allow_nan=True).filter(lambda v: v != v),
                    st.text(max_size=5).filter(lambda t: t not in PHASES + ("running", "stopped", "gone", "unknown")))


@given(st.integers(min_value=0, max_value=7), st.sampled_from(RANK_FIELDS), HOSTILE, st.booleans())
def test_a_rank_entry_with_any_field_wrong_or_missing_is_refused_naming_the_rank_and_the_field(
        index: int, key: str, value: object, missing: bool) -> None:
    body = sample().to_json()
    entry = dict(body["ranks"][index])
    if missing:
        del entry[key]
    else:
        entry[key] = value
    if not missing and key in ("at", "compute_s", "alive_at", "stopped_since") and type(value) is float \
            and value == value and 0 <= value < float("inf"):
        return  # a finite, non-negative float is a valid number of seconds
    body["ranks"][index] = entry
    with pytest.raises(RecordError) as caught:
        NodeReport.from_json(json.loads(json.dumps(body)), "report")
    assert f"ranks[{index}]" in str(caught.value) and (key in str(caught.value) or "must be" in str(caught.value))


def test_a_reporter_reaches_the_inbox_and_a_stranger_is_counted_not_taken() -> None:
    inbox = ReportInbox(KEY, "127.0.0.1")
    try:
        sender, stranger = ReportSender(KEY, ("127.0.0.1", inbox.port)), ReportSender(os.urandom(32),
                                                                                   ("127.0.0.1", inbox.port))
        assert sender.send(sample()) and stranger.send(sample())
        deadline = time.monotonic() + 5
        got: list[NodeReport] = []
        while time.monotonic() < deadline and (not got or not inbox.refused):
            got += inbox.drain()
            time.sleep(0.01)
        assert [r.node for r in got] == ["gpu00001"] and inbox.refused == {"unsigned": 1}
    finally:
        inbox.close()


def test_a_sender_without_an_agent_returns_at_once_and_says_why() -> None:
    sender = ReportSender(KEY, ("no-such-host.invalid", 9))
    assert not sender.send(sample()) and sender.last_error


def test_a_key_must_be_32_bytes_of_hex() -> None:
    assert parse_key(KEY.hex()) == KEY
    for text in ("zz", "ab" * 16):
        with pytest.raises(RecordError):
            parse_key(text)
