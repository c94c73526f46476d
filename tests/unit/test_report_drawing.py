"""`clusterctl report RUN --html FILE`: the run drawn on one self-contained page.

The page is read back with the standard library's HTML parser, as a browser would tokenise it:
which elements and attributes it has, and what text it shows.  (A real browser renders it in
test_report_in_a_browser.py.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest
import time_machine
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.launcher.login.cli import cli, main
from clusterctl.launcher.login.report import duration_text, run_report
from clusterctl.launcher.login.report_drawing import (
    CURVE_POINTS, SLOWEST_NODES, RunSeries, Series, heat_colour, report_html, thin_curve,
)
from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.shared.runs import RunDir, create_run
from clusterctl.records.node_step_times import NodeStepTime, NodeStepTimes, write_node_step_times
from clusterctl.records.run_journal import (
    BlamedNode, Decided, DecisionAction, OutcomeKind, RecoveredInAllocation, SlurmTimes, Submitted,
)
from tests.conftest import REPO

RECORDED = REPO / "tests" / "data" / "runs" / "xid79-resubmit"
# What a page may hold: markup that draws.  Nothing that runs, fetches or links.
DRAWING_TAGS = {"html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "p", "span", "b", "i", "br",
                "code", "table", "tr", "th", "td", "footer", "svg", "text", "rect", "line", "polygon", "polyline",
                "circle"}


class Page(HTMLParser):
    """A page as a browser tokenises it: its elements, their attributes, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += attrs
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.texts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.texts).split())


