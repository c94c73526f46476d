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

What the program says of its training rides on the same report, at no extra write::

    beat(step, compute_seconds=busy, tokens=n, flops=transformer_flops(params, n), loss=loss, grad_norm=norm)

`tokens` and `flops` are this rank's share of the step's work: each rank its own (the sum over the ranks
is the job's), or the whole step's on one rank and none on the others; never the whole step's on every
rank.  With data parallelism alone a rank's share is its own batch: samples x sequence length.  With
tensor, pipeline or context parallelism several ranks work on the same tokens: report the step's
tokens / world size on each rank (or the step's on rank 0).  `flops` likewise; for a dense transformer
`transformer_flops(params, tokens)` = 6 x params x tokens (forward and backward; the attention term
left out), the convention MFU figures are quoted in.  Both are summed into the report like
`compute_seconds`, so a report skipped by the rate limit loses nothing; clusterctl's agent turns them
into tokens/s, FLOP/s and MFU (docs/users-guide.md, "Training metrics").  `loss` and `grad_norm` are
the values as of this step (the newest is reported, with its step); a NaN or infinite loss or norm is
reported as such (a user wants to see the loss went NaN).  A value may be a tensor: it is detached
and read (`float()`, which waits for the device) only when a report is written, at most once per
interval, not at every step.  A value that is not a count (negative, NaN or infinite tokens or FLOPs,
a negative gradient norm, something `float()` refuses) is left out and said once on stderr; training
carries on.
"""

from __future__ import annotations

import math
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
# Per (job dir, rank): what the program said of its training (tokens, FLOPs, loss, gradient norm).
_metrics: dict[tuple[str, int], _Tally] = {}
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


class _Tally:
    """One rank's training metrics: counters summed at every beat, the newest loss and norm as given
    (a tensor stays one until a report is written: reading it waits for the device)."""

    __slots__ = ("tokens", "flops", "loss", "loss_step", "grad_norm", "grad_norm_step", "loss_read",
                 "loss_read_step", "norm_read", "norm_read_step")

    def __init__(self) -> None:
        self.tokens = self.flops = 0.0
        self.loss: object = None
        self.grad_norm: object = None
        self.loss_step = self.grad_norm_step = 0
        self.loss_read: float | None = None
        self.norm_read: float | None = None
        self.loss_read_step: int | None = None
        self.norm_read_step: int | None = None

    def read(self) -> None:
        """Turn the newest loss and norm into numbers (in the training loop's thread: once per report)."""
        if self.loss is not None:
            value = _number("loss", self.loss)
            if value is not None:
                self.loss_read, self.loss_read_step = value, self.loss_step
            self.loss = None
        if self.grad_norm is not None:
            value = _number("grad_norm", self.grad_norm)
            if value is not None and not value >= 0 and not math.isnan(value):
                _say_once_about("grad_norm", f"grad_norm={value!r} is not a norm (negative); not reported")
            elif value is not None:
                self.norm_read, self.norm_read_step = value, self.grad_norm_step
            self.grad_norm = None

    def fill(self, record: RankProgress) -> RankProgress:
        """`record` with these metrics (as last read)."""
        return replace(record, tokens=self.tokens, flops=self.flops, loss=self.loss_read,
                       loss_step=self.loss_read_step, grad_norm=self.norm_read, grad_norm_step=self.norm_read_step)


def _number(name: str, value: object) -> float | None:
    """`value` as a float (NaN and infinities as math's own, so records compare equal); None, said once,
    when float() refuses it."""
    try:
        number = value if type(value) is float else float(value)  # type: ignore[arg-type]
    except Exception as exc:  # a tensor of several values, a string: the program's, so anything
        _say_once_about(name, f"{name}={str(value)[:40]!r} is not a number ({exc.__class__.__name__}); not reported")
        return None
    if math.isfinite(number):
        return number
    return math.nan if math.isnan(number) else math.inf if number > 0 else -math.inf


def _count(name: str, value: object) -> float | None:
    """A token or FLOP count as a number; None, said once, for what is not one (negative, NaN, infinite)."""
    number = value if type(value) is int or type(value) is float else _number(name, value)
    if number is None or 0 <= number < math.inf:
        return number
    _say_once_about(name, f"{name}={number!r} is not a count (negative, NaN or infinite); not counted")
    return None


def _detached(value: object) -> object:
    """A loss or norm to keep until the next report: a tensor detached (its graph is not kept alive by us);
    it is read (float()) when a report is written."""
    if type(value) is float or type(value) is int:
        return value
    detach = getattr(value, "detach", None)
    return detach() if callable(detach) else value


def _tally(key: tuple[str, int], step: int, tokens: object, flops: object, loss: object, grad_norm: object) -> None:
    """Add this beat's metrics to the rank's; a value that is not one is said once and left out."""
    tally = _metrics.get(key)
    if tally is None:
        tally = _metrics[key] = _Tally()
    if tokens is not None and (counted := _count("tokens", tokens)) is not None:
        tally.tokens += counted
    if flops is not None and (counted := _count("flops", flops)) is not None:
        tally.flops += counted
    if loss is not None:
        tally.loss, tally.loss_step = _detached(loss), step
    if grad_norm is not None:
        tally.grad_norm, tally.grad_norm_step = _detached(grad_norm), step


def transformer_flops(params: float, tokens: float) -> float:
    """The FLOPs of training a dense transformer of `params` parameters on `tokens` tokens (forward and
    backward): 6 x params x tokens (Kaplan et al., "Scaling Laws for Neural Language Models", 2020; the
    attention term, 12 x layers x hidden x sequence per token, left out, as most MFU figures do)."""
    return 6.0 * float(params) * float(tokens)


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
            tally = _metrics.get(key)  # its counters only: the loss is read in the training loop's thread
            _write(key, replace(record, compute_s=round(total, 6), compute_steps=steps, alive_at=time.time(),
                                tokens=tally.tokens if tally is not None else record.tokens,
                                flops=tally.flops if tally is not None else record.flops))
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


def _say_once_about(what: str, message: str) -> None:
    """A bad value the program passed: said once per job and kind of value."""
    said = f"{_report_dir(os.environ) or ''}\0{what}"
    if said not in _complained_about:
        _complained_about.add(said)
        print(f"clusterctl.progress: {message} (said once per job); training continues", file=sys.stderr, flush=True)


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


def beat(step: int, phase: str = "step", *, compute_seconds: float | None = None, tokens: float | None = None,
         flops: float | None = None, loss: object = None, grad_norm: object = None,
         min_interval: float | None = None) -> None:
    """Report that this rank reached `step` and is in `phase` ("startup", "step", "checkpoint-save",
    "checkpoint-load"), and optionally how long it computed in this step (`compute_seconds`), the tokens
    and FLOPs it processed in this step (its share; summed), and the loss and gradient norm as of this
    step (numbers or tensors; see the module's docstring).

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
        if tokens is not None or flops is not None or loss is not None or grad_norm is not None:
            try:
                _tally(key, int(step), tokens, flops, loss, grad_norm)
            except Exception as exc:  # a tensor whose detach() fails, say: the report goes on without it
                _say_once_about("metrics", f"training metrics not taken ({exc.__class__.__name__}: {exc})")
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
        record = RankProgress(rank, node, int(step), phase, now_epoch, os.getpid(), round(total, 6), steps, now_epoch)
        tally = _metrics.get(key)
        if tally is not None:
            tally.read()
            record = tally.fill(record)
        _write(key, record)
        _start_liveness(key, _interval(min_interval))
    except OSError as exc:
        _say_once(f"cannot write the progress report in {_report_dir(os.environ)} ({exc})")
    except Exception as exc:  # the contract: a progress report never breaks training
        _say_once(f"progress report failed ({exc.__class__.__name__}: {exc})")
