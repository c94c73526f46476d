"""The side-by-side benchmark's measuring, without running any tool: the step log every tool's program writes,
what one trial measures from it (fault → detected, → stepping again, steps lost), and the table with each
row's ratio to the best (bench/peers_bench.py runs the tools; no timing here)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "examples"))

import peer_steps as steps  # noqa: E402
from step_log import StepLog  # noqa: E402

lines = st.builds(lambda wall, step, world, rank: steps.StepLine(wall, step, rank % world, world),
                  st.floats(1.0, 4e9, allow_nan=False), st.integers(0, 10**7), st.integers(1, 4096),
                  st.integers(0, 4095))


def render(step_lines) -> str:
    return "".join(f"{line.wall:.6f} {line.step} {line.rank} {line.world}\n" for line in step_lines)


@given(st.lists(lines, max_size=30))
def test_a_step_log_reads_back_every_line_it_was_written_with(written) -> None:
    read = steps.parse_step_log(render(written))
    assert [(r.step, r.rank, r.world) for r in read] == [(w.step, w.rank, w.world) for w in written]
    assert all(abs(r.wall - w.wall) < 1e-5 for r, w in zip(read, written))


def test_the_programs_own_writer_writes_what_the_bench_reads(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "steps.log")
    log.step(7, 1, 4)
    log.step(8, 1, 4)
    read = steps.parse_step_log((tmp_path / "steps.log").read_text())
    assert [(r.step, r.rank, r.world) for r in read] == [(7, 1, 4), (8, 1, 4)]
    StepLog(None).step(1, 0, 1)  # no step log asked for: nothing written, nothing raised


@given(st.lists(lines, min_size=1, max_size=5), st.text(alphabet="0123456789. x", max_size=12))
def test_a_line_still_being_written_at_the_end_is_left_out(written, partial) -> None:
    assert len(steps.parse_step_log(render(written) + partial)) == len(written)


@given(st.text(max_size=40).filter(lambda t: "\n" not in t and t.strip()))
def test_a_line_that_is_not_a_step_is_a_clear_error_naming_its_line(text) -> None:
    try:
        parsed = steps.parse_step_log(f"1.0 1 0 1\n{text}\n")
    except steps.StepLogError as exc:
        assert "step log line 2" in str(exc)
    else:
        assert len(parsed) == 2  # it happened to be a valid step line


@pytest.mark.parametrize("bad", ["1.0 1 2 2", "1.0 -1 0 1", "1.0 1 0 0", "nan 1 0 1", "1.0 1 0", "1.0 1.5 0 1"])
def test_impossible_lines_are_refused(bad: str) -> None:
    with pytest.raises(steps.StepLogError):
        steps.parse_step_log(bad + "\n")


def run(world: int, first: int, last: int, start: float, step_time: float = 0.1):
    """Every rank of a world stepping from `first` to `last`, the step ending at start + k*step_time."""
    return [steps.StepLine(start + (s - first + 1) * step_time + rank * 0.001, s, rank, world)
            for s in range(first, last + 1) for rank in range(world)]


@given(world=st.integers(1, 16), checkpoint=st.integers(0, 50), ahead=st.integers(0, 9),
       downtime=st.floats(0.5, 600, allow_nan=False))
def test_a_restart_from_a_checkpoint_loses_the_steps_since_it_and_steps_again_when_every_rank_has(
        world, checkpoint, ahead, downtime) -> None:
    before = run(world, 1, checkpoint + ahead, 1000.0)
    fault = before[-1].wall + 0.05 if before else 1000.0
    after = run(world, checkpoint + 1, checkpoint + 20, fault + downtime)
    measured = steps.measure_trial(before + after, fault, None)
    # A restart that resumes at the very step in flight at the fault shows no restart: seen one step late.
    first = checkpoint + 1 if ahead or not before else checkpoint + 2
    completed = max(line.wall for line in after if line.step == first)
    assert measured.stepping_again_s == pytest.approx(completed - fault, abs=1e-3)
    assert measured.steps_lost == (ahead if before else None)
    if ahead:  # no tool line given: the first step of the new attempt (one done before) is the detection
        assert measured.detected_by == "restart"
        assert measured.detected_s == pytest.approx(after[0].wall - fault, abs=1e-3)


@given(world=st.integers(2, 8), survivors=st.integers(1, 7), gap=st.floats(0.1, 60, allow_nan=False))
def test_a_tool_that_goes_on_with_fewer_ranks_loses_nothing_and_a_step_cut_short_does_not_count(
        world, survivors, gap) -> None:
    survivors = min(survivors, world - 1)
    before = run(world, 1, 30, 1000.0)
    fault = before[-1].wall + 0.01
    cut_short = [steps.StepLine(fault + 0.02, 31, rank, world) for rank in range(world - 1)]  # one rank died
    after = run(survivors, 31, 40, fault + gap)
    measured = steps.measure_trial(before + cut_short + after, fault, fault + 0.5)
    assert measured.steps_lost == 0
    assert measured.stepping_again_s == pytest.approx(max(x.wall for x in after if x.step == 31) - fault, abs=1e-3)
    assert (measured.detected_by, measured.detected_s) == ("tool log", 0.5)


def test_a_trial_that_never_steps_again_says_so() -> None:
    before = run(4, 1, 25, 1000.0)
    measured = steps.measure_trial(before, before[-1].wall + 0.01, None)
    assert (measured.stepping_again_s, measured.steps_lost, measured.detected_s, measured.detected_by) == \
        (None, None, None, "")


def test_the_tools_detection_is_its_first_matching_line_after_the_fault() -> None:
    stamped = [(1.0, "reconfiguring for quorum_id=1"), (5.0, "step 3"), (7.5, "reconfiguring for quorum_id=2"),
               (9.0, "reconfiguring for quorum_id=3")]
    assert steps.first_match(stamped, 2.0, re.compile("reconfiguring")) == 7.5
    assert steps.first_match(stamped, 9.0, re.compile("reconfiguring")) is None


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.floats(0.01, 1e4, allow_nan=False), min_size=1))
def test_the_best_tool_of_a_row_is_1_and_every_other_its_multiple(medians) -> None:
    ratios = steps.ratios_to_best(medians)
    best = min(medians, key=lambda tool: medians[tool])
    assert ratios[best] == 1.0
    assert all(ratio >= 1.0 for ratio in ratios.values())
    assert all(ratios[t] == pytest.approx(medians[t] / medians[best], abs=0.01) for t in medians)


def test_a_spread_is_the_median_and_its_range() -> None:
    assert steps.spread([3.0, 1.0, 2.0, 10.0, 4.0]) == "3 [1–10]"
    assert steps.spread([0.25, 0.5]) == "0.38 [0.25–0.5]"
    assert steps.spread([0, 0, 0]) == "0"
    assert steps.spread([]) == "—"


def test_the_table_gives_each_measured_row_its_ratio_and_each_other_row_its_reason() -> None:
    trial = {"detected_s": 0.1, "stepping_again_s": 30.0, "steps_lost": 5}
    rows = [{"fault": "kill", "tool": "nvrx", "timeouts": "aggressive", "trials": [trial, {**trial, "stepping_again_s": 34.0}]},
            {"fault": "kill", "tool": "torchft", "timeouts": "defaults",
             "trials": [{"detected_s": 5.0, "stepping_again_s": 6.0, "steps_lost": 0}]},
            {"fault": "kill", "tool": "torchft", "timeouts": "aggressive",
             "trials": [{"stepping_again_s": None, "note": "not stepping again within 120 s"},
                        {"detected_s": 1.0, "stepping_again_s": 2.0, "steps_lost": 0}]},
            {"fault": "straggler", "tool": "torchft", "timeouts": "defaults", "note": "not handled: nothing is evicted",
             "trials": []}]
    text = steps.table(rows)
    assert text[2] == "| kill | nvrx | aggressive | 2 | 0.1 | 32 [30–34] | 5 | 5.33 |"
    assert text[3] == "| kill | torchft | defaults | 1 | 5 | 6 | 0 | 1 |"
    assert text[4] == "| kill | torchft | aggressive | 2 | 1 | 2 (1 of 2 never) | 0 | — |"
    assert text[5] == "| straggler | torchft | defaults | 0 | not handled: nothing is evicted | | | |"


def test_the_step_a_stopped_rank_finishes_when_its_tool_wakes_it_to_kill_it_is_not_stepping_again() -> None:
    before = run(4, 1, 25, 1000.0)
    fault = before[-1].wall + 0.01
    in_flight = [steps.StepLine(fault + 0.1, 26, rank, 4) for rank in range(3)] + [steps.StepLine(fault + 5, 26, 3, 4)]
    restart = run(4, 21, 30, fault + 30)
    measured = steps.measure_trial(before + in_flight + restart, fault, fault + 5)
    assert measured.stepping_again_s == pytest.approx(max(x.wall for x in restart if x.step == 21) - fault, abs=1e-3)
    assert measured.steps_lost == 5
