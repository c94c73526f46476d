"""The agent reading compact reports (version 5: the ranks' columns packed) judges exactly as it did reading
one JSON object per rank: the same signals, stragglers and hang verdicts, heartbeat after heartbeat."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.launcher.pure.hang_watch import HangPolicy, HangWatch
from clusterctl.launcher.pure.node_signals import NodeSignals, SignalPolicy
from clusterctl.launcher.pure.straggler_watch import StragglerPolicy, StragglerWatch
from clusterctl.records.node_report import (
    MAGIC, RANK_COLUMNS, NodeHealth, NodeReport, RankBeat, decode, encode,
)
from clusterctl.records.rank_progress import RankProgress

KEY = bytes(range(32))
T0 = 1_800_000_000.0
RANKS = 4


def as_version_4(report: NodeReport) -> bytes:
    """`report` as a version-4 reporter signed it: all JSON, one object per rank (what the agent read before)."""
    body = report.to_json()
    columns = body["ranks"]
    body["ranks"] = [dict(zip(RANK_COLUMNS, values)) for values in zip(*(columns[name] for name in RANK_COLUMNS))]
    body["version"] = 4
    raw = json.dumps(body, separators=(",", ":")).encode()
    return MAGIC + hmac.digest(KEY, raw, hashlib.sha256) + raw


def heartbeat(index: int, beat: int, speed: float, frozen_at: int | None, drained_at: int | None) -> NodeReport:
    """Node `index`'s report at heartbeat `beat` (10 s each): its ranks compute `speed` s per step at one
    step a second; from `frozen_at` on its processes are stopped; from `drained_at` on healthd drains it."""
    node = f"gpu{index:03d}"
    now = T0 + 10.0 * beat
    frozen = frozen_at is not None and beat >= frozen_at
    stopped_since = T0 + 10.0 * frozen_at if frozen and frozen_at is not None else 0.0
    step = 10 * (min(beat, frozen_at) if frozen and frozen_at is not None else beat)
    beats = tuple(RankBeat(RankProgress(index * RANKS + r, node, step, "step", T0 + step, 1000 + r,
                                        round(speed * step, 6), step, stopped_since or now),
                           "stopped" if frozen else "running", stopped_since)
                  for r in range(RANKS))
    drained = drained_at is not None and beat >= drained_at
    return NodeReport("42", "0", node, beat + 1, now, beats,
                      NodeHealth("drain" if drained else "ok", ("healthd: drained",) if drained else (), now))


def watched(speeds: list[float], frozen: list[int | None], drained: list[int | None], compact: bool) -> list[tuple[Any, ...]]:
    """What the agent's watches say after each of 16 heartbeats of these nodes' reports, read from compact
    datagrams (`compact`) or from version-4 JSON ones."""
    nodes = [f"gpu{i:03d}" for i in range(len(speeds))]
    policy = SignalPolicy(heartbeat=10.0, silent_after=32.0, startup_grace=120.0, stopped_grace=1.0)
    expected = {r: node for i, node in enumerate(nodes) for r in range(i * RANKS, (i + 1) * RANKS)}
    signals = NodeSignals.start(policy, "42", "0", nodes, T0 - 1.0)
    hangs = HangWatch.start(HangPolicy(), T0 - 1.0, expected)
    stragglers = StragglerWatch.start(StragglerPolicy(), T0 - 1.0)
    seen: list[tuple[Any, ...]] = []
    for beat in range(16):
        now = T0 + 10.0 * beat + 0.5
        reports = [heartbeat(i, beat, speed, frozen[i], drained[i]) for i, speed in enumerate(speeds)]
        signals = signals.observe([decode(encode(r, KEY) if compact else as_version_4(r), KEY, "test")
                                   for r in reports], now)
        signals, records = signals.take_fresh()
        hangs, stragglers = hangs.observe(records), stragglers.observe(records)
        seen.append((signals.judge(now), hangs.verdict(now), stragglers.found, stragglers.nodes, signals.records()))
    return seen


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=3, max_size=6), st.data())
def test_compact_and_json_reports_give_the_watches_the_same_verdicts(speeds: list[float], data: st.DataObject) -> None:
    frozen = data.draw(st.lists(st.none() | st.integers(3, 12), min_size=len(speeds), max_size=len(speeds)))
    drained = data.draw(st.lists(st.none() | st.integers(3, 12), min_size=len(speeds), max_size=len(speeds)))
    assert watched(speeds, frozen, drained, compact=True) == watched(speeds, frozen, drained, compact=False)


def test_a_slow_node_a_frozen_node_and_a_drained_node_are_named_alike_from_either_format() -> None:
    speeds, frozen, drained = [1.0, 1.0, 1.0, 1.6, 1.0], [None, None, 9, None, None], [None, 5, None, None, None]
    new, old = watched(speeds, frozen, drained, compact=True), watched(speeds, frozen, drained, compact=False)
    assert new == old
    assert any(node.node == "gpu003" for _, _, found, _, _ in new for node in found)
    last = new[-1][0]
    assert last.frozen is not None and [s.node for s in last.frozen.suspects] == ["gpu002"]
    assert last.drained == ("gpu001",)
