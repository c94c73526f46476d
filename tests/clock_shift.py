"""`pytest --clock-shift=+365d`: run the tests as if today were a year ahead (or `-1d`, a day back).

A test whose result depends on today's date (a recorded run's age, a blame window measured from now, a
"3 h ago" text, a tier's age) passes the day it is written and fails months later on every machine.
Running the suite with the wall clock moved shows it on the day it is written.

The shift moves the wall clock of this process (`time.time`, `time.time_ns`, `datetime.now`, `date.today`
and the `clusterctl.clock` door that reads them) with time-machine, which patches them where CPython
implements them, so every import of them moves, and the clock keeps ticking from the shifted start.
The monotonic clock, timeouts, sleeps and sockets are not moved: intervals stay real.

Python processes the tests start with this environment (`python -m clusterctl.healthd ...`) are moved by
the same shift: `clock_shift_site/sitecustomize.py`, on PYTHONPATH, starts the same travel in them
(libfaketime's preload, tried first, broke sockets and the emulated driver there; see issue 37).
What the shift does not move, by design (a test that needs them is not date-dependent by this measure):
files' modification times (the kernel's clock), other programs' clocks (Slurm, the emulated driver,
which counts an injected hang on the monotonic clock for that reason).

An xdist worker is such a process: it is moved as it starts, and its own pytest leaves its clock alone.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

SHIFT = re.compile(r"^([+-])(\d+(?:\.\d+)?)([smhd])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def shift_seconds(text: str) -> float:
    """`+365d` → 31,536,000.0; `-1d`, `+6h`, `-90m`, `+30s`; a usage error naming the option otherwise."""
    found = SHIFT.match(text.strip())
    if found is None:
        raise pytest.UsageError(f"--clock-shift={text!r}: write a sign, a number and a unit (s, m, h or d), "
                                "for example +365d or -1d")
    sign, number, unit = found.groups()
    return (1 if sign == "+" else -1) * float(number) * UNIT_SECONDS[unit]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--clock-shift", default=None, metavar="SHIFT",
                     help="run with the wall clock moved by SHIFT (+365d, -1d, +6h): finds tests that depend on "
                          "today's date (see tests/clock_shift.py)")


def pytest_configure(config: pytest.Config) -> None:
    text = config.getoption("--clock-shift")
    if not text:
        return
    import time_machine  # a test extra; only the shifted run needs it

    seconds = shift_seconds(text)
    os.environ["CLUSTERCTL_TEST_CLOCK_SHIFT_SECONDS"] = repr(seconds)
    site = str(Path(__file__).resolve().parent / "clock_shift_site")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if site not in paths:  # an xdist worker inherited it already
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, *paths) if p)
    config.stash[SHIFTED] = seconds
    if os.environ.get("CLUSTERCTL_TEST_CLOCK_SHIFTED_PID") == str(os.getpid()):
        return  # an xdist worker, moved already as it started (clock_shift_site)
    traveller = time_machine.travel(time.time() + seconds, tick=True)
    traveller.start()
    config.stash[TRAVELLER] = traveller


def pytest_unconfigure(config: pytest.Config) -> None:
    traveller = config.stash.get(TRAVELLER, None)
    if traveller is not None:
        traveller.stop()


def pytest_report_header(config: pytest.Config) -> str | None:
    seconds = config.stash.get(SHIFTED, None)
    if seconds is None:
        return None
    return f"clock shifted by {seconds / 86400:+.2f} days: today reads as {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"


TRAVELLER = pytest.StashKey[Any]()
SHIFTED = pytest.StashKey[float]()