def page_of(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def assert_self_contained(page: Page) -> None:
    assert set(page.tags) <= DRAWING_TAGS, set(page.tags) - DRAWING_TAGS
    names = {name for name, _ in page.attributes}
    assert not {n for n in names if n.startswith("on")} and not names & {"src", "href", "xlink:href", "action"}
    assert not any("url(" in (value or "") for _, value in page.attributes)


def recorded_run(tmp_path: Path) -> Path:
    """A copy of the recorded main-job story (see tests/data/runs/README.md)."""
    run = tmp_path / "supervised-20261126-042840"
    shutil.copytree(RECORDED, run)
    for name in ("spec.json", "spec.toml"):
        (run / name).chmod(0o600)
    return run


def test_the_recorded_xid_79_run_is_drawn_with_its_fault_its_resubmission_and_the_time_it_lost(tmp_path):
    run = recorded_run(tmp_path)
    drawn = tmp_path / "report.html"

    result = CliRunner().invoke(cli, ["report", str(run), "--html", str(drawn), "--json"])

    assert result.exit_code == 0, result.output
    assert f"drew the run to {drawn}" in result.stderr
    goodput = json.loads(result.stdout)["goodput"]  # --json still prints the report
    page = page_of(drawn.read_text())
    assert_self_contained(page)
    shown = page.text
    assert "node2: Xid 79 on gpu3" in shown  # the fault's marker on the timeline
    assert "attempt 1 (job 2) ended: node2 blamed: healthd: xid 79 gpu3 (GPU-36ec001a" in shown
    assert "epilog record: drain-reboot (xid 79 gpu3 drain-reboot; gpu-lost gpu3 drain-reboot)" in shown
    assert "resubmit from step 20" in shown and "attempt 2 submitted as job 3 from step 20" in shown
    assert "excluded when the run ended: node2" in shown
    assert f"goodput {goodput['goodput'] * 100:.1f}%" in shown
    for cause, key in (("work redone after failures", "redone_seconds"), ("queue", "queue_seconds"),
                       ("restarts", "restart_overhead_seconds")):
        assert f"{cause} {duration_text(goodput[key])}" in shown
    # Each job's step-time table (made from its log: tests/data/runs/README.md): node2 in the first, node4 for it.
    assert "node2 in job 2: 0.154 s/step, 0.99x, ok" in page.texts and "node4 in job 3: 0.1673 s/step, 1.00x, ok" in page.texts
    assert "no per-node step times recorded" not in shown
    assert f"{run}/checkpoints/step-00000090: no manifest.json (written last): incomplete" in shown


def test_a_finished_runs_page_shows_what_it_excluded_when_it_ended_on_any_later_day(tmp_path):
    run = recorded_run(tmp_path)  # ended 26 Nov 2026 04:30 UTC; node2 blamed for restart.blame_hours = 24
    drawn = tmp_path / "report.html"
    for today in (datetime(2026, 11, 26, 5, tzinfo=UTC), datetime(2027, 11, 26, 5, tzinfo=UTC)):
        with time_machine.travel(today, tick=False):
            result = CliRunner().invoke(cli, ["report", str(run), "--html", str(drawn), "--json"])
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert document["state"] == "done" and document["excluded_when_ended"] == ["node2"]
        # The live fact moves with the day the report is made; the page shows the recorded one.
        assert document["excluded_now"] == (["node2"] if today.year == 2026 else [])
        shown = page_of(drawn.read_text()).text
        assert "excluded when the run ended: node2" in shown and "excluded from the next submission" not in shown


def test_a_running_runs_page_shows_the_nodes_its_next_submission_excludes_as_of_now(tmp_path):
    run = recorded_run(tmp_path)
    journal = run / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["event"] == "done"
    journal.write_text("".join(lines[:-1]))  # as the run was before its end
    drawn = tmp_path / "report.html"
    for today, shown_as in ((datetime(2026, 11, 26, 5, tzinfo=UTC), "excluded from the next submission: node2"),
                            (datetime(2026, 11, 28, 5, tzinfo=UTC), None)):  # node2's 24 h blame over by then
        with time_machine.travel(today, tick=False):
            result = CliRunner().invoke(cli, ["report", str(run), "--html", str(drawn), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["excluded_when_ended"] is None
        shown = page_of(drawn.read_text()).text
        assert "excluded when the run ended" not in shown
        assert (shown_as in shown) if shown_as else "excluded from the next submission" not in shown


def curve_panels(page: Page) -> list[str]:
    return [attrs["aria-label"] or "" for tag, attrs in page.elements if tag == "svg" and attrs.get("class") == "curve"]


def test_the_recorded_run_draws_its_loss_tokens_and_mfu_across_both_attempts_with_the_fault_and_resubmission(tmp_path):
    run = recorded_run(tmp_path)
    drawn = tmp_path / "report.html"

    result = CliRunner().invoke(cli, ["report", str(run), "--html", str(drawn)])

    assert result.exit_code == 0, result.output
    page = page_of(drawn.read_text())
    assert curve_panels(page) == ["loss over time", "tokens/s over time", "MFU (%) over time", "step over time"]
    assert ("loss, tokens/s, MFU (%): from the jobs' training series (RUN/jobs/<job>/training-series.jsonl, "
            "6 points)") in page.text
    # The loss axis: round ticks around step 10's loss (7.66) and step 60's (5.02), which its label's tip names.
    assert "loss: 5.02 to 7.66 over the time shown" in page.texts
    loss_panel = page.text.split("loss: 5.02 to 7.66 over the time shown", 1)[1].split("tokens/s", 1)[0].split()
    # The time axis: UTC clock times at round 2-second ticks from the first submission (04:28:40.8).
    assert loss_panel[:9] == ["04:28:42", "04:28:44", "04:28:46", "04:28:48", "04:28:50", "04:28:52",
                              "04:28:54", "04:28:56", "04:28:58"]
    assert loss_panel[9:13] == ["5", "6", "7", "8"]
    assert "times in UTC; the first submission at 2026-11-26 04:28:40 UTC" in page.text
    lines = [attrs["class"] for tag, attrs in page.elements if tag == "line" and "-line" in (attrs.get("class") or "")]
    assert lines == ["fault-line", "recovery-line"] * 4  # the Xid 79 and the resubmission, on every curve
    polylines = [attrs for tag, attrs in page.elements if tag == "polyline"]
    assert len(polylines) == 2 * 3 + 2  # each curve in two pieces: the first attempt's, the second's
    # The text report: the same series, read at their ends only.
    assert ("training: loss 7.657 → 5.024 over steps 10–60; newest: 318k tokens/s, 6.47 steps/s, MFU 8.0%"
            in result.stdout)


def test_a_run_without_a_training_series_says_why_there_is_no_curve(tmp_path):
    run = recorded_run(tmp_path)
    for job in ("2", "3"):
        (run / "jobs" / job / "training-series.jsonl").unlink()
    drawn = tmp_path / "report.html"

    result = CliRunner().invoke(cli, ["report", str(run), "--html", str(drawn)])

    assert result.exit_code == 0, result.output
    page = page_of(drawn.read_text())
    assert "no training curves: none of the run's jobs kept a training series" in page.text
    assert "steps/s measured between consecutive checkpoints instead" in page.text
    assert curve_panels(page) == ["steps/s over time", "step over time"] and "training:" not in result.stdout


def test_a_damaged_series_is_said_and_everything_else_is_still_drawn(tmp_path):
    run = recorded_run(tmp_path)
    damaged = run / "jobs" / "2" / "training-series.jsonl"
    damaged.write_text("garbage\n" + damaged.read_text())
    with open(run / "jobs" / "3" / "training-series.jsonl", "a") as out:
        out.write('{"at": 1795667341.15, "job_i')  # the agent died mid-append
    drawn = tmp_path / "report.html"

    result = CliRunner().invoke(cli, ["report", str(run), "--html", str(drawn)])

    assert result.exit_code == 0, result.output
    problem = (f"cannot read the training series of job 2: {damaged}, line 1: not a JSON line (JSONDecodeError); "
               "lines follow it, so it is not a crash mid-append: the series is damaged (move the file away to draw "
               "the run without it); its curves are left out")
    torn = (f"{run}/jobs/3/training-series.jsonl, line 5 (the last): incomplete (no end of line: a crash mid-append, "
            "or the line being written); left out")
    assert f"clusterctl: {problem}" in result.stderr and f"clusterctl: {torn}" in result.stderr
    page = page_of(drawn.read_text())
    assert f"warning: {problem}" in page.text and torn in page.text
    assert curve_panels(page)[:3] == ["loss over time", "tokens/s over time", "MFU (%) over time"]  # job 3's
    assert "4 points)" in page.text and "node2: Xid 79 on gpu3" in page.text


def test_a_loss_that_went_nan_is_marked_where_it_did(tmp_path):
    events = [Submitted(at=100.0, attempt=1, job_id="4")]
    report = run_report(tmp_path / "r", events, [], [], now=400.0)
    loss = Series("loss", tuple((100.0 + t, 3.0 - t / 200) for t in range(150)),
                  not_finite=((260.0, "loss nan at step 1600"),))

    page = page_of(report_html(report, 400.0, RunSeries(loss=loss)))

    marks = [attrs for tag, attrs in page.elements if tag == "text" and attrs.get("class") == "not-finite"]
    assert len(marks) == 1 and "NaN" in page.texts and "loss nan at step 1600 at +2.7 min" in page.texts


HOSTILE = '<script>alert("reason")</script>'
ATTRIBUTE_BREAKER = '"><img src=x onerror=alert(1)>'


def test_text_from_outside_shows_as_written_and_never_as_markup(tmp_path):
    """A blame reason, its evidence, a node name in a step-time table and the run's own path can hold
    anything: each is shown as text, and the page still holds nothing that runs or fetches."""
    run = create_run(tmp_path / 'runs"><b>' / "llm", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    blame = BlamedNode("node3", HOSTILE, (ATTRIBUTE_BREAKER, "\x1b[2J bidi \u202e override"))
    run.record(Submitted(at=100.0, attempt=1, job_id="4"))
    run.record(Decided(at=201.0, attempt=1, job_id="4", state="FAILED", exit_code=3, outcome=OutcomeKind.NODE_FAILURE,
                       message=f"FAILED; {HOSTILE}", checkpoint_step=None, checkpoint=None,
                       action=DecisionAction.STOP, times=SlurmTimes(100.0, 110.0, 200.0), blame=(blame,)))
    write_node_step_times(run.job_dir("4"), NodeStepTimes("4", 190.0, 30, 0.05, 0.0, (
        NodeStepTime("node1", (0,), 0.05, 1.0, "ok"), NodeStepTime(ATTRIBUTE_BREAKER, (1,), 0.08, 1.6, "straggler"))))
    drawn = tmp_path / "report.html"

    result = CliRunner().invoke(cli, ["report", str(run.path), "--html", str(drawn)])

    assert result.exit_code == 0, result.output
    page = page_of(drawn.read_text())
    assert_self_contained(page)
    assert HOSTILE in page.text and ATTRIBUTE_BREAKER in page.text and str(run.path) in page.text
    assert "\\x1b[2J bidi \\u202e override" in page.text  # controls and overrides written as escapes
    assert "\x1b" not in drawn.read_text() and "\u202e" not in drawn.read_text()


def test_in_a_small_job_every_node_has_a_row_and_the_straggler_stands_out(tmp_path):
    nodes = tuple(NodeStepTime(f"node{i}", (i,), 0.05, 1.0 + i / 1000, "ok") for i in range(1, 12))
    nodes += (NodeStepTime("node12", (12,), 0.0715, 1.43, "straggler", 12.5),)
    events = [Submitted(at=100.0, attempt=1, job_id="5")]
    report = run_report(tmp_path / "r", events, [], [], now=400.0)

    page = page_of(report_html(report, 400.0, RunSeries(step_times=(NodeStepTimes("5", 380.0, 60, 0.05, 12.5, nodes),))))

    assert [t for t in page.texts if re.fullmatch(r"node\d+", t)] == [f"node{i}" for i in range(1, 13)]  # 2, then 10
    assert "1.43x" in page.texts and "job 5" in page.texts
    assert "node12 in job 5: 0.0715 s/step, 1.43x, straggler" in page.texts
    bordered = [attrs for tag, attrs in page.elements if tag == "rect" and attrs.get("stroke") == "#000"]
    assert [attrs["fill"] for attrs in bordered] == [heat_colour(1.43)]  # only the straggler has a black border


def test_a_run_at_the_seeds_scale_draws_a_page_of_bounded_size(tmp_path):
    """12,500 nodes, one of them slow, in 200 step-time tables; 3,000 restarts inside the allocation;
    20,000 checkpoints; 100,000 loss points: the page names the slow node and says what it summarised."""
    lines = [NodeStepTime(f"gpu{n:05d}", (8 * n,), 1.0 + n % 7 / 100, 1.0 + n % 7 / 100, "ok") for n in range(12_500)]
    lines[4321] = NodeStepTime("gpu04321", (8 * 4321,), 1.6, 1.6, "straggler", 60.0)
    tables = [NodeStepTimes("7", 1000.0 + k * 400, 100 * k, 1.0, 60.0, tuple(lines)) for k in range(200)]
    events = [Submitted(at=1000.0, attempt=1, job_id="7")]
    events += [RecoveredInAllocation(at=1100.0 + 25 * k, job_id="7", restart=k + 1,
                                     blame=(BlamedNode(f"gpu{k:05d}", f"xid {k % 100}"),), nodes=(f"gpu{k:05d}",),
                                     phases=(("stop", 2.0),)) for k in range(3000)]
    checkpoints = [Checkpoint(f"/ckpt/step-{s}", s, "manifest", 1000.0 + 4 * s, 1.0) for s in range(1, 20_001)]
    report = run_report(tmp_path / "big", events, checkpoints, [], now=81_000.0)
    loss = Series("loss", tuple((1000.0 + t, 10.0 / (1 + t / 1000) + (50.0 if t == 40_000 else 0.0))
                                for t in range(100_000)), "the program")

    started = time.monotonic()
    text = report_html(report, 81_000.0, RunSeries(step_times=tuple(tables), loss=loss))
    took = time.monotonic() - started

    page = page_of(text)
    assert_self_contained(page)
    assert len(text.encode()) < 600_000, len(text.encode())
    node_rows = [t for t in page.texts if t.startswith("gpu") and len(t) == 8]
    assert node_rows[0] == "gpu04321" and len(set(node_rows)) <= SLOWEST_NODES + 10
    assert "12,500 nodes: the 16 slowest have a row each; every node is in the percentile rows" in page.text
    assert "p99 of 12,500 nodes" in page.text
    assert "200 step-time tables merged into 48 columns by time" in page.text
    assert "more checkpoints not drawn" in page.text and "more faults and recoveries not drawn" in page.text
    assert "more lines not shown: `clusterctl report RUN` lists every one" in page.text
    assert "50.2" in page.text  # the loss spike (10/41 + 50) survives the thinning: it is the axis' top
    print(f"12,500 nodes x 200 tables, 3,000 restarts, 20,000 checkpoints, 100,000 loss points: "
          f"{len(text.encode()) / 1000:.0f} kB in {took:.2f} s")


def test_a_running_run_is_drawn_up_to_now_and_a_run_with_no_attempt_says_there_is_nothing_yet(tmp_path):
    events = [Submitted(at=100.0, attempt=1, job_id="4")]
    running = page_of(report_html(run_report(tmp_path / "r", events, [], [], now=400.0), 400.0))
    empty = page_of(report_html(run_report(tmp_path / "e", [], [], [], now=400.0), 400.0))

    assert "running" in running.text and "5.0 min" in running.text  # queued until now (Slurm has not started it)
    assert "nothing to draw yet: no attempt has been submitted" in empty.text
    assert_self_contained(running)
    assert_self_contained(empty)


def test_the_programs_loss_and_throughput_are_drawn_when_reported(tmp_path):
    events = [Submitted(at=100.0, attempt=1, job_id="4")]
    report = run_report(tmp_path / "r", events, [], [], now=400.0)
    loss = Series("loss", tuple((100.0 + t, 3.0 - t / 200) for t in range(300)), "the agent's summaries")
    tokens = Series("tokens/s", tuple((100.0 + t, 2.5e6) for t in range(0, 300, 10)), "the agent's summaries",
                    from_zero=True)

    page = page_of(report_html(report, 400.0, RunSeries(loss=loss, throughput=tokens)))

    assert "loss, tokens/s: from the agent's summaries" in page.text and "2.5M" in page.text
    assert "no training curves" not in page.text and "MFU: not known (the program reported no FLOPs" in page.text


points = st.lists(st.tuples(st.floats(0, 1e6), st.floats(-1e9, 1e9)), max_size=3000).map(sorted)


@given(points, st.integers(2, 400))
def test_a_thinned_curve_is_a_bounded_subsequence_that_keeps_the_extremes(curve, limit):
    thinned = thin_curve(curve, limit)

    assert len(thinned) <= max(limit, 2)
    it = iter(curve)
    assert all(any(p == q for q in it) for p in thinned)  # a subsequence, in order
    if curve:
        assert max(v for _, v in curve) == max(v for _, v in thinned)
        assert min(v for _, v in curve) == min(v for _, v in thinned)


def test_a_curve_never_draws_more_than_its_points(tmp_path):
    events = [Submitted(at=10.0, attempt=1, job_id="4")]
    report = run_report(tmp_path / "r", events, [], [], now=1e5)
    loss = Series("loss", tuple((float(t), float(t % 97)) for t in range(100_000)))

    text = report_html(report, 1e5, RunSeries(loss=loss))

    drawn = [v for name, v in page_of(text).attributes if name == "points" and v and v.count(",") > 100]
    assert len(drawn) == 1 and drawn[0].count(",") <= CURVE_POINTS


def run_main(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["clusterctl", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    return int(exited.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("what", ["a symlink", "something other than a regular file (a FIFO, a device, a socket)"])
def test_report_html_replaces_only_a_regular_file(tmp_path, monkeypatch, capsys, what):
    run = recorded_run(tmp_path)
    target = tmp_path / "out.html"
    if what == "a symlink":
        (tmp_path / "elsewhere").write_text("keep me")
        target.symlink_to(tmp_path / "elsewhere")
    else:
        os.mkfifo(target)

    code, err = run_main(monkeypatch, capsys, "report", str(run), "--html", str(target))

    assert code == 12 and err.count("\n") == 1
    assert err.startswith(f"clusterctl: error: --html {target}: {what} is there, and only a regular file is "
                          "replaced (clusterctl neither writes through a link nor over a device); pick another "
                          "path, or remove it first")
    if what == "a symlink":
        assert (tmp_path / "elsewhere").read_text() == "keep me"


def test_report_html_onto_a_directory_is_a_usage_error(tmp_path, monkeypatch, capsys):
    run = recorded_run(tmp_path)
    (tmp_path / "out.html").mkdir()

    code, err = run_main(monkeypatch, capsys, "report", str(run), "--html", str(tmp_path / "out.html"))

    assert code == 2 and f"Invalid value for '--html': File '{tmp_path}/out.html' is a directory." in err


def test_report_html_in_a_place_that_cannot_be_written_is_exit_12(tmp_path, monkeypatch, capsys):
    run = recorded_run(tmp_path)
    (tmp_path / "afile").write_text("")

    code, err = run_main(monkeypatch, capsys, "report", str(run), "--html", str(tmp_path / "afile" / "r.html"))

    assert code == 12 and err.startswith(f"clusterctl: error: --html {tmp_path}/afile/r.html: cannot write it")


def test_report_html_replaces_an_old_drawing_whole(tmp_path):
    run = recorded_run(tmp_path)
    target = tmp_path / "out.html"
    target.write_text("an old drawing")

    result = CliRunner().invoke(cli, ["report", str(run), "--html", str(target)])

    assert result.exit_code == 0, result.output
    assert target.read_text().startswith("<!DOCTYPE html>") and RunDir(run).exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.html")] == []  # no temp file left
