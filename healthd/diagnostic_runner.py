"""Running a diagnostic (the side effect; healthd/diagnostics.py judges its output).

The command runs from its argv list (no shell) in its own session, with a hard timeout: past it the
whole process group is killed (a dcgmi that hangs in the driver must not keep healthd or the prolog).
Its output is read on threads into bounded buffers, so a command that prints without end neither
blocks on a full pipe nor grows healthd's memory.  `DiagnosticWorker` runs them one at a time on their
own thread for the daemon (an r3 takes a quarter of an hour: never on the main thread).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, Protocol

from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.diagnostics import (
    OUTPUT_LIMIT, DiagnosticResult, Diagnostics, DiagnosticSpec, Level, default_diagnostics, excerpt, judge_run,
)
from clusterctl.healthd.gate import HOOK_PATH

log = logging.getLogger("healthd")

STDERR_LIMIT = 64 * 1024


class DiagnosticDoor(Protocol):
    """Runs one diagnostic and says what it came to (tests pass a fake)."""

    def __call__(self, spec: DiagnosticSpec, level: Level, timeout: float | None = None) -> DiagnosticResult: ...


def _drain(stream: IO[bytes], limit: int, into: bytearray) -> None:
    """Keep the first `limit` bytes of `stream`, read (and drop) the rest until it closes."""
    while chunk := stream.read(65536):
        room = limit - len(into)
        if room > 0:
            into += chunk[:room]


def run_diagnostic(spec: DiagnosticSpec, level: Level, timeout: float | None = None, *,
                   env: dict[str, str] | None = None, clock: Callable[[], float] = time.time) -> DiagnosticResult:
    """Run `spec` for at most `timeout` seconds (default: the spec's own) and judge it.

    Never raises for the command's sake: a command that cannot be started is an "error" result, one
    that does not finish in time a "timeout" (its process group killed)."""
    limit = spec.timeout if timeout is None else min(timeout, spec.timeout)
    began = time.monotonic()
    try:
        proc = subprocess.Popen(list(spec.argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=env)
    except OSError as exc:
        return DiagnosticResult(level, spec.name, "error", clock(), exit_code=None,
                                summary=f"cannot run {excerpt(spec.argv[0], 120)}: {exc.strerror or exc}")
    out, err = bytearray(), bytearray()
    assert proc.stdout is not None and proc.stderr is not None
    readers = [threading.Thread(target=_drain, args=(proc.stdout, OUTPUT_LIMIT, out), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, STDERR_LIMIT, err), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        code = proc.wait(timeout=max(limit, 0.0))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        for reader in readers:
            reader.join(1.0)
        seconds = time.monotonic() - began
        return DiagnosticResult(level, spec.name, "timeout", clock(), seconds, None,
                                f"no verdict within {limit:g} s (killed)", excerpt(_text(out) + _text(err)))
    for reader in readers:
        reader.join(5.0)  # a grandchild holding the pipe open must not hold us: it was read up to now
    seconds = time.monotonic() - began
    stdout, stderr = _text(out), _text(err)
    verdict = judge_run(spec, code, stdout)
    evidence = stdout if verdict.outcome == "pass" or not stderr.strip() else f"{stdout}\n{stderr}"
    return DiagnosticResult(level, spec.name, verdict.outcome, clock(), round(seconds, 3), code, verdict.summary,
                            excerpt(evidence))


def _text(data: bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:  # pragma: no cover - in D state: nothing more can be done
        log.warning("diagnostic %d did not exit after SIGKILL", proc.pid)


class DiagnosticWorker:
    """healthd's diagnostic thread: runs the levels the engine asks for, one at a time, and reports each result."""

    def __init__(self, door: DiagnosticDoor, *, stop: threading.Event,
                 report: Callable[[DiagnosticResult], None]) -> None:
        self.door, self.stop, self.report = door, stop, report
        self.requests: queue.Queue[tuple[Level, DiagnosticSpec]] = queue.Queue()

    def run(self) -> None:
        """The thread: each request run and reported.  It has no heartbeat: a run is bounded by its own timeout,
        and the watchdog must not restart healthd during a quarter-hour r3."""
        while not self.stop.is_set():
            try:
                level, spec = self.requests.get(timeout=0.5)
            except queue.Empty:
                continue
            log.info("diagnostic %s: running %s (timeout %g s)", level, spec.name, spec.timeout)
            result = self.door(spec, level)
            log.info("diagnostic %s: %s", level, result.describe())
            self.report(result)


def diagnostics_in_force(config: HealthdConfig, which: Callable[[str], str | None] | None = None) -> Diagnostics:
    """The diagnostics healthd and the prolog use: [diagnostics] when written, else DCGM's levels when
    `dcgmi` is installed (looked for on PATH and on the hooks' PATH: the prolog has none), else none."""
    search = os.pathsep.join(p for p in (os.environ.get("PATH", ""), HOOK_PATH) if p)
    return default_diagnostics(config.diagnostics, which or (lambda name: shutil.which(name, path=search)))
