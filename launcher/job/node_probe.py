"""The agent's own look at a suspected node: can a TCP connection reach its slurmd port?

The node's kernel answers a connection attempt (accepts it, or refuses it when slurmd is down)
within a millisecond on the job's network, however loaded the node is; a node powered off, whose
kernel panicked or whose link is cut answers nothing, or the network says it is unreachable.  One
probe is one connection attempt (closed at once, nothing sent), in a thread of its own so that
the agent's loop never waits for it; only suspected nodes are probed (launcher/pure/reachability.py),
a handful at a time, so a probe costs slurmd one accepted connection.
"""

from __future__ import annotations

import errno
import queue
import socket
import threading
import time
from collections.abc import Callable

from clusterctl.launcher.pure.reachability import PROBE_TIMEOUT_SECONDS, ProbeResult

DEFAULT_SLURMD_PORT = 6818
"""Slurm's SlurmdPort when slurm.conf does not set one (slurm.conf(5))."""
MAX_IN_FLIGHT = 64
"""Probes running at once; more suspected nodes than this wait for a free slot."""
_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ETIMEDOUT}


def probe_once(node: str, port: int, timeout: float = PROBE_TIMEOUT_SECONDS) -> tuple[bool | None, str]:
    """Whether `node`'s kernel answers a TCP connection to `port` within `timeout`, and how it answered."""
    try:
        address = socket.getaddrinfo(node, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    except (socket.gaierror, UnicodeError) as exc:
        return None, f"its name does not resolve here ({exc})"
    started = time.monotonic()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except ConnectionRefusedError:
            return True, f"port {port} refused in {1000 * (time.monotonic() - started):.1f} ms: the node is up"
        except TimeoutError:
            return False, f"no answer from {address[0]}:{port} within {timeout:g} s"
        except OSError as exc:
            if exc.errno in _UNREACHABLE:
                return False, f"{address[0]}:{port}: {exc.strerror}"
            return None, f"{address[0]}:{port}: {exc.strerror or exc}"
    return True, f"port {port} answered in {1000 * (time.monotonic() - started):.1f} ms"


class NodeProber:
    """Probes run in threads; their results are collected without waiting."""

    def __init__(self, port: int, monotonic: Callable[[], float] = time.monotonic,
                 probe: Callable[[str, int], tuple[bool | None, str]] = probe_once) -> None:
        self.port, self.monotonic, self.probe = port, monotonic, probe
        self.results: queue.SimpleQueue[ProbeResult] = queue.SimpleQueue()
        self.in_flight: set[str] = set()
        self.lock = threading.Lock()

    def start(self, node: str) -> bool:
        """Start probing `node` unless a probe of it runs already or MAX_IN_FLIGHT do; whether it started."""
        with self.lock:
            if node in self.in_flight or len(self.in_flight) >= MAX_IN_FLIGHT:
                return False
            self.in_flight.add(node)
        threading.Thread(target=self._run, args=(node,), name=f"probe {node}", daemon=True).start()
        return True

    def _run(self, node: str) -> None:
        try:
            answered, detail = self.probe(node, self.port)
        except Exception as exc:  # noqa: BLE001 - a probe that broke says so; it never takes the agent down
            answered, detail = None, f"the probe failed ({exc.__class__.__name__}: {exc})"
        with self.lock:
            self.in_flight.discard(node)
        self.results.put(ProbeResult(node, self.monotonic(), answered, detail))

    def finished(self) -> list[ProbeResult]:
        """The probes that ended since the last call."""
        done = []
        while True:
            try:
                done.append(self.results.get_nowait())
            except queue.Empty:
                return done
