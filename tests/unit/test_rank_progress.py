"""A rank reports its progress (clusterctl.progress.beat) and the watch reads every rank's report back,
damaged files included, without ever breaking the training program or the reader."""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.progress import beat, transformer_flops
from clusterctl.records.rank_progress import (
    FUTURE_TOLERANCE, PHASES, PROGRESS_LIMIT, RankProgress, rank_progress_path, read_progress, read_rank_progress,
    write_rank_progress)
from clusterctl.launcher.pure.hang_watch import HangPolicy, judge
from clusterctl.records.versioned import RecordError

# Any loss or norm a program may produce; NaN as math.nan itself (a record compares equal to itself read back).
MEASURED = st.none() | st.floats(allow_nan=False) | st.just(math.nan)
REPORTS = st.builds(RankProgress, rank=st.integers(0, 100_000), node=st.from_regex(r"[a-z0-9][a-z0-9._-]{0,19}",
                                                                                    fullmatch=True),
                    step=st.integers(0, 10**12), phase=st.sampled_from(PHASES),
                    at=st.floats(0, 4e9, allow_nan=False), pid=st.integers(1, 2**22),
                    compute_s=st.floats(0, 1e9, allow_nan=False), compute_steps=st.integers(0, 10**12),
                    alive_at=st.floats(0, 4e9, allow_nan=False), tokens=st.floats(0, 1e18, allow_nan=False),
                    flops=st.floats(0, 1e30, allow_nan=False)).flatmap(
    lambda report: st.builds(lambda loss, norm, step: replace(
        report, loss=loss, loss_step=None if loss is None else step, grad_norm=norm if norm is None or norm != norm else abs(norm),
        grad_norm_step=None if norm is None else step), MEASURED, MEASURED, st.integers(0, 10**12)))


@given(REPORTS)
def test_a_report_reads_back_as_written(report):
    assert RankProgress.from_json(json.loads(json.dumps(report.to_json())), "here") == report
    with tempfile.TemporaryDirectory() as job_dir:
        write_rank_progress(Path(job_dir), report)
        assert read_rank_progress(rank_progress_path(Path(job_dir), report.rank)) == report
        assert read_progress(Path(job_dir)) == ((report,), ())


def test_damaged_reports_are_listed_as_problems_and_the_others_still_read(tmp_path):
    good = [RankProgress(rank, "node1", 41, "step", 1000.0 + rank, 100 + rank) for rank in (0, 1, 10)]
    for report in good:
        write_rank_progress(tmp_path, report)
    progress = tmp_path / "progress"
    (progress / "2.json").write_bytes(b'{"kind": "rank-progress", "version": 1, "rank": 2, "no')  # torn
    (progress / "3.json").write_text(json.dumps({**good[0].to_json(), "rank": 3, "version": 4}))
    (progress / "4.json").write_text(json.dumps({**good[0].to_json(), "rank": 4, "phase": "thinking"}))
    (progress / "5.json").write_text(json.dumps(good[1].to_json()))  # rank 1's report under rank 5's name

    records, problems = read_progress(tmp_path)

    assert records == tuple(good)
    assert problems == (
        f"{progress}/2.json: not a readable JSON record (JSONDecodeError)",
        f"{progress}/3.json: rank-progress record version 4 is newer than this clusterctl understands (3); "
        "upgrade clusterctl on this host",
        f"{progress}/4.json: phase 'thinking' is not one of startup, step, checkpoint-save, checkpoint-load",
        f"{progress}/5.json: holds rank 1, not the rank its name says",
    )


def test_a_job_no_rank_has_reported_in_yet_has_no_reports_and_no_problems(tmp_path):
    assert read_progress(tmp_path) == ((), ())


def test_a_damaged_report_read_alone_is_a_record_error(tmp_path):
    path = rank_progress_path(tmp_path, 7)
    path.parent.mkdir()
    path.write_text("[]")
    with pytest.raises(RecordError, match="not a rank-progress record"):
        read_rank_progress(path)


@pytest.fixture()
def rank_env(monkeypatch, tmp_path):
    """This process as rank 5 of a clusterctl job on node2, its job dir under tmp_path."""
    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(tmp_path / "job"))
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    monkeypatch.delenv("CLUSTERCTL_PROGRESS_INTERVAL", raising=False)
    return tmp_path / "job"


