"""Moves the wall clock of a Python process that `pytest --clock-shift` starts, by the same shift.

tests/clock_shift.py puts this directory on PYTHONPATH and the shift in CLUSTERCTL_TEST_CLOCK_SHIFT_SECONDS
for the session's child processes, so that a `python -m clusterctl...` a test runs reads the same shifted
date as the test that wrote its files.  An interpreter without time-machine (another Python on the machine)
runs on today's date.
"""

import os

_shift = os.environ.get("CLUSTERCTL_TEST_CLOCK_SHIFT_SECONDS")
if _shift:
    import sys
    import time

    # time-machine imports pytest and dateutil when it can (0.8 s, more on a loaded machine): a child process
    # that starts that much slower misses the short graces some tests give it.  It needs neither to travel.
    _hidden = [name for name in ("pytest", "dateutil", "dateutil.parser") if name not in sys.modules]
    sys.modules.update(dict.fromkeys(_hidden))
    try:
        import time_machine
    except ImportError:
        time_machine = None
    finally:
        for name in _hidden:
            sys.modules.pop(name, None)
    if time_machine is not None:
        time_machine.travel(time.time() + float(_shift), tick=True).start()
        # An xdist worker is such a process: its pytest must not move its clock a second time.
        os.environ["CLUSTERCTL_TEST_CLOCK_SHIFTED_PID"] = str(os.getpid())
