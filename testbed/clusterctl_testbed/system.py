"""The testbed's one door to the machine: running commands and handling processes.

Commands are argv lists with timeouts; nothing goes through a shell.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


class TestbedError(Exception):
    """Something the testbed could not do; the message says what and what to try."""


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run(argv: Sequence[str], *, timeout: float = 60, check: bool = True,
        env: dict[str, str] | None = None) -> CommandResult:
    """Run a command to completion; raise TestbedError when it fails and `check` is set."""
    if env is None:
        env = with_sbin(dict(os.environ))
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from exc
    except FileNotFoundError as exc:
        raise TestbedError(f"`{argv[0]}` is not installed; run `clusterctl-testbed install`") from exc
    result = CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise TestbedError(
            f"`{' '.join(argv)}` exited with {proc.returncode}: {(proc.stderr or proc.stdout).strip()}"
        )
    return result


def run_logged(argv: Sequence[str], log: Path, *, timeout: float, env: dict[str, str] | None = None,
               progress: Callable[[float, list[str]], None] | None = None, every: float = 60.0) -> None:
    """Run a long command (a build) to completion with its output appended to `log`, telling
    `progress` the elapsed seconds and the log's last lines every `every` seconds; TestbedError
    naming the log when it fails or outlives `timeout` (then it is killed, children and all)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
    except FileNotFoundError as exc:
        raise TestbedError(f"`{argv[0]}` is not installed; run `clusterctl-testbed install`") from exc
    started = time.monotonic()
    try:
        while True:
            try:
                returncode = proc.wait(timeout=min(every, max(0.1, started + timeout - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed >= timeout:
                    raise TestbedError(f"`{' '.join(argv)}` did not finish within {timeout:g} s; "
                                       f"its output is in {log}") from None
                if progress is not None:
                    progress(elapsed, tail(log, 60))
    finally:
        if proc.poll() is None:  # timed out, or this process was interrupted: the build goes too
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    if returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` exited with {returncode}; the end of its output, in {log}:\n"
                           + "\n".join(tail(log, 15)))


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a (possibly large) text file; [] when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            return f.read().decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def with_sbin(env: dict[str, str]) -> dict[str, str]:
    """The environment with the sbin directories on PATH (ip, ldconfig, munged live there;
    some root shells leave them out)."""
    parts = [p for p in env.get("PATH", "").split(":") if p]
    for extra in ("/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        if extra not in parts:
            parts.append(extra)
    return {**env, "PATH": ":".join(parts)}


def spawn(argv: Sequence[str], log: Path, *, env: dict[str, str] | None = None) -> int:
    """Start a long-running process in its own session, output appended to `log`; return its PID."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, env=env)
    return proc.pid


def is_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie (reaped daemons linger as zombies here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the command name, which is in parentheses and may hold spaces.
    return stat[stat.rindex(")") + 2] not in "ZX"


def kill_all(pids: Sequence[int], *, grace: float = 2.0) -> None:
    """SIGTERM the processes, then SIGKILL whatever is still alive after `grace` seconds."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if is_alive(pid):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        time.sleep(0.05)


def power_off(pids_now: Callable[[], Sequence[int]]) -> None:
    """SIGKILL every process `pids_now()` lists, again until it lists none alive (a process may fork
    between two reads): what a power loss does.  No SIGTERM first -- srun forwards a SIGTERM to its
    step's tasks on other nodes, which a dead node never does."""
    for _ in range(20):
        pids = [p for p in pids_now() if is_alive(p)]
        if not pids:
            return
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and any(is_alive(p) for p in pids):
            time.sleep(0.02)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for(predicate, *, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll `predicate` until it returns true; raise TestbedError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TestbedError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def namespace_pids(namespace: str) -> list[int]:
    """PIDs of every process in a named network namespace (`ip netns pids`)."""
    result = run(["ip", "netns", "pids", namespace], check=False, timeout=10)
    return [int(p) for p in result.stdout.split() if p.isdigit()]


def namespaces() -> list[str]:
    """Names of the network namespaces that exist (`ip netns list`)."""
    result = run(["ip", "netns", "list"], check=False, timeout=10)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