def test_a_training_loop_beating_every_step_writes_about_once_a_second_and_at_each_phase_change(rank_env):
    for step in range(100):  # a fast loop: far less than a second
        beat(step)
    (first,), _ = read_progress(rank_env)
    assert (first.rank, first.node, first.step, first.phase) == (5, "node2", 0, "step")

    beat(100, "checkpoint-save")
    assert read_progress(rank_env)[0][0].phase == "checkpoint-save"
    beat(101)
    (after,), problems = read_progress(rank_env)
    assert (after.step, after.phase, problems) == (101, "step", ())


def test_beat_writes_each_call_when_the_interval_allows_it(rank_env):
    beat(1, min_interval=0)
    beat(2, min_interval=0)
    assert read_progress(rank_env)[0][0].step == 2


def test_the_launcher_may_space_reports_out_through_the_environment(rank_env, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_PROGRESS_INTERVAL", "0")
    beat(1)
    beat(2)
    assert read_progress(rank_env)[0][0].step == 2


def test_beat_uses_slurm_procid_when_torchrun_set_no_rank(rank_env, monkeypatch):
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("SLURM_PROCID", "12")
    beat(3)
    assert [r.rank for r in read_progress(rank_env)[0]] == [12]


def test_beat_does_nothing_outside_a_clusterctl_job(monkeypatch, tmp_path):
    monkeypatch.delenv("CLUSTERCTL_JOB_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    beat(1, min_interval=0)
    assert list(tmp_path.iterdir()) == []


def test_beat_never_breaks_training_when_the_report_cannot_be_written(monkeypatch, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(blocker / "job"))  # under a file: nothing can be made there
    monkeypatch.setenv("RANK", "0")
    for step in range(3):
        beat(step, min_interval=0)
    message = capsys.readouterr().err
    assert message.count("clusterctl.progress: cannot write the progress report") == 1
    assert "training continues" in message


def test_a_report_from_a_program_with_an_older_clusterctl_reads_with_no_compute_time(tmp_path):
    old = {"kind": "rank-progress", "version": 1, "rank": 3, "node": "node2", "step": 17, "phase": "step",
           "at": 1000.5, "pid": 4242}
    path = rank_progress_path(tmp_path, 3)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    assert read_rank_progress(path) == RankProgress(3, "node2", 17, "step", 1000.5, 4242, 0.0, 0, 0.0)


def test_a_report_from_a_program_with_the_previous_clusterctl_reads_with_no_training_metrics(tmp_path):
    body = RankProgress(3, "node2", 17, "step", 1000.5, 4242, 2.5, 17, 1000.7).to_json()
    for key in ("tokens", "flops", "loss", "loss_step", "grad_norm", "grad_norm_step"):
        del body[key]
    path = rank_progress_path(tmp_path, 3)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**body, "version": 2}))
    record = read_rank_progress(path)
    assert record == RankProgress(3, "node2", 17, "step", 1000.5, 4242, 2.5, 17, 1000.7)
    assert not record.has_metrics


def test_tokens_and_flops_are_summed_across_skipped_reports_and_the_newest_loss_is_kept_with_its_step(
        tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "5")
    for step in range(1, 5):  # only the first is written now: the rest add up
        beat(step, tokens=4096, flops=transformer_flops(1e9, 4096), loss=3.0 - step / 10, grad_norm=1.5,
             min_interval=3600)
    beat(5, "checkpoint-save")  # a phase change writes
    report = read_rank_progress(rank_progress_path(tmp_path, 5))
    assert (report.tokens, report.flops) == (4 * 4096, 4 * 6e9 * 4096)
    assert (report.loss, report.loss_step, report.grad_norm, report.grad_norm_step) == (2.6, 4, 1.5, 4)


