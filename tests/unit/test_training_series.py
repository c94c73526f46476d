"""A job's training series (`<job dir>/training-series.jsonl`): one point a line as the agent appends them,
read back whole or torn, and thinned into the curves `report --html` draws."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from clusterctl.launcher.pure.training_curves import NOT_FINITE_KEPT, thin_series, training_line
from clusterctl.records.agent_summary import AgentSummary, TrainingMetrics
from clusterctl.records.training_series import (
    TrainingPoint, TrainingSeriesReader, append_training_point, point_of, read_series_ends, series_path,
)
from clusterctl.records.versioned import RecordError

rates = st.none() | st.floats(min_value=0, max_value=1e18)
measured = st.none() | st.floats(allow_nan=False, min_value=-1e30, max_value=1e30) | st.sampled_from(
    [math.nan, math.inf, -math.inf])
points = st.builds(
    TrainingPoint, at=st.floats(min_value=0, max_value=4e9), job_id=st.from_regex(r"[0-9]{1,8}", fullmatch=True),
    launch=st.sampled_from(["0", "restart-1", "restart-12"]), step=st.integers(0, 10**12), steps_per_s=rates,
    tokens_per_s=rates, flops_per_s=rates, mfu=rates, loss=measured, grad_norm=measured,
    slowest_node=st.none() | st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True), slowest_step_s=rates,
    reference_step_s=rates)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def point(step: int, **figures: object) -> TrainingPoint:
    return TrainingPoint(at=1000.0 + step, job_id="7", launch="0", step=step, **figures)  # type: ignore[arg-type]


@SETTINGS
@given(st.lists(points, max_size=8))
def test_points_read_back_as_appended(tmp_path_factory: pytest.TempPathFactory, series: list[TrainingPoint]) -> None:
    job_dir = tmp_path_factory.mktemp("job")
    for each in series:
        append_training_point(job_dir, each)

    reader = TrainingSeriesReader(job_dir)

    assert list(reader) == series and reader.lines == len(series) and reader.last_line_problem == ""


def test_a_figure_not_reported_is_absent_not_zero_and_a_nan_loss_is_written_nan(tmp_path: Path) -> None:
    append_training_point(tmp_path, point(12, tokens_per_s=4096.0, loss=math.nan))

    line = json.loads(series_path(tmp_path).read_text())

    assert line == {"kind": "training-point", "version": 1, "at": 1012.0, "job_id": "7", "launch": "0", "step": 12,
                    "tokens_per_s": 4096.0, "loss": "nan"}
    [read] = TrainingSeriesReader(tmp_path)
    assert math.isnan(read.loss) and read.mfu is None and read.steps_per_s is None


def test_the_agent_appends_the_summarys_figures_with_the_slowest_node() -> None:
    training = TrainingMetrics(30.0, 4, 4, 32, steps_per_s=1.9, tokens_per_s=1_638_400.0, flops_per_s=4.0e15,
                               mfu=0.126, loss=math.nan, loss_step=1199, grad_norm=0.8)
    summary = AgentSummary("7", "restart-1", 1000.0, 2.0, "watching", 4, 4, min_step=1199, max_step=1200,
                           training=training)

    made = point_of(summary, ("node3", 0.61), 0.5)

    assert made == TrainingPoint(1000.0, "7", "restart-1", 1200, 1.9, 1_638_400.0, 4.0e15, 0.126, made.loss, 0.8,
                                 "node3", 0.61, 0.5)
    assert made is not None and math.isnan(made.loss)
    assert point_of(AgentSummary("7", "0", 1000.0, 2.0, "watching", 4, 4, max_step=5)) is None  # no figures
    assert point_of(AgentSummary("7", "0", 1000.0, 2.0, "watching", 4, 4, training=training)) is None  # no step


def test_a_torn_last_line_is_left_out_and_said_and_the_next_append_cuts_it_off(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        append_training_point(tmp_path, point(step, loss=3.0 / step))
    with open(series_path(tmp_path), "ab") as out:
        out.write(b'{"at": 1004.0, "job_id": "7", "kind": "training-po')  # a crash mid-append

    reader = TrainingSeriesReader(tmp_path)

    assert [p.step for p in reader] == [1, 2, 3] and reader.lines == 4
    assert reader.last_line_problem == "incomplete (no end of line: a crash mid-append, or the line being written)"
    append_training_point(tmp_path, point(5, loss=0.5))
    again = TrainingSeriesReader(tmp_path)
    assert [p.step for p in again] == [1, 2, 3, 5] and again.last_line_problem == ""


@pytest.mark.parametrize("damage, said", [
    (b"not json\n", "line 2: not a JSON line (JSONDecodeError); lines follow it, so it is not a crash mid-append"),
    (b'{"kind": "training-point", "version": 1, "at": -5, "job_id": "7", "launch": "0", "step": 2}\n',
     "line 2: field `at` is -5: a time in epoch seconds; lines follow it"),
    (b'{"kind": "training-point", "version": 1, "at": 5, "job_id": "7", "launch": "0", "step": 2, "mfu": "high"}\n',
     "line 2: field `mfu` is 'high': a finite number, not negative; lines follow it"),
])
def test_a_damaged_line_before_the_last_is_an_error_naming_the_file_and_line(tmp_path: Path, damage: bytes,
                                                                              said: str) -> None:
    append_training_point(tmp_path, point(1))
    with open(series_path(tmp_path), "ab") as out:
        out.write(damage)
    append_training_point(tmp_path, point(3))

    with pytest.raises(RecordError) as caught:
        list(TrainingSeriesReader(tmp_path))

    assert str(caught.value).startswith(f"{series_path(tmp_path)}, {said}")
    assert "move the file away to draw the run without it" in str(caught.value)


def test_a_damaged_last_line_is_left_out_and_said(tmp_path: Path) -> None:
    append_training_point(tmp_path, point(1))
    with open(series_path(tmp_path), "ab") as out:
        out.write(b'{"kind": "training-point", "version": 1, "at": 5, "job_id": "x", "launch": "0", "step": 2}\n')

    reader = TrainingSeriesReader(tmp_path)

    assert [p.step for p in reader] == [1]
    assert reader.last_line_problem == "field `job_id`: 'x' is not a Slurm job id (ASCII digits only)"


def test_a_point_of_a_newer_version_is_an_error_wherever_it_is(tmp_path: Path) -> None:
    append_training_point(tmp_path, point(1))
    with open(series_path(tmp_path), "ab") as out:
        out.write(json.dumps({**point(2).to_json(), "version": 2}).encode() + b"\n")

    with pytest.raises(RecordError) as caught:
        list(TrainingSeriesReader(tmp_path))

    assert str(caught.value) == (f"{series_path(tmp_path)}, line 2: training-point record version 2 is newer than "
                                 "this clusterctl understands (1); upgrade clusterctl on this host")


def test_no_series_has_no_points_and_a_fifo_or_symlink_in_its_place_is_refused(tmp_path: Path) -> None:
    assert list(TrainingSeriesReader(tmp_path)) == [] and read_series_ends(tmp_path) is None
    os.mkfifo(series_path(tmp_path))
    with pytest.raises(RecordError, match="a FIFO, where clusterctl expects a regular file"):
        list(TrainingSeriesReader(tmp_path))
    series_path(tmp_path).unlink()
    (tmp_path / "elsewhere").write_text("")
    series_path(tmp_path).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RecordError, match="a symlink, not a regular file; refusing to follow it"):
        read_series_ends(tmp_path)


def test_the_ends_of_a_long_series_are_its_first_and_newest_whole_points(tmp_path: Path) -> None:
    with open(series_path(tmp_path), "w") as out:
        out.writelines(json.dumps(point(step, loss=10.0 - step / 1000).to_json()) + "\n" for step in range(5000))
        out.write('{"at": 6000.0, "job_')  # being written

    first, last = read_series_ends(tmp_path) or (None, None)

    assert (first, last) == (point(0, loss=10.0), point(4999, loss=10.0 - 4.999))
    assert training_line(first, last) == "training: loss 10 → 5.001 over steps 0–4999"


lines = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda data: json.dumps(data).encode(), st.dictionaries(
        st.sampled_from(["kind", "version", "at", "job_id", "launch", "step", "loss", "mfu", "slowest_node", "x"]),
        st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8), max_size=10)),
    points.map(lambda p: json.dumps(p.to_json()).encode()),
)


@SETTINGS
@given(st.lists(lines, max_size=6), st.booleans())
def test_the_series_reader_reads_any_file_or_refuses_it_in_one_clear_line(tmp_path_factory: pytest.TempPathFactory,
                                                                         written: list[bytes], ends: bool) -> None:
    job_dir = tmp_path_factory.mktemp("job")
    series_path(job_dir).write_bytes(b"\n".join(written) + (b"\n" if ends else b""))
    for read in (lambda: list(TrainingSeriesReader(job_dir)), lambda: read_series_ends(job_dir)):
        try:
            read()
        except RecordError as exc:
            assert str(exc).startswith(str(series_path(job_dir))) and "\n" not in str(exc)


# ---- thinning: a quarter of a million points to at most a thousand a curve ----------------------------

values = st.floats(min_value=-1e6, max_value=1e6) | st.sampled_from([math.nan, math.inf])


@SETTINGS
@given(st.lists(st.tuples(values, st.none() | st.floats(min_value=0, max_value=1e9)), max_size=3000),
       st.integers(4, 300))
def test_a_thinned_curve_is_bounded_in_time_order_and_keeps_its_extremes(series: list[tuple[float, float | None]],
                                                                        limit: int) -> None:
    written = [point(i, loss=loss, tokens_per_s=tokens) for i, (loss, tokens) in enumerate(series)]

    curves = thin_series(iter(written), limit)

    for curve, kept in ((curves.loss, [(p.at, p.loss) for p in written if p.loss is not None and math.isfinite(p.loss)]),
                        (curves.tokens_per_s, [(p.at, p.tokens_per_s) for p in written if p.tokens_per_s is not None])):
        assert len(curve) <= limit and list(curve) == sorted(set(curve))
        assert set(curve) <= set(kept)
        if kept:
            assert min(v for _, v in curve) == min(v for _, v in kept)
            assert max(v for _, v in curve) == max(v for _, v in kept)
    not_finite = [p for p in written if p.loss is not None and not math.isfinite(p.loss)]
    assert curves.not_finite_losses == len(not_finite)
    assert [step for _, step, _ in curves.not_finite_loss] == [p.step for p in not_finite][:NOT_FINITE_KEPT]
    assert curves.points == len(written) and (curves.first, curves.last) == (
        (written[0], written[-1]) if written else (None, None))


def test_a_spike_in_a_quarter_of_a_million_losses_survives_the_thinning() -> None:
    def series():
        for step in range(250_000):
            yield point(step, loss=50.0 if step == 123_457 else 2.0 + 8.0 / math.sqrt(1 + step / 10))

    curves = thin_series(series())

    assert len(curves.loss) <= 1000 and (1000.0 + 123_457, 50.0) in curves.loss
    assert curves.loss[0] == (1000.0, 10.0) and curves.points == 250_000
