"""Tell clusterctl how far this rank has got, so a rank that hangs is caught in its step time, not NCCL's.

A training program launched by clusterctl may call, once per step (or as often as it likes)::

    from clusterctl.progress import beat
    beat(step)                          # in the training loop
    beat(step, compute_seconds=busy)    # ...with this step's compute time on this rank (see below)
    beat(step, "checkpoint-save")       # before saving; the next beat(step + 1) ends the phase

`compute_seconds` is the time this rank spent on its own work in the step: from the step's start
to the point where it waits for its peers (before the gradient all-reduce, say), *not* the whole
step: in data-parallel training every rank's step takes as long as the slowest rank's, so only the
time before the wait tells a slow node apart (the straggler watch compares it across nodes).  With
CUDA, time it after a `torch.cuda.synchronize()` or with CUDA events.  It is summed into the report,
so a report skipped by the rate limit loses nothing.

The first report also starts a daemon thread that rewrites the report every interval with the
time it ran (`alive_at`), whatever the training loop does: a rank blocked in a collective behind
a dead peer stays "alive", a SIGSTOPped or wedged process does not, so the hang watch can name the
node whose ranks froze even when every rank stopped stepping at once.
CLUSTERCTL_PROGRESS_LIVENESS=0 turns the thread off.

It writes `<dir>/progress/<rank>.json` (clusterctl.records.rank_progress) at most once per
`min_interval` seconds, and at once whenever the phase changes, so calling it every step costs a
clock read and a comparison.  `<dir>` is $CLUSTERCTL_NODE_DIR when the launcher set one (a job
whose agent hears node reports: node-local tmpfs, clusterctl.node_dir; the node's reporter reads
it and sends one datagram per node, so nothing reaches shared storage), else $CLUSTERCTL_JOB_DIR
(the job directory on shared storage: one file rewrite per rank per interval).  Outside a
clusterctl job (neither set) it does nothing.  It never raises into the training program: a
report that cannot be written is said once on stderr and the program carries on.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from clusterctl.node_dir import NODE_DIR_ENV
from clusterctl.records.rank_progress import PHASES, RankProgress, write_rank_progress

DEFAULT_MIN_INTERVAL = 1.0
"""Seconds between two reports of the same phase, unless CLUSTERCTL_PROGRESS_INTERVAL says otherwise."""

INTERVAL_ENV = "CLUSTERCTL_PROGRESS_INTERVAL"
"""Lets the launcher space reports out on a very large job (fewer files rewritten per second on shared storage)."""

LIVENESS_ENV = "CLUSTERCTL_PROGRESS_LIVENESS"
"""`0` turns off the thread that keeps reporting that the process runs."""

# Per (report dir, rank): when this process last wrote (monotonic) and in which phase.  Keyed so a
# process that reports for two jobs (tests, notebooks) rate-limits each on its own.
_last_report: dict[tuple[str, int], tuple[float, str]] = {}
# Per (job dir, rank): compute seconds and steps summed so far (written with every report).
_compute: dict[tuple[str, int], tuple[float, int]] = {}
# The job dirs this process has already complained about: one message each, not one per step.
_complained_about: set[str] = set()
# Per (job dir, rank): the report last written, which the liveness thread rewrites with a new alive_at.
_written: dict[tuple[str, int], RankProgress] = {}
_liveness: set[tuple[str, int]] = set()  # keys whose liveness thread runs
# The training loop and the liveness thread both write a rank's report: one at a time.
_write_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A forked child (a data-loader worker) has none of the parent's threads, and a lock held by
    # one of them at the fork would stay held forever.
    global _write_lock
    _write_lock = threading.Lock()
    _liveness.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _write(key: tuple[str, int], record: RankProgress) -> None:
    with _write_lock:
        write_rank_progress(Path(key[0]), record)
        _written[key] = record


def _keep_alive(key: tuple[str, int], interval: float) -> None:
    """The liveness thread: rewrite the rank's last report with the time, every `interval` s."""
    while True:
        time.sleep(interval)
        try:
            record = _written.get(key)
            if record is None:
                continue
            total, steps = _compute.get(key, (record.compute_s, record.compute_steps))
            _write(key, replace(record, compute_s=round(total, 6), compute_steps=steps, alive_at=time.time()))
        except Exception:  # the contract: never break training; the next round tries again
            continue


