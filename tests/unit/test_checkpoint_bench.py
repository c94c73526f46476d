"""The checkpoint benchmark's own logic: the shared-storage throttle on a fake clock, and the goodput
table built from a results file (no timing here: bench/checkpoint_bench.py measures)."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from checkpoint_goodput import costs_from_results, main, projections  # noqa: E402
from throttled_storage import Throttle, _ThrottledStream, copy_file  # noqa: E402

from clusterctl.launcher.pure.goodput_model import Job, project_sync, project_tiered  # noqa: E402


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_long_transfer_takes_bytes_over_rate_less_the_burst() -> None:
    clock = FakeClock()
    throttle = Throttle(1e9, burst_seconds=0.05, clock=clock, sleep=clock.sleep)
    for _ in range(125):  # 1 GB in 8 MB pieces, written in no time of their own
        throttle.take(8_000_000)
    assert clock.now - 100.0 == pytest.approx(1.0 - 0.05)
    assert throttle.slept == pytest.approx(0.95)


def test_time_spent_writing_earns_its_bytes_and_no_more_than_the_burst() -> None:
    clock = FakeClock()
    throttle = Throttle(100.0, burst_seconds=0.5, clock=clock, sleep=clock.sleep)
    throttle.take(50)  # the burst: at once
    assert clock.now == 100.0
    clock.now += 10.0  # idle for 10 s: the bucket refills to 0.5 s of bytes, not 10 s
    throttle.take(50)
    assert clock.now == 110.0
    throttle.take(100)  # one second of bytes with an empty bucket
    assert clock.now == pytest.approx(111.0)


def test_no_rate_is_no_limit() -> None:
    clock = FakeClock()
    throttle = Throttle(0, clock=clock, sleep=clock.sleep)
    throttle.take(10**12)
    assert clock.now == 100.0 and throttle.slept == 0.0


def test_the_stream_counts_what_it_writes_and_reads(tmp_path: Path) -> None:
    clock = FakeClock()
    throttle = Throttle(1000.0, burst_seconds=0.0, clock=clock, sleep=clock.sleep)
    raw = io.BytesIO()
    stream = _ThrottledStream(raw, throttle)
    stream.write(b"x" * 500)
    stream.write(memoryview(bytearray(250)))
    assert clock.now == pytest.approx(100.75) and raw.getvalue()[:500] == b"x" * 500
    stream.seek(0)  # not throttled: the file's own
    assert stream.read(100) == b"x" * 100
    assert stream.readinto(bytearray(400)) == 400
    assert clock.now == pytest.approx(101.25)
    source = tmp_path / "source"
    source.write_bytes(b"abc" * 1000)
    size, sha = copy_file(source, tmp_path / "copy", throttle)
    assert (tmp_path / "copy").read_bytes() == b"abc" * 1000 and size == 3000
    assert sha == hashlib.sha256(b"abc" * 1000).hexdigest()
    assert clock.now == pytest.approx(104.25)


def results(rate: float = 1e9) -> dict:
    def figure(value: float) -> dict:
        return {"median": value, "min": value, "max": value, "values": [value]}

    figures = {"sync_stall_s": 1.2, "sync_read_s": 1.1, "tiered_stall_s": 0.3, "replacement_read_s": 0.4,
               "survivor_read_s": 0.2, "replicate_s": 0.7, "flush_s": 1.5, "background_slowdown": 0.1}
    return {"state_bytes": 10**9, "runs": [{"shared_rate_bytes_per_second": rate, "new_path": "standin",
                                            "figures": {k: figure(v) for k, v in figures.items()}}]}


def test_the_table_projects_the_measured_medians_with_the_model(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    costs = costs_from_results(results(), None, 10, None)
    assert costs.sync.stall_seconds == 1.2 and costs.sync.read_seconds == 1.1
    assert costs.tiered.local_read_seconds == 0.4 and costs.tiered.shared_read_seconds == 1.1
    assert costs.tiered.flush_every == 10 and costs.tiered.background_slowdown == 0.1
    job = Job(nodes=1, detect_seconds=30.0, restart_seconds=120.0)
    rows = projections(costs, job)
    assert [nodes for nodes, _, _ in rows] == [1_250, 12_500]
    big = Job(nodes=12_500, detect_seconds=30.0, restart_seconds=120.0)
    assert rows[1][1] == project_sync(big, costs.sync) and rows[1][2] == project_tiered(big, costs.tiered)
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(results()))
    assert main(["--results", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"**{rows[1][1].goodput:.1%}**" in out and f"**{rows[1][2].goodput:.1%}**" in out


def test_scaling_to_another_state_size_scales_every_cost_but_the_slowdown() -> None:
    costs = costs_from_results(results(), None, 10, 10.0)
    assert costs.sync.stall_seconds == pytest.approx(12.0) and costs.tiered.flush_seconds == pytest.approx(15.0)
    assert costs.tiered.background_slowdown == 0.1


def test_a_rate_the_results_do_not_have_is_refused_naming_the_ones_they_do() -> None:
    with pytest.raises(SystemExit, match=r"no run at 0.5 GB/s in the results \(there are: 1\)"):
        costs_from_results(results(), 0.5, 10, None)
