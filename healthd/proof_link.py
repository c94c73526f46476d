"""The built-in link test: TCP ping-pong and bandwidth between the two tasks of a `healthd prove` job.

Runs on both nodes as `python -m clusterctl.healthd link-test` (one task per node, started by srun; needs
no GPU and nothing beyond the standard library).  Task 1 listens, task 0 connects to task 1's node, sends
`pings` 8-byte messages each answered at once (latency: half the median round trip), then `size` bytes
answered by one byte when all have arrived (bandwidth), and prints one JSON line: what
`proof_verdict.read_link_test` reads.  Each socket call is bounded by the test's deadline.
"""

from __future__ import annotations

import json
import socket
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from clusterctl.slurm.hostlist import expand

PING = 8
CHUNK = 1 << 20
DEFAULT_PORT_BASE = 29400
"""The port is this plus the job id modulo 1000, unless given: two proofs at once do not share one."""


class Link(Protocol):
    """One connected stream (a socket; tests pass one end of a socketpair)."""

    def sendall(self, data: bytes, /) -> None: ...

    def recv_into(self, buffer: memoryview, nbytes: int = 0, /) -> int: ...


@dataclass(frozen=True)
class LinkResult:
    bandwidth_gbs: float
    latency_us: float
    size: int
    pings: int

    def line(self) -> str:
        """The one line task 0 prints."""
        return json.dumps({"kind": "healthd-link-test", "bandwidth_gbs": round(self.bandwidth_gbs, 6),
                           "latency_us": round(self.latency_us, 3), "bytes": self.size, "pings": self.pings})


class LinkTestError(Exception):
    """The test could not run (no peer, a closed connection, no answer in time)."""


def _receive(link: Link, count: int, buffer: memoryview) -> None:
    """Read exactly `count` bytes (into `buffer`, reused)."""
    while count > 0:
        got = link.recv_into(buffer, min(count, len(buffer)))
        if got == 0:
            raise LinkTestError("the peer closed the connection during the test")
        count -= got


def measure(link: Link, size: int, pings: int, clock: Callable[[], float] = time.perf_counter) -> LinkResult:
    """Task 0's side: ping-pong, then the bandwidth transfer."""
    buffer = memoryview(bytearray(CHUNK))
    rounds = []
    message = b"p" * PING
    for _ in range(pings):
        began = clock()
        link.sendall(message)
        _receive(link, PING, buffer)
        rounds.append(clock() - began)
    payload = bytes(CHUNK)
    began = clock()
    left = size
    while left > 0:
        part = min(left, CHUNK)
        link.sendall(payload[:part] if part < CHUNK else payload)
        left -= part
    _receive(link, 1, buffer)
    seconds = max(clock() - began, 1e-9)
    latency = statistics.median(rounds) / 2 * 1e6 if rounds else float("nan")
    return LinkResult(size / seconds / 1e9, latency, size, pings)


def answer(link: Link, size: int, pings: int) -> None:
    """Task 1's side: echo each ping, take the transfer, acknowledge it."""
    buffer = memoryview(bytearray(CHUNK))
    for _ in range(pings):
        _receive(link, PING, buffer)
        link.sendall(bytes(buffer[:PING]))
    _receive(link, size, buffer)
    link.sendall(b"k")


def link_port(env: Mapping[str, str], port: int) -> int:
    """The port to use: `port` when given (non-zero), else derived from the job id."""
    if port:
        return port
    job = env.get("SLURM_JOB_ID", "0")
    return DEFAULT_PORT_BASE + (int(job) % 1000 if job.isdigit() else 0)


def run_link_test(env: Mapping[str, str], *, port: int, size: int, pings: int, timeout: float) -> LinkResult | None:
    """One task of the test, its rank and peer from Slurm's environment; task 0's result (None on task 1).

    LinkTestError when it cannot run."""
    rank = env.get("SLURM_PROCID", "")
    nodes = expand(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
    if rank not in ("0", "1") or len(nodes) != 2:
        raise LinkTestError("run it as two tasks on two nodes (srun -N2 -n2 --ntasks-per-node=1): "
                            f"SLURM_PROCID={rank!r}, {len(nodes)} node(s) in the step")
    port = link_port(env, port)
    deadline = time.monotonic() + timeout
    try:
        if rank == "1":
            with socket.create_server(("", port)) as server:
                server.settimeout(timeout)
                conn, _ = server.accept()
                with conn:
                    conn.settimeout(max(deadline - time.monotonic(), 0.1))
                    answer(conn, size, pings)
            return None
        with _connect(nodes[1], port, deadline) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each ping leaves at once (no Nagle)
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            return measure(conn, size, pings)
    except OSError as exc:
        raise LinkTestError(f"{nodes[1]}:{port}: {exc.strerror or exc}") from None


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """Connect, retrying while the peer's task has not started listening yet (refused), until the deadline."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.1))
        except ConnectionRefusedError:
            if time.monotonic() >= deadline - 0.5:
                raise
            time.sleep(0.2)