def test_a_loss_that_went_nan_is_reported_as_nan_and_read_back_so(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    beat(7, loss=float("nan"), grad_norm=float("inf"), min_interval=0)
    path = rank_progress_path(tmp_path, 0)
    assert '"loss": "nan"' in path.read_text() and '"grad_norm": "inf"' in path.read_text()  # JSON has no NaN
    report = read_rank_progress(path)
    assert math.isnan(report.loss) and report.loss_step == 7 and report.grad_norm == math.inf


def test_values_that_are_not_counts_never_break_training_and_are_said_once_each(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    for step in range(3):
        beat(step, tokens=-5, flops=float("inf"), loss="diverged", grad_norm=-1.0, min_interval=0)
        beat(step, tokens=float("nan"), flops=100, loss=2.0, grad_norm=0.5, min_interval=0)
    report = read_rank_progress(rank_progress_path(tmp_path, 1))
    assert (report.step, report.tokens, report.flops, report.loss, report.grad_norm) == (2, 0.0, 300.0, 2.0, 0.5)
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "clusterctl.progress: tokens=-5 is not a count (negative, NaN or infinite); not counted (said once per job); "
        "training continues",
        "clusterctl.progress: flops=inf is not a count (negative, NaN or infinite); not counted (said once per job); "
        "training continues",
        "clusterctl.progress: loss='diverged' is not a number (ValueError); not reported (said once per job); "
        "training continues",
        "clusterctl.progress: grad_norm=-1.0 is not a norm (negative); not reported (said once per job); "
        "training continues",
    ]


class DeviceScalar:
    """A scalar on a device, as a training loop holds its loss: detached for free, read (float()) at a cost."""

    reads = 0

    def __init__(self, value: float, graph: bool = True) -> None:
        self.value, self.graph = value, graph

    def detach(self) -> DeviceScalar:
        return DeviceScalar(self.value, graph=False)

    def __float__(self) -> float:
        DeviceScalar.reads += 1  # a device sync in real life
        return self.value


def test_a_loss_tensor_is_detached_at_each_beat_and_read_only_when_a_report_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "2")
    DeviceScalar.reads = 0
    for step in range(1, 101):
        beat(step, loss=DeviceScalar(10.0 / step), min_interval=3600)
    assert DeviceScalar.reads == 1  # the first beat's report: not one read per step
    beat(101, "checkpoint-save", loss=DeviceScalar(0.5))
    assert DeviceScalar.reads == 2
    report = read_rank_progress(rank_progress_path(tmp_path, 2))
    assert (report.loss, report.loss_step) == (0.5, 101)


def test_a_real_torch_loss_is_reported_without_keeping_its_graph(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    weight = torch.ones(4, requires_grad=True)
    loss = (weight * 0.25).sum()
    loss.backward()
    beat(1, loss=loss, grad_norm=weight.grad.norm(), min_interval=0)
    report = read_rank_progress(rank_progress_path(tmp_path, 3))
    assert (report.loss, report.grad_norm) == (1.0, 0.5)


def test_transformer_flops_are_six_per_parameter_per_token():
    assert transformer_flops(7e9, 4096) == 6 * 7e9 * 4096


def test_compute_seconds_are_summed_across_reports_the_rate_limit_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "5")
    for step in range(1, 5):
        beat(step, compute_seconds=0.25, min_interval=3600)  # only the first one is written now
    beat(5, "checkpoint-save", compute_seconds=9.0)  # a phase change writes; a save is not compute
    report = read_rank_progress(rank_progress_path(tmp_path, 5))
    assert (report.step, report.phase, report.compute_steps, report.compute_s) == (5, "checkpoint-save", 4, 1.0)


def test_a_rank_blocked_between_steps_keeps_saying_its_process_runs(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "6")
    beat(3, min_interval=0.05)  # ...and then the training loop blocks (a collective behind a dead peer)
    path = rank_progress_path(tmp_path, 6)
    first = read_rank_progress(path)
    deadline = time.monotonic() + 30
    while (report := read_rank_progress(path)).alive_at <= first.alive_at:
        assert time.monotonic() < deadline, "the liveness thread never rewrote the report"
        time.sleep(0.05)
    assert (report.step, report.at, report.phase) == (3, first.at, "step")  # no progress claimed


# ---- progress files others could plant: never a hang, never unbounded, never another node's blame ----
def test_a_fifo_a_symlink_or_a_directory_as_a_report_is_refused_at_once(tmp_path):
    good = RankProgress(0, "node1", 41, "step", 1000.0, 100)
    write_rank_progress(tmp_path, good)
    progress = tmp_path / "progress"
    os.mkfifo(progress / "1.json")  # nobody writes it: a blocking open or read would wait forever
    (progress / "2.json").symlink_to(progress / "0.json")
    (progress / "3.json").mkdir()
    started = time.monotonic()
    records, problems = read_progress(tmp_path)
    assert time.monotonic() - started < 5
    assert records == (good,)
    assert problems == (f"{progress}/1.json: a FIFO, where clusterctl expects a regular file; move it away",
                        f"{progress}/2.json: a symlink, not a regular file; refusing to follow it",
                        f"{progress}/3.json: a directory, where clusterctl expects a regular file; move it away")


