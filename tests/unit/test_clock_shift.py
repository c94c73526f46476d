"""`pytest --clock-shift`: the suite run as if today were elsewhere (tests/clock_shift.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.clock_shift import shift_seconds
from tests.conftest import REPO


@given(st.sampled_from("+-"), st.integers(min_value=0, max_value=10_000), st.sampled_from("smhd"))
def test_a_shift_is_a_sign_a_number_and_a_unit(sign, number, unit):
    seconds = shift_seconds(f"{sign}{number}{unit}")
    assert seconds == (1 if sign == "+" else -1) * number * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


@pytest.mark.parametrize("text", ["365d", "+365", "+1y", "+-1d", "", "+1 d"])
def test_a_shift_in_another_form_is_a_usage_error_that_shows_the_form(text):
    with pytest.raises(pytest.UsageError, match=r"for example \+365d or -1d"):
        shift_seconds(text)


PROBE = """
    import os, subprocess, sys, time

    def test_today():
        child = subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                               capture_output=True, text=True, check=True)
        with open(os.environ["PROBE_SEEN"], "w") as seen:
            seen.write(f"{time.time()} {child.stdout.strip()} {time.monotonic()}")
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_the_tests_and_the_python_they_start_see_the_shifted_day_and_the_real_monotonic_clock(tmp_path, workers):
    probe = tmp_path / "test_probe.py"
    probe.write_text(textwrap.dedent(PROBE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERCTL_TEST_CLOCK")}
    env.pop("PYTHONPATH", None)
    env["PROBE_SEEN"] = str(tmp_path / "seen")
    # This very test may run shifted (CI runs the suite a year ahead too): count from the real day.
    outer_shift = float(os.environ.get("CLUSTERCTL_TEST_CLOCK_SHIFT_SECONDS", "0"))
    before, monotonic = time.time() - outer_shift, time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.clock_shift", "--clock-shift=+365d",
                          "-p", "no:cacheprovider", *workers, str(probe)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    year = 365 * 86400
    test_now, child_now, test_monotonic = (float(x) for x in (tmp_path / "seen").read_text().split())
    # Moved once (not twice in an xdist worker), within the minute this took.
    after = time.time() - outer_shift
    assert before + year - 5 <= test_now <= after + year + 5
    assert before + year - 5 <= child_now <= after + year + 5
    assert monotonic - 5 <= test_monotonic <= time.monotonic() + 5