def _start_liveness(key: tuple[str, int], interval: float) -> None:
    if key in _liveness or os.environ.get(LIVENESS_ENV, "1") == "0":
        return
    _liveness.add(key)
    threading.Thread(target=_keep_alive, args=(key, max(interval, 0.05)), name="clusterctl-progress-liveness",
                     daemon=True).start()


def _report_dir(environ: Mapping[str, str]) -> str | None:
    """Where this rank's reports go: the node-local directory when there is one, else the job's."""
    return environ.get(NODE_DIR_ENV) or environ.get("CLUSTERCTL_JOB_DIR") or None


def _say_once(message: str) -> None:
    report_dir = _report_dir(os.environ) or ""
    if report_dir not in _complained_about:
        _complained_about.add(report_dir)
        print(f"clusterctl.progress: {message}; training continues, but hangs of this rank may be "
              "caught later or blamed on the whole job (said once per job)", file=sys.stderr, flush=True)


def _rank(environ: Mapping[str, str]) -> int | None:
    text = environ.get("RANK") or environ.get("SLURM_PROCID")
    return int(text) if text is not None and text.strip().isdigit() else None


def _interval(min_interval: float | None) -> float:
    if min_interval is not None:
        return min_interval
    try:
        return float(os.environ.get(INTERVAL_ENV, DEFAULT_MIN_INTERVAL))
    except ValueError:
        return DEFAULT_MIN_INTERVAL


def beat(step: int, phase: str = "step", *, compute_seconds: float | None = None,
         min_interval: float | None = None) -> None:
    """Report that this rank reached `step` and is in `phase` ("startup", "step", "checkpoint-save",
    "checkpoint-load"), and optionally how long it computed in this step (`compute_seconds`).

    Writes at most once per `min_interval` seconds (default: $CLUSTERCTL_PROGRESS_INTERVAL, else
    1.0) unless the phase changed since the last report, under $CLUSTERCTL_NODE_DIR (node-local)
    when set, else $CLUSTERCTL_JOB_DIR; does nothing without either.  The rank comes from RANK
    (torchrun) or SLURM_PROCID.  Never raises.
    """
    try:
        report_dir = _report_dir(os.environ)
        if not report_dir:
            return
        rank = _rank(os.environ)
        if rank is None:
            _say_once("neither RANK nor SLURM_PROCID is set, so progress cannot be reported")
            return
        key = (report_dir, rank)
        if compute_seconds is not None and phase == "step":
            seconds = float(compute_seconds)
            if seconds >= 0 and seconds != float("inf"):  # NaN fails >= too
                total, steps = _compute.get(key, (0.0, 0))
                _compute[key] = (total + seconds, steps + 1)
        now = time.monotonic()
        last = _last_report.get(key)
        if last is not None and last[1] == phase and now - last[0] < _interval(min_interval):
            return
        if phase not in PHASES:
            _say_once(f"phase {phase!r} is not one of {', '.join(PHASES)}; not reported")
            return
        # Noted before writing: a filesystem that fails (or stalls) is not retried at every step.
        _last_report[key] = (now, phase)
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        total, steps = _compute.get(key, (0.0, 0))
        now_epoch = time.time()
        _write(key, RankProgress(rank, node, int(step), phase, now_epoch, os.getpid(), round(total, 6), steps,
                                 now_epoch))
        _start_liveness(key, _interval(min_interval))
    except OSError as exc:
        _say_once(f"cannot write the progress report in {_report_dir(os.environ)} ({exc})")
    except Exception as exc:  # the contract: a progress report never breaks training
        _say_once(f"progress report failed ({exc.__class__.__name__}: {exc})")