def test_a_huge_report_is_refused_without_being_read(tmp_path):
    path = rank_progress_path(tmp_path, 0)
    path.parent.mkdir()
    with path.open("wb") as out:
        out.truncate(2 << 30)  # sparse: 2 GiB that would be read whole before
    tracemalloc.start()
    try:
        with pytest.raises(RecordError, match=f"more than the {PROGRESS_LIMIT}"):
            read_rank_progress(path)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


GOOD = RankProgress(0, "node1", 41, "step", 1000.0, 100, 2.5, 10, 1000.0, 4096.0, 1e15, 2.5, 40, 1.0, 40).to_json()


@pytest.mark.parametrize("key, value", [
    ("at", float("nan")), ("at", float("inf")), ("at", -1.0), ("alive_at", float("nan")),
    ("alive_at", float("-inf")), ("compute_s", float("inf")), ("step", -3), ("rank", -1), ("pid", -5),
])
def test_a_time_or_count_that_is_not_finite_and_positive_refuses_the_record(tmp_path, key, value):
    path = rank_progress_path(tmp_path, 0)
    path.parent.mkdir()
    # Python's json writes (and reads) NaN and Infinity: a rank's program can produce them.
    path.write_text(json.dumps({**GOOD, key: value, "rank": -1 if key == "rank" else 0}))
    if key == "rank":
        path = path.rename(path.with_name("-1.json"))
    with pytest.raises(RecordError, match=f"field `{key}` is"):
        read_rank_progress(path)


def test_a_node_name_that_is_not_one_refuses_the_record(tmp_path):
    path = rank_progress_path(tmp_path, 0)
    path.parent.mkdir()
    path.write_text(json.dumps({**GOOD, "node": "--nodelist=node9"}))
    with pytest.raises(RecordError, match="is not a node name"):
        read_rank_progress(path)


def test_a_report_from_the_future_is_refused_and_cannot_make_other_nodes_look_hung(tmp_path):
    now = 10_000.0
    # Every rank went silent 700 s ago (past the start-up timeout, 600 s) ...
    honest = [RankProgress(rank, f"node{rank + 1}", 50, "step", now - 700, 100 + rank) for rank in range(3)]
    for report in honest:
        write_rank_progress(tmp_path, report)
    # ... but rank 3 on node4 forges a report a day ahead: read, it would look like the one rank
    # still stepping, and nodes 1-3 the ones holding it up.
    write_rank_progress(tmp_path, RankProgress(3, "node4", 51, "step", now + 86_400, 103))
    records, problems = read_progress(tmp_path, now)
    assert records == tuple(honest)
    assert len(problems) == 1 and "3.json: dated 86400 s ahead of this host's clock" in problems[0]
    verdict = judge(records, HangPolicy(), now, started_at=now - 1000,
                    expected_ranks={rank: f"node{rank + 1}" for rank in range(4)})
    assert [s.node for s in verdict.suspects] == ["node4"]  # the rank without a report it can read
    # A clock a little ahead is not a forgery.
    write_rank_progress(tmp_path, RankProgress(3, "node4", 51, "step", now + FUTURE_TOLERANCE / 2, 103))
    assert len(read_progress(tmp_path, now)[0]) == 4


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=300),
    st.dictionaries(st.sampled_from(sorted(GOOD)), st.one_of(
        st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=12)), max_size=10).map(
        lambda changes: json.dumps({**GOOD, **changes}).encode()),
))
def test_any_progress_bytes_read_or_are_refused_clearly(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as job_dir:
        path = rank_progress_path(Path(job_dir), 0)
        path.parent.mkdir()
        path.write_bytes(data)
        try:
            record = read_rank_progress(path, now=2000.0)
        except RecordError as exc:
            assert str(exc).startswith(str(path))
            return
        for seconds in (record.at, record.alive_at, record.compute_s, record.tokens, record.flops):
            assert math.isfinite(seconds) and 0 <= seconds
        assert (record.loss is None) == (record.loss_step is None)
        assert min(record.rank, record.step, record.pid, record.compute_steps) >= 0
        assert max(record.at, record.alive_at) <= 2000.0 + FUTURE_TOLERANCE
        assert read_progress(Path(job_dir), 2000.0) == ((record,), ())
