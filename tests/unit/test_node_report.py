"""A node's report to its job's agent: signed, bounded, and refused by kind when it is not ours."""

from __future__ import annotations

import json
import math
import os
import struct
import time
from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

from clusterctl.launcher.job.report_channel import ReportInbox, ReportSender
from clusterctl.records.checkpoint_holdings import (
    COPY_REFUSALS, CheckpointHoldings, CopyRefusals, HeldCopy, LastResume)
from clusterctl.records.node_report import (
    MAGIC, MAGIC_COLUMNS, MAX_DATAGRAM, MAX_GPU_NAME, MAX_RANKS, MAX_REPORTED_COPIES, PROCESS_STATES, RANK_COLUMNS,
    WIRE_PHASES, WIRE_PROCESS_STATES, NodeHealth, NodeMetrics, NodeReport, RankBeat, ReportRefused, SilentPeer, decode,
    encode, parse_key,
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
    held = draw(st.none() | st.builds(
        lambda copies, at, since, refused: CheckpointHoldings(node, tuple(copies), at, None,
                                                              CopyRefusals.of(since, refused)),
        st.lists(st.builds(HeldCopy, counts, st.just(node), st.sampled_from(["local", "buddy", "shared"]),
                           st.just(0), st.integers(1, 100), seconds, seconds), max_size=MAX_REPORTED_COPIES),
        seconds, seconds, st.dictionaries(st.sampled_from(COPY_REFUSALS), counts)))
    return NodeReport(draw(st.from_regex(r"[0-9]{1,8}", fullmatch=True)), "restart-1", node, draw(counts),
                      draw(seconds), ranks, health, held, draw(st.none() | node_metrics()),
                      tuple(draw(st.lists(st.builds(SilentPeer, st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True),
                                                    seconds), max_size=2))))


MEASURED = st.none() | st.floats(allow_nan=False) | st.just(math.nan)


@st.composite
def node_metrics(draw: st.DrawFn) -> NodeMetrics:
    loss, norm = draw(MEASURED), draw(MEASURED)
    norm = norm if norm is None or math.isnan(norm) else abs(norm)
    return NodeMetrics(draw(seconds), draw(st.integers(1, 64)), draw(counts), draw(counts), draw(seconds),
                       draw(st.floats(0, 1e30)), draw(st.floats(0, 1e36)), loss,
                       None if loss is None else draw(counts), None if loss is None else draw(counts), norm,
                       None if norm is None else draw(counts), None if norm is None else draw(counts),
                       draw(st.text(st.characters(codec="utf-8", categories=["L", "N", "Zs", "P"]),
                                    max_size=MAX_GPU_NAME).filter(str.isprintable)))


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
    ({"ranks": {name: [0] * (MAX_RANKS + 1) for name in RANK_COLUMNS}}, "at most"),
    ({"ranks": [{}] * (MAX_RANKS + 1), "version": 4}, "at most"), ({"ranks": []}, "columns"),
    ({"health": {"verdict": "fine", "evidence": [], "state_at": 0}}, "verdict"),
])
def test_a_signed_but_malformed_report_is_refused_saying_what_is_wrong(change: dict[str, object], said: str) -> None:
    datagram = forged_body(change)
    with pytest.raises(ReportRefused) as caught:
        decode(datagram, KEY, "report")
    assert said in str(caught.value) or said == caught.value.kind


def as_version_4(body: dict[str, object]) -> dict[str, object]:
    """A version-5 report's JSON as a version-4 reporter sent it: one object per rank."""
    columns = body["ranks"]
    assert isinstance(columns, dict)
    entries = [dict(zip(RANK_COLUMNS, values)) for values in zip(*(columns[name] for name in RANK_COLUMNS))]
    return {**body, "version": 4, "ranks": entries}


RANK_FIELDS = ("rank", "step", "pid", "compute_steps", "at", "compute_s", "alive_at", "stopped_since", "phase",
               "process")
HOSTILE = st.one_of(st.just(-1), st.just(-0.5), st.just(True), st.just(False), st.just(None), st.just("7"),
                    st.just([1]), st.just({"a": 1}), st.just(1e400), st.floats(allow_nan=True).filter(lambda v: v != v),
                    st.text(max_size=5).filter(lambda t: t not in PHASES + ("running", "stopped", "gone", "unknown")))


@given(st.integers(min_value=0, max_value=7), st.sampled_from(RANK_FIELDS), HOSTILE, st.booleans())
def test_a_rank_entry_with_any_field_wrong_or_missing_is_refused_naming_the_rank_and_the_field(
        index: int, key: str, value: object, missing: bool) -> None:
    body = as_version_4(sample().to_json())
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


