"""Shared storage that hangs or fails: a small file written, fsynced, read back and unlinked on each path.

A hung Lustre/NFS mount on one node stalls every checkpoint of the job (each rank waits for the
slowest), and it shows nowhere else: free space and read-only state read fine from the client's cache.
So healthd does what a checkpoint does, on a small file: open, write, fsync, read, unlink.

The probe runs on a worker thread and healthd waits for it at most `storage_timeout_s`: a thread stuck
in the kernel on a hung mount cannot be killed (a subprocess could not either: it would sit in D state),
so a path whose last probe has not come back gets no new one; it is reported hung on every pass, with
how long it has been, until that probe returns.  At most one thread per configured path is ever stuck.

Default deadline 5 s: a healthy mount answers a 4 KiB write+fsync in milliseconds, a busy metadata
server in well under a second; a client that waits 5 s for it is a checkpoint that waits minutes.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clusterctl.healthd.checks.family import CheckFamily, Condition, limit
from clusterctl.healthd.findings import Action, Finding

PAYLOAD = b"clusterctl healthd storage probe\n" * 128  # 4 KiB


@dataclass(frozen=True)
class StorageLimits:
    """[checks] limits of this family."""

    storage_timeout_s: float = limit(5, 0.1, 600.0)


def probe_once(path: str) -> None:
    """Write, fsync, read back and unlink a small file in directory `path`; OSError on any failure."""
    name = os.path.join(path, f".healthd-probe-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, PAYLOAD)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        with open(name, "rb") as read_back:
            if read_back.read() != PAYLOAD:
                raise OSError(f"read back {name}: not what was written")
    finally:
        os.unlink(name)


class _Probe:
    def __init__(self, path: str, started: float, run: Callable[[str], None]) -> None:
        self.path, self.started, self.error = path, started, ""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(run,), name=f"storage-probe {path}", daemon=True)
        self.thread.start()

    def _run(self, run: Callable[[str], None]) -> None:
        try:
            run(self.path)
        except OSError as exc:
            self.error = f"{exc.strerror or exc}" + (f" ({exc.filename})" if getattr(exc, "filename", None) else "")
        finally:
            self.done.set()


class StorageProbe:
    """Probes each path on its own thread with a deadline; remembers a probe that has not come back."""

    def __init__(self, monotonic: Callable[[], float], run: Callable[[str], None] = probe_once) -> None:
        self.monotonic, self.run = monotonic, run
        self._stuck: dict[str, _Probe] = {}

    def check(self, paths: Sequence[str], limits: StorageLimits, now: float) -> list[Finding]:
        """Probe every path (together: one deadline for all of them); a finding for each that hung or failed.

        A path whose earlier probe is still stuck is reported at once, without waiting again: a hung
        mount costs the periodic pass its deadline once, not on every pass."""
        started = self.monotonic()
        fresh, out = [], []
        for path in paths:
            stuck = self._stuck.get(path)
            if stuck is not None and not stuck.done.is_set():
                out.append(self._hung(stuck, limits, now))
                continue
            self._stuck.pop(path, None)
            fresh.append(_Probe(path, started, self.run))
        deadline = started + limits.storage_timeout_s
        for probe in fresh:
            if not probe.done.wait(max(0.0, deadline - self.monotonic())):
                self._stuck[probe.path] = probe
                out.append(self._hung(probe, limits, now))
            elif probe.error:
                out.append(Finding("storage-error", "storage", now, value=probe.path,
                                   detail=f"{probe.path} probe failed: {probe.error}"))
        return sorted(out, key=lambda finding: paths.index(str(finding.value)))

    def _hung(self, probe: _Probe, limits: StorageLimits, now: float) -> Finding:
        waited = self.monotonic() - probe.started
        return Finding("storage-hung", "storage", now, value=probe.path,
                       detail=f"{probe.path} write/fsync/read/unlink not done after {waited:.1f} s "
                              f"> {limits.storage_timeout_s:g} s")


FAMILY = CheckFamily("storage", ("storage-hung", "storage-error"), (
    Condition("storage-hung", Action.DRAIN_REBOOT, "a shared path's probe (write, fsync, read, unlink) did not "
                                                   "finish by its deadline: a hung mount (a reboot clears it)",
              evidence_in_reason=True),
    Condition("storage-error", Action.DRAIN_RESET, "a shared path's probe (write, fsync, read, unlink) failed",
              evidence_in_reason=True),
))
