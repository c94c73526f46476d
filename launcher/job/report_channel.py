"""The node reports' channel: UDP datagrams from each node's reporter to the job's agent.

UDP because a report is one small datagram that supersedes the previous one: a lost report is
replaced by the next, a reporter never waits for an agent that is away (sendto on a non-blocking
socket returns at once), and an agent that starts again takes the next reports as they come,
with no connection for either side to re-establish.  What one datagram holds and how it is
signed is clusterctl.records.node_report.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from dataclasses import dataclass, field

from clusterctl.launcher.job.name_cache import NameCache
from clusterctl.records.node_report import MAX_DATAGRAM, NodeReport, ReportRefused, decode, encode

RECEIVE_BUFFER = 8 << 20
"""Bytes the kernel may queue for the inbox between two drains (a burst of 12,500 reports is ~20 MB at
1.5 KB each; the kernel caps this at net.core.rmem_max, and what it drops the next heartbeat replaces)."""
DRAIN_DATAGRAMS = 2048
"""The most datagrams one drain reads: the rest wait in the kernel's queue for the next turn.  Junk is refused
in ~5 µs (its signature fails before anything is parsed): 2,048 of it is ~10 ms."""
DRAIN_SECONDS = 0.05
"""About the most CPU time one drain spends (s, this thread's: time.thread_time).  The agent's loop sleeps
STEP_POLL_SECONDS (0.2 s) between turns, so a flood costs it at most a fifth of a core (50 ms of every 250; the
datagram bound makes it ~5% at ~5 µs a refusal) and the watches, summaries and Slurm questions go on.  Honest
reports cost ~65 µs each (the compact format, on a loaded core): 50 ms takes ~770 a turn, ~3,000 a second, nearly 5 times the 625 a second
of 12,500 nodes on a 20 s heartbeat.  CPU time, not the wall clock: on a node busy with training, other
processes' time would eat a wall-clock budget and cut what the agent reads of honest reports (measured:
bench/abuse_bench.py, docs/measured.md), while what a flood takes from the agent is its own CPU."""
CLOCK_EVERY = 32
"""Datagrams read between two looks at the CPU clock (a look is a system call, ~1 µs; a refusal ~5 µs)."""


@dataclass
class ReportInbox:
    """The agent's end: a bound UDP socket, drained without blocking."""

    key: bytes
    host: str = "0.0.0.0"
    port: int = 0
    sock: socket.socket = field(init=False)
    refused: Counter[str] = field(default_factory=Counter)
    """Datagrams refused so far, by kind (unsigned, foreign, too large, unreadable, malformed)."""
    last_refusal: dict[str, str] = field(default_factory=dict)
    """The latest refusal's message, by kind."""
    received: int = 0
    """Datagrams read so far (accepted and refused)."""
    received_bytes: int = 0
    cut_short: bool = False
    """The last drain stopped at its bound with datagrams still waiting (a burst, or a flood)."""
    drains_cut_short: int = 0
    """Drains so far that stopped at their bound."""

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        except OSError:
            pass  # the kernel's default buffer: bursts beyond it wait for the next heartbeat
        self.sock.bind((self.host, self.port))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def fileno(self) -> int:
        """The socket's descriptor (to wait on with select)."""
        return self.sock.fileno()

    def drain(self, limit: int = DRAIN_DATAGRAMS, seconds: float = DRAIN_SECONDS) -> list[NodeReport]:
        """The reports waiting now, oldest first, reading at most `limit` datagrams and for about `seconds` of
        CPU time (accepted or refused alike: a flood of junk cannot hold the caller); what is left is read by the next
        call, and `cut_short` says there was more.  Refused datagrams are counted in `refused`, by kind."""
        reports: list[NodeReport] = []
        deadline = time.thread_time() + seconds
        self.cut_short = False
        for read in range(1, limit + 1):
            try:
                datagram, peer = self.sock.recvfrom(MAX_DATAGRAM + 1)
            except OSError:  # BlockingIOError: nothing more waits now
                break
            self.received += 1
            self.received_bytes += len(datagram)
            try:
                reports.append(decode(datagram, self.key, f"report from {peer[0]}:{peer[1]}"))
            except ReportRefused as exc:
                self.refused[exc.kind] += 1
                self.last_refusal[exc.kind] = str(exc)
            if read % CLOCK_EVERY == 0 and time.thread_time() >= deadline:
                self.cut_short = True
                break
        else:
            self.cut_short = True
        if self.cut_short:
            self.drains_cut_short += 1
        return reports

    def close(self) -> None:
        """Stop receiving."""
        self.sock.close()


class ReportSender:
    """A reporter's end: sends signed reports to the agent, never blocking, never raising."""

    def __init__(self, key: bytes, address: tuple[str, int]) -> None:
        self.key, self.address = key, address
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.names = NameCache()
        self.names.address(address[0])  # looked up now, off the loop: known by the first report
        self.sent = 0
        self.failed = 0
        self.last_error = ""

    def send(self, report: NodeReport) -> bool:
        """Send `report`; False (with `last_error`) when it could not leave now: the next one replaces it."""
        try:
            datagram = encode(report, self.key)
            host = self.names.address(self.address[0])
            if host is None:
                self.failed += 1
                self.last_error = (f"{self.address[0]} does not resolve" if self.address[0] in self.names.unresolved()
                                   else f"looking {self.address[0]} up")
                return False
            self.sock.sendto(datagram, (host, self.address[1]))
        except (OSError, ValueError) as exc:
            self.failed += 1
            self.last_error = f"{exc.__class__.__name__}: {exc}"
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        """Stop sending."""
        self.sock.close()


def parse_address(text: str) -> tuple[str, int]:
    """`host:port` → (host, port); ValueError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return host, int(port)