# ---- the node's checkpoint holdings ride along (multi-level checkpoints) -----------------------------

def holdings(node: str = "gpu00001", copies: int = MAX_REPORTED_COPIES, slots: int = 12_500) -> CheckpointHoldings:
    """A large job's node: its own copies, its buddy's, and the ones it flushed, with long step numbers."""
    tiers = ("local", "buddy", "shared")
    return CheckpointHoldings(node, tuple(
        HeldCopy(1_000_000 + 500 * (i // 3), node if tiers[i % 3] != "buddy" else "gpu12345", tiers[i % 3],
                 12_345 if tiers[i % 3] == "buddy" else 1234, slots, 1_795_305_600.123, 12.345)
        for i in range(copies)), 1_795_305_600.125)


def test_a_report_carries_the_nodes_holdings_and_eight_ranks_with_32_copies_fit_well_under_8_kib() -> None:
    report = replace(sample(), checkpoints=holdings())
    datagram = encode(report, KEY)
    assert decode(datagram, KEY, "test") == report
    # Measured: 8 ranks with 32 copies (times to the millisecond, as the reporter sends them) take about
    # 5.9 KB (parsing them adds ~10 µs to the ~45 µs of a report: a node's unchanged holdings are taken
    # from its last report); the figure named in node_report.MAX_DATAGRAM's note.
    assert 5_000 < len(datagram) < 6_000 < 8 << 10


@pytest.mark.parametrize("change, said", [
    ({"checkpoints": holdings(copies=MAX_REPORTED_COPIES + 1).to_json()}, "at most 32"),
    ({"checkpoints": holdings(node="gpu00002").to_json()}, "the holdings of gpu00002, not of the reporting node"),
    ({"checkpoints": {**holdings().to_json(), "version": 9}}, "newer"),
    ({"checkpoints": "none"}, "checkpoints"),
])
def test_holdings_that_are_not_the_nodes_own_or_too_many_are_refused_even_after_good_ones(change: dict[str, object], said: str) -> None:
    decode(encode(replace(sample(), checkpoints=holdings()), KEY), KEY, "report")  # the good ones, remembered
    with pytest.raises(ReportRefused, match=said):
        decode(forged_body(change), KEY, "report")


def test_a_nodes_new_holdings_replace_the_remembered_ones_and_are_checked_again() -> None:
    first = decode(encode(replace(sample(), checkpoints=holdings(copies=3)), KEY), KEY, "report")
    again = decode(encode(replace(sample(), checkpoints=holdings(copies=3)), KEY), KEY, "report")
    assert again.checkpoints is first.checkpoints  # unchanged: the same object, not parsed again
    newer = replace(holdings(copies=3), written_at=1_795_305_700.0)
    assert decode(encode(replace(sample(), checkpoints=newer), KEY), KEY, "report").checkpoints == newer
    body = replace(sample(), checkpoints=newer).to_json()
    body["checkpoints"]["copies"][0]["slot"] = 99_999  # same time and steps, a damaged entry: still refused
    with pytest.raises(RecordError, match="slot"):
        NodeReport.from_json(json.loads(json.dumps(body)), "report")


def test_a_nodes_resume_rides_in_its_holdings_and_a_new_one_is_not_mistaken_for_the_remembered_ones() -> None:
    before = decode(encode(replace(sample(), checkpoints=holdings(copies=3)), KEY), KEY, "report")
    resumed = replace(holdings(copies=3), last_resume=LastResume(1_000_000, "buddy", "gpu12345", "gpu00007", 41.5,
                                                                 1_795_305_650.0))
    after = decode(encode(replace(sample(), checkpoints=resumed), KEY), KEY, "report").checkpoints
    assert after is not before.checkpoints and after == resumed and after.last_resume is not None
    assert after.last_resume.seconds == 41.5 and after.last_resume.held_on == "gpu00007"


def test_what_a_nodes_copy_server_refused_rides_in_its_holdings_in_a_few_small_numbers() -> None:
    before = decode(encode(replace(sample(), checkpoints=holdings()), KEY), KEY, "report")
    every_reason = CopyRefusals(1_795_305_600.125, tuple((reason, 2**40) for reason in COPY_REFUSALS))
    refusing = replace(holdings(), copies_refused=every_reason)
    datagram = encode(replace(sample(), checkpoints=refusing), KEY)
    after = decode(datagram, KEY, "report").checkpoints
    assert after is not before.checkpoints and after == refusing  # same copies, new counts: not the remembered ones
    # Measured: every reason counted in the trillions adds 197 bytes to the largest report (6,140 bytes); two
    # reasons of a few connections, 59.
    assert len(datagram) - len(encode(replace(sample(), checkpoints=holdings()), KEY)) < 200
    grown = replace(refusing, copies_refused=CopyRefusals(every_reason.since, (("wrong key", 2**41),)))
    assert decode(encode(replace(sample(), checkpoints=grown), KEY), KEY, "report").checkpoints == grown


def test_an_older_reporters_holdings_of_version_2_are_read_as_none_refused() -> None:
    body = replace(sample(), checkpoints=holdings(copies=3)).to_json()
    body["checkpoints"] = {k: v for k, v in body["checkpoints"].items() if k != "copies_refused"} | {"version": 2}
    assert NodeReport.from_json(json.loads(json.dumps(body)), "report").checkpoints == holdings(copies=3)


def test_a_report_of_the_previous_version_is_refused_naming_the_version() -> None:
    body = sample().to_json()
    body.pop("checkpoints")
    with pytest.raises(RecordError, match="version 1 is older"):
        NodeReport.from_json({**body, "version": 1}, "report")


# ---- the node's training metrics ride along: one handful of numbers per node, never one per rank --------

def training() -> NodeMetrics:
    """What a node of 8 ranks of a long run says: huge counters, a loss and a norm with their steps."""
    return NodeMetrics(1_795_305_600.123456, 8, 3_141_592_653, 1_234_567, 1_795_305_599.987654, 123_456_789_012_345.0,
                       4.567890123456789e24, 2.345678901234, 1_234_567, 0, 0.87654321, 1_234_567, 0,
                       "NVIDIA H100 80GB HBM3")


def test_a_report_carries_its_nodes_training_metrics_in_a_few_hundred_bytes() -> None:
    report = replace(sample(), metrics=training())
    datagram = encode(report, KEY)
    assert decode(datagram, KEY, "test") == report
    # Measured: the metrics add about 330 bytes to a report of 8 ranks (~1.5 KB), whatever the node's rank count.
    assert 250 < len(datagram) - len(encode(sample(), KEY)) < 400


def test_a_report_of_the_previous_version_is_read_without_training_metrics() -> None:
    report = sample()
    body = as_version_4(report.to_json())
    del body["metrics"]
    assert NodeReport.from_json({**body, "version": 2}, "report") == report


@pytest.mark.parametrize("change, said", [
    ({"grad_norm": -1.0}, "a norm is not negative"), ({"loss": None}, "`loss_step` is set without"),
    ({"tokens": -5}, "`tokens`"), ({"flops": 1e300}, "more than 64 ranks can count"),
    ({"gpu": "x" * (MAX_GPU_NAME + 1)}, "`gpu` must be printable"), ({"gpu": "H100\x1b[2J"}, "`gpu` must be printable"),
    ({"loss": "NaN!"}, "`loss`"), ({"step": None}, "`step`"),
])
def test_training_metrics_that_are_not_exactly_understood_refuse_the_report(change: dict[str, object],
                                                                            said: str) -> None:
    with pytest.raises(ReportRefused, match=said):
        decode(forged_body({"metrics": {**training().to_json(), **change}}), KEY, "report")


METRICS_FIELDS = tuple(training().to_json())


@given(st.sampled_from(METRICS_FIELDS), HOSTILE | st.just(-math.inf) | st.just("inf") | st.just(10**40),
       st.booleans())
def test_metrics_with_any_field_wrong_or_missing_are_refused_naming_the_field(key: str, value: object,
                                                                              missing: bool) -> None:
    body = training().to_json()
    if missing:
        del body[key]
    else:
        body[key] = value
    try:
        told = NodeMetrics.from_json(json.loads(json.dumps(body)), "metrics")
    except RecordError as caught:
        assert key in str(caught) or "must be" in str(caught)
        return
    # Taken: then only because the value is one the field may hold (a loss of any sign, a finite time, a count).
    assert not missing and (key in ("loss", "grad_norm", "at", "step_at", "tokens", "flops", "gpu")
                            or type(value) is int and value >= 0)
    assert NodeMetrics.from_json(told.to_json(), "again") == told


# ---- version 4: the node's neighbours it no longer hears (launcher/pure/peer_watch.py) ----------------------

def test_a_report_of_version_3_is_read_with_no_silent_neighbours() -> None:
    report = replace(sample(), silent_peers=())
    body = as_version_4(report.to_json())
    del body["silent_peers"]
    assert NodeReport.from_json({**body, "version": 3}, "report") == report


@pytest.mark.parametrize(("peers", "said"), [
    ([{"node": "a", "silent_s": 3.0}] * 3, "3 silent peers: a node watches at most 2"),
    ([{"node": "-rf", "silent_s": 3.0}], "silent peer `node`"),
    ([{"node": "a"}], "each silent peer is exactly"),
    ([{"node": "a", "silent_s": -1.0}], "silent_s"),
])
def test_silent_neighbours_not_exactly_understood_refuse_the_report(peers: list[object], said: str) -> None:
    with pytest.raises(RecordError, match=said):
        NodeReport.from_json({**sample().to_json(), "silent_peers": peers}, "report")


def signed(body: dict[str, object]) -> bytes:
    import hashlib
    import hmac
    raw = json.dumps(body, separators=(",", ":")).encode()
    return MAGIC + hmac.digest(KEY, raw, hashlib.sha256) + raw


@given(reports())
def test_a_version_4_report_is_still_read_as_the_same_report(report: NodeReport) -> None:
    body = as_version_4(report.to_json())
    assert decode(signed(body), KEY, "test") == report


@given(reports())
def test_a_report_sends_its_ranks_as_columns_and_the_agent_reads_them_without_a_rank_object(
        report: NodeReport) -> None:
    body = report.to_json()
    assert body["version"] == 5 and set(body["ranks"]) == set(RANK_COLUMNS)
    got = decode(encode(report, KEY), KEY, "test")
    columns = got.columns
    assert columns.process == tuple(b.process for b in report.ranks)
    assert columns.step == tuple(b.progress.step for b in report.ranks)
    assert columns.progress() == tuple(b.progress for b in report.ranks)
    assert tuple(got.ranks) == tuple(report.ranks) and len(got.ranks) == len(report.ranks)


@given(reports(), st.data())
def test_a_tampered_or_truncated_datagram_is_refused_before_it_is_read(report: NodeReport, data: st.DataObject) -> None:
    datagram = encode(report, KEY)
    cut = data.draw(st.integers(0, len(datagram) - 1))
    with pytest.raises(ReportRefused) as caught:
        decode(datagram[:cut], KEY, "report")
    assert caught.value.kind in ("foreign", "unsigned")
    at = data.draw(st.integers(0, len(datagram) - 1))
    flipped = datagram[:at] + bytes([datagram[at] ^ data.draw(st.integers(1, 255))]) + datagram[at + 1:]
    with pytest.raises(ReportRefused) as caught:
        decode(flipped, KEY, "report")
    assert caught.value.kind in ("foreign", "unsigned")


def test_a_report_of_a_version_this_agent_does_not_know_is_refused_saying_so() -> None:
    with pytest.raises(ReportRefused) as caught:
        decode(signed({**sample().to_json(), "version": 6}), KEY, "report from 10.0.0.9:4000")
    assert "version 6 is newer than this clusterctl understands" in str(caught.value)
    assert caught.value.kind == "malformed"


@given(st.integers(min_value=0, max_value=7), st.sampled_from(RANK_FIELDS), HOSTILE, st.booleans())
def test_a_rank_column_with_any_value_wrong_or_missing_is_refused_naming_the_rank_and_the_field(
        index: int, key: str, value: object, missing: bool) -> None:
    body = sample().to_json()
    columns = {name: list(values) for name, values in body["ranks"].items()}
    if missing:
        del columns[key][index]
    else:
        columns[key][index] = value
    if not missing and key in ("at", "compute_s", "alive_at", "stopped_since") and type(value) is float \
            and value == value and 0 <= value < float("inf"):
        return  # a finite, non-negative float is a valid number of seconds
    with pytest.raises(ReportRefused) as caught:
        decode(signed({**body, "ranks": columns}), KEY, "report")
    said = str(caught.value)
    assert caught.value.kind in ("malformed", "unreadable")
    assert caught.value.kind == "unreadable" or key in said and (missing or f"ranks[{index}]" in said)


def test_ranks_with_a_column_missing_or_unknown_are_refused_naming_it() -> None:
    body = sample().to_json()
    columns = dict(body["ranks"])
    del columns["pid"]
    with pytest.raises(ReportRefused, match="missing pid"):
        decode(signed({**body, "ranks": columns}), KEY, "report")
    with pytest.raises(ReportRefused, match="unknown color"):
        decode(signed({**body, "ranks": {**body["ranks"], "color": [1] * 8}}), KEY, "report")


# ---- version 5's compact framing: the ranks' columns packed after the JSON head ----------------------------

def packed(head: dict[str, object], block: bytes, magic: bytes = MAGIC_COLUMNS) -> bytes:
    import hashlib
    import hmac
    raw = json.dumps(head, separators=(",", ":")).encode()
    body = struct.pack(">H", len(raw)) + raw + block
    return magic + hmac.digest(KEY, magic + body, hashlib.sha256) + body


def sample_block(report: NodeReport) -> tuple[dict[str, object], list[object]]:
    """The head and the block's values (in their packed order) of `report`'s datagram."""
    datagram = encode(report, KEY)
    body = datagram[len(MAGIC_COLUMNS) + 32:]
    length = struct.unpack_from(">H", body)[0]
    head = json.loads(body[2:2 + length])
    n = head["ranks"]
    return head, list(struct.unpack(f"<{4 * n}Q{4 * n}d{2 * n}B", body[2 + length:]))


def test_the_wire_numbers_of_phases_and_process_states_are_every_one_the_records_know() -> None:
    # Appending is safe; renumbering would make old reporters say the wrong phase: the wire lists are pinned.
    assert set(WIRE_PHASES) == set(PHASES) and set(WIRE_PROCESS_STATES) == set(PROCESS_STATES)


def test_a_report_is_sent_framed_compactly_and_is_smaller_than_its_json() -> None:
    report = sample()
    datagram = encode(report, KEY)
    assert datagram.startswith(MAGIC_COLUMNS)
    assert len(datagram) < len(json.dumps(report.to_json()))
    assert decode(datagram, KEY, "test") == report


def test_an_all_json_report_of_version_5_is_read_too() -> None:
    report = sample()
    assert decode(signed(report.to_json()), KEY, "test") == report


@given(st.integers(0, 7), st.sampled_from(["at", "compute_s", "alive_at", "stopped_since", "phase", "process"]),
       st.sampled_from([math.nan, math.inf, -1.0, -math.inf, 4, 200]))
def test_a_packed_rank_with_a_value_out_of_its_range_is_refused_naming_the_rank_and_the_field(
        index: int, name: str, value: float) -> None:
    head, values = sample_block(sample())
    n = 8
    if name in ("phase", "process"):
        if isinstance(value, float):
            return
        values[8 * n + (0 if name == "phase" else n) + index] = value
    else:
        if not isinstance(value, float):
            return
        values[4 * n + ("at", "compute_s", "alive_at", "stopped_since").index(name) * n + index] = value
    block = struct.pack(f"<{4 * n}Q{4 * n}d{2 * n}B", *values)
    with pytest.raises(ReportRefused) as caught:
        decode(packed(head, block), KEY, "report")
    assert caught.value.kind == "malformed" and f"ranks[{index}]" in str(caught.value) and name in str(caught.value)


@pytest.mark.parametrize("change, said", [
    ({"ranks": 9}, "bytes of rank columns for 9 ranks"), ({"ranks": MAX_RANKS + 1}, "at most"),
    ({"ranks": "8"}, "counts its ranks"), ({"version": 4}, "version 5 or later, not 4"),
    ({"version": 6}, "newer than this clusterctl understands"), ({"node": "-rf"}, "node"),
])
def test_a_signed_compact_report_whose_head_and_columns_disagree_is_refused_saying_what_is_wrong(
        change: dict[str, object], said: str) -> None:
    head, values = sample_block(sample())
    block = struct.pack("<32Q32d16B", *values)
    with pytest.raises(ReportRefused, match=said) as caught:
        decode(packed({**head, **change}, block), KEY, "report")
    assert caught.value.kind == "malformed"


def test_a_signed_report_in_a_framing_this_clusterctl_does_not_know_is_refused_saying_to_upgrade() -> None:
    head, values = sample_block(sample())
    with pytest.raises(ReportRefused, match="does not understand.*upgrade clusterctl") as caught:
        decode(packed(head, struct.pack("<32Q32d16B", *values), magic=b"CCN3"), KEY, "report")
    assert caught.value.kind == "malformed"
    unsigned = packed(head, b"", magic=b"CCN3")[:-1]
    with pytest.raises(ReportRefused) as caught:
        decode(unsigned, KEY, "report")
    assert caught.value.kind == "unsigned"


def test_a_value_that_does_not_pack_is_an_error_for_the_sender_not_a_bad_datagram() -> None:
    report = sample()
    beats = tuple(RankBeat(replace(b.progress, pid=2**64)) for b in report.ranks)
    with pytest.raises(ValueError, match="does not fit"):
        encode(replace(report, ranks=beats), KEY)
