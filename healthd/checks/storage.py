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

A probe is four metadata operations on the shared filesystem (create, write+fsync, read, unlink), so it
runs every `storage_interval_s` (20 min), not on every periodic pass: 12,500 nodes then send ~10 probes a
second to the metadata server, not ~830.  Each node has its own place in the interval (`probe_phase`, a hash
of its name, fixed against the wall clock), so a fleet restarted at once never probes in step.  Between
probes the last result stands: a path that failed is reported on every pass until a probe passes, and a
path whose probe is stuck is reported hung on every pass, as soon as healthd knows it.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from clusterctl.healthd.checks.family import CheckFamily, Condition, limit
from clusterctl.healthd.findings import Action, Finding

PAYLOAD = b"clusterctl healthd storage probe\n" * 128  # 4 KiB


@dataclass(frozen=True)
class StorageLimits:
    """[checks] limits of this family."""

    storage_timeout_s: float = limit(5, 0.1, 600.0)
    # 20 min: 12,500 nodes / 1,200 s = 10.4 probes (42 metadata operations) a second, fleet-wide.  Never below
    # the default periodic pass (probing more often than healthd looks means nothing); at most a day.
    storage_interval_s: float = limit(1200, 15.0, 86400.0)


def probe_phase(node: str) -> float:
    """Where in every storage interval node `node` probes, as a share of it (0 <= phase < 1).

    A hash of the name (SHA-256, not Python's salted `hash`): the same on every start of healthd, and
    spread evenly over a fleet's names, so nodes restarted together still probe at their own times."""
    return int.from_bytes(hashlib.sha256(node.encode("utf-8", "surrogateescape")).digest()[:8], "big") / 2.0**64


def seconds_to_slot(phase: float, interval: float, wall_now: float) -> float:
    """Seconds from `wall_now` (epoch s) to the node's next probe: its slots are phase*interval + k*interval."""
    return (phase * interval - wall_now) % interval


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
    """Probes each path on its own thread with a deadline, at this node's times in every storage interval;
    remembers a probe that has not come back and the last result of each path."""

    def __init__(self, monotonic: Callable[[], float], run: Callable[[str], None] = probe_once, *,
                 node: str = "") -> None:
        self.monotonic, self.run = monotonic, run
        self.phase = probe_phase(node)
        self._stuck: dict[str, _Probe] = {}
        self._standing: dict[str, Finding] = {}
        self._due: float | None = None  # monotonic time of the next probe
        self._interval = 0.0

    def check(self, paths: Sequence[str], limits: StorageLimits, now: float) -> list[Finding]:
        """A finding for each path that hung or failed: probed (together: one deadline for all of them) when
        this node's slot has come, else its last result (re-dated `now`: it still holds).

        A path whose earlier probe is still stuck is reported hung at once on every pass, without waiting
        again: a hung mount costs the periodic pass its deadline once, not on every pass.  A path whose stuck
        probe has come back is probed again at once (its result says whether the mount recovered)."""
        started = self.monotonic()
        due = self._slot_come(limits.storage_interval_s, now, started)
        self._standing = {path: finding for path, finding in self._standing.items() if path in paths}
        fresh, out = [], []
        for path in paths:
            stuck = self._stuck.get(path)
            if stuck is not None and not stuck.done.is_set():
                out.append(self._hung(stuck, limits, now))
            elif self._stuck.pop(path, None) is not None or due:
                fresh.append(_Probe(path, started, self.run))
            elif path in self._standing:
                out.append(replace(self._standing[path], at=now))
        deadline = started + limits.storage_timeout_s
        for probe in fresh:
            self._standing.pop(probe.path, None)
            if not probe.done.wait(max(0.0, deadline - self.monotonic())):
                self._stuck[probe.path] = probe
                out.append(self._hung(probe, limits, now))
            elif probe.error:
                self._standing[probe.path] = Finding("storage-error", "storage", now, value=probe.path,
                                                     detail=f"{probe.path} probe failed: {probe.error}")
                out.append(self._standing[probe.path])
        return sorted(out, key=lambda finding: paths.index(str(finding.value)))

    def _slot_come(self, interval: float, wall_now: float, monotonic_now: float) -> bool:
        """Whether this node's probe is due now; if so, the next one is set a whole interval on.

        The slot is placed on the wall clock once (and again when the interval changes on a reload), then
        kept on the monotonic clock: a wall-clock step never makes a node skip or repeat its probe."""
        if self._due is None or interval != self._interval:
            self._interval = interval
            self._due = monotonic_now + seconds_to_slot(self.phase, interval, wall_now)
        if monotonic_now < self._due:
            return False
        missed = (monotonic_now - self._due) // interval  # a pass held up (a hung NVML) skips slots, never bunches them
        self._due += (missed + 1) * interval
        return True

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
