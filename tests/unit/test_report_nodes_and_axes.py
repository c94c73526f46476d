"""`clusterctl report`: where each attempt ran (text, --json, the page), and the page's axes that a reader
can read: UTC clock times at round ticks, and 3 to 5 round values on each curve's axis."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner
from hypothesis import assume, given
from hypothesis import strategies as st

from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.login.report_drawing import clock_label, tick_labels, time_ticks, value_ticks
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.shared.runs import create_run
from clusterctl.records.rank_map import JobRankMap, RankMap, write_rank_map
from clusterctl.records.run_journal import Decided, DecisionAction, OutcomeKind, SlurmTimes, Submitted
from tests.conftest import REPO
from tests.unit.test_report_drawing import assert_self_contained, page_of, recorded_run


def _two_attempts(tmp_path: Path):
    run = create_run(tmp_path / "llm", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    for attempt, job, at in ((1, "4", 100.0), (2, "5", 300.0)):
        run.record(Submitted(at=at, attempt=attempt, job_id=job))
        run.record(Decided(at=at + 101.0, attempt=attempt, job_id=job, state="COMPLETED" if attempt == 2 else "FAILED",
                           exit_code=0, outcome=OutcomeKind.COMPLETED if attempt == 2 else OutcomeKind.NODE_FAILURE,
                           message="m", blame=(), checkpoint_step=None, checkpoint=None,
                           action=DecisionAction.DONE if attempt == 2 else DecisionAction.RESUBMIT,
                           times=SlurmTimes(at, at + 10.0, at + 100.0)))
    return run


def test_each_attempt_names_its_nodes_and_spares_in_the_table_the_json_and_the_page(tmp_path):
    run = _two_attempts(tmp_path)
    slots = tuple(f"gpu{n:03d}" for n in (10, 2, 3, 1, 11))
    write_rank_map(run.job_dir("4"), JobRankMap("4", "gpu[001-003,010-011,020]", RankMap(slots, 4), 20004, ("gpu020",)))
    # Job 5 wrote no rank map (it never started, say): `-`, null.
    page = tmp_path / "report.html"

    shown = CliRunner().invoke(cli, ["report", str(run.path), "--html", str(page)], env={"COLUMNS": "120"})
    as_json = json.loads(CliRunner().invoke(cli, ["report", str(run.path), "--json"]).stdout)

    assert shown.exit_code == 0, shown.output
    rows = [line.split() for line in shown.stdout.splitlines() if line.startswith(("attempt ", "1 ", "2 "))]
    assert rows[0][-2:] == ["nodes", "spares"]
    assert rows[1][-2:] == ["gpu[001-003,010-011]", "gpu020"] and rows[2][-2:] == ["-", "-"]
    assert [a["nodes"] for a in as_json["attempts"]] == [{"used": "gpu[001-003,010-011]", "spares": "gpu020"}, None]
    assert {"attempt", "job_id", "state", "blame", "started_at"} <= set(as_json["attempts"][0])  # kept as they were
    drawn = page_of(page.read_text())
    assert "gpu[001-003,010-011]" in drawn.texts and "gpu020" in drawn.texts
    assert any("on gpu[001-003,010-011] (spares: gpu020)" in text for text in drawn.texts)  # the bar's tip


def test_node_names_from_a_rank_map_are_text_on_the_page_and_one_line_in_the_terminal(tmp_path):
    run = _two_attempts(tmp_path)
    hostile = '<img src=x onerror=alert(1)>\x1b[31m'
    write_rank_map(run.job_dir("4"), JobRankMap("4", "x", RankMap(("node1", hostile), 4), 20004))
    page = tmp_path / "report.html"

    shown = CliRunner().invoke(cli, ["report", str(run.path), "--html", str(page)], env={"COLUMNS": "200"})

    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.stdout and "<img src=x onerror=alert(1)>\\x1b[31m,node1" in shown.stdout
    drawn = page_of(page.read_text())
    assert_self_contained(drawn)
    assert any("<img src=x onerror=alert(1)>" in text for text in drawn.texts)  # shown, as text


def test_the_recorded_runs_attempts_say_where_they_ran(tmp_path):
    result = CliRunner().invoke(cli, ["report", str(recorded_run(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    assert [a["nodes"] for a in json.loads(result.stdout)["attempts"]] == [
        {"used": "node[1-3]", "spares": ""}, {"used": "node[1,3-4]", "spares": ""}]


@given(st.floats(-1e12, 1e12), st.floats(1e-6, 1e12))
def test_a_value_axis_has_3_to_5_round_ticks_around_what_it_shows(low, span):
    high = low + span
    assume(span > 1e-9 * max(1.0, abs(low)))  # a span a float can tell from its ends
    ticks = value_ticks(low, high)
    assert 3 <= len(ticks) <= 5
    assert ticks[0] <= low and ticks[-1] >= high
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    if len(steps) == 1:  # within a float's precision: the step is 1, 2 or 5 times a power of ten
        assert min(abs(mantissa - m) for m in (1, 2, 5, 10)) < 1e-6, (ticks, mantissa)
    assert len(set(tick_labels(ticks))) == len(ticks)  # no two ticks read alike


def test_the_value_axes_read_as_people_write_numbers():
    assert tick_labels(value_ticks(0.0, 321_000.0)) == ["0", "100k", "200k", "300k", "400k"]
    assert tick_labels(value_ticks(5.02, 7.66)) == ["5", "6", "7", "8"]
    assert tick_labels(value_ticks(0.0, 8.11)) == ["0", "5", "10"]
    assert len(set(tick_labels(value_ticks(5.0, 5.0000001)))) >= 3  # a curve that barely moves: more digits


def test_the_time_axis_is_utc_clock_times_at_round_steps_with_the_date_where_the_day_changes():
    start = datetime(2026, 11, 26, 4, 28, 40, 800_000, tzinfo=UTC).timestamp()
    step, ticks = time_ticks(start, start + 17.5)
    assert step == 2 and [clock_label(t, step, None) for t in ticks[:2]] == ["04:28:42", "04:28:44"]
    evening = datetime(2026, 11, 26, 21, 10, tzinfo=UTC).timestamp()
    step, ticks = time_ticks(evening, evening + 6 * 3600)
    labels = [clock_label(t, step, before) for t, before in zip(ticks, [None, *ticks])]
    assert step == 3600 and labels[:3] == ["22:00", "23:00", "Nov 27 00:00"] and labels[3] == "01:00"
    step, ticks = time_ticks(evening, evening + 30 * 86400)
    assert step == 7 * 86400 or step >= 86400 and len(ticks) <= 11
    assert clock_label(ticks[0], step, None).startswith(("Nov", "Dec"))
