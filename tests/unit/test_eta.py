"""The ETA `clusterctl status` shows: the steps left over the steps/s measured, and what it never says."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.launcher.login.status import eta_text
from clusterctl.launcher.pure.eta import DONE, ESTIMATE, NO_PROGRESS, NO_RATE, NO_STEP, NO_TOTAL, UNKNOWN, eta

totals = st.none() | st.integers(min_value=1, max_value=10**15)
steps = st.none() | st.integers(min_value=0, max_value=2 * 10**15)
rates = st.none() | st.floats(allow_nan=True, allow_infinity=True)
goodputs = st.none() | st.floats(allow_nan=True, allow_infinity=True)


@given(total=totals, step=steps, rate=rates, goodput=goodputs, finished=st.booleans())
def test_an_eta_is_never_negative_nor_infinite_and_never_gets_shorter_for_the_time_the_run_loses(
        total, step, rate, goodput, finished):
    e = eta(total, step, rate, goodput, finished=finished)
    for seconds in (e.seconds, e.seconds_at_goodput):
        assert seconds is None or (math.isfinite(seconds) and seconds >= 0.0)
    if e.seconds is not None and e.seconds_at_goodput is not None:
        assert e.seconds_at_goodput >= e.seconds
    assert (e.seconds is not None) == (e.state in (ESTIMATE, DONE))
    assert (e.why != "") == (e.state == UNKNOWN)


@given(total=st.integers(min_value=1, max_value=10**15), step=st.integers(min_value=0, max_value=10**15),
       rate=st.none() | st.just(0.0) | st.floats(max_value=0.0) | st.just(math.nan), goodput=goodputs)
def test_without_a_rate_or_with_none_the_eta_is_unknown_unless_the_total_is_reached(total, step, rate, goodput):
    e = eta(total, step, rate, goodput)
    if step >= total:
        assert e.state == DONE and e.seconds == 0.0
    else:
        assert e.state == UNKNOWN and e.seconds is None and e.why in (NO_RATE, NO_PROGRESS)


@given(total=st.integers(min_value=1, max_value=10**12), extra=st.integers(min_value=0, max_value=10**12),
       rate=rates, not_training=st.sampled_from(["", "the job is PENDING"]))
def test_at_or_past_the_total_step_it_is_done_whatever_the_rate(total, extra, rate, not_training):
    e = eta(total, total + extra, rate, not_training=not_training)
    assert (e.state, e.seconds, e.steps_left) == (DONE, 0.0, 0)
    assert eta_text(e) == f"ETA: done (step {total + extra:,} of {total:,})"


@given(total=st.integers(min_value=2, max_value=10**9), rate=st.floats(min_value=1e-3, max_value=1e4),
       goodput=st.floats(min_value=0.01, max_value=1.0))
def test_the_estimate_is_the_steps_left_over_the_rate_and_at_the_goodput_so_far_longer(total, rate, goodput):
    step = total // 2
    e = eta(total, step, rate, goodput)
    assert e.state == ESTIMATE
    assert e.seconds == pytest.approx((total - step) / rate)
    assert e.seconds_at_goodput == pytest.approx(e.seconds / goodput)


def test_what_a_user_reads():
    assert eta_text(eta(5000, 1200, 0.5, 0.8)) == ("ETA 2.1 h: 3,800 steps left at 0.5 steps/s (2.6 h at the run's "
                                                   "goodput so far, 80%)")
    assert eta_text(eta(5000, 1200, 0.5)) == "ETA 2.1 h: 3,800 steps left at 0.5 steps/s"
    assert eta_text(eta(None, 1200, 0.5)) == f"ETA unknown: {NO_TOTAL}"
    assert eta_text(eta(5000, None, None)) == f"ETA unknown: {NO_STEP}"
    assert eta_text(eta(5000, 1200, 0.0)) == f"ETA unknown: {NO_PROGRESS}"
    assert eta_text(eta(5000, 1200, 0.5, not_training="the job is PENDING")) == "ETA unknown: the job is PENDING"
    assert eta_text(eta(5000, 4000, None, finished=True)) == "ETA: done (step 4,000 of 5,000)"
