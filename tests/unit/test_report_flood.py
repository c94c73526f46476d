"""A flood of junk at the agent's report port cannot hold the agent: each drain of the real UDP inbox
reads a bounded number of datagrams, the refused ones are counted by kind, the agent's summary says it
is refusing junk, and honest reports keep getting through on the next turns.

The flooder is another user (a forked child that became `nobody`, uid 65534) on the same node, as in
the attack of issue 40: it learns the port from /proc/net/udp and sends as fast as it can.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from clusterctl.launcher.job.report_channel import ReportInbox, ReportSender
from clusterctl.launcher.job.signal_watch import junk_text
from clusterctl.records.node_report import MAGIC, NodeReport

KEY = bytes(range(32))
STRANGER = 65534
MOST_ONE_DRAIN_READS = 4096
"""What one drain may read at most for the agent's loop to go on (the bound chosen is half this)."""


def report(seq: int) -> NodeReport:
    return NodeReport(job_id="7", launch="0", node="gpu00001", seq=seq, sent_at=1_700_000_000.0 + seq)


@contextmanager
def flooding(port: int) -> Iterator[int]:
    """Another user floods 127.0.0.1:`port` with junk (unsigned datagrams, and reports signed with a key that is
    not the job's) until the block ends; yields the flooder's pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(STRANGER)
                os.setuid(STRANGER)
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            unsigned = MAGIC + bytes(32) + b'{"kind":"node-report"}'
            forged = os.urandom(1400)
            stop = time.monotonic() + 60  # a bound should the parent never end it
            while time.monotonic() < stop:
                for datagram in (unsigned, forged) * 500:
                    try:
                        sock.sendto(datagram, ("127.0.0.1", port))
                    except OSError:
                        pass  # the queue is full: send on
        finally:
            os._exit(0)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def still_running(pid: int) -> bool:
    return os.waitpid(pid, os.WNOHANG) == (0, 0)


def test_one_drain_under_a_flood_returns_with_the_flood_still_going_and_honest_reports_get_through() -> None:
    inbox = ReportInbox(KEY, "127.0.0.1")
    honest = ReportSender(KEY, ("127.0.0.1", inbox.port))
    try:
        with flooding(inbox.port) as flooder:
            while not inbox.refused:  # the flood has begun
                assert not inbox.drain()
                time.sleep(0.01)
            before = inbox.received
            assert inbox.drain() == []
            read = inbox.received - before
            assert 0 < read <= MOST_ONE_DRAIN_READS and inbox.cut_short and still_running(flooder)

            got: list[NodeReport] = []
            for turn in range(1, 500):  # the agent's turns: drain, then wait; an honest report each 10 ms
                got += inbox.drain()
                if got:
                    break
                for _ in range(5):
                    honest.send(report(turn))
                    time.sleep(0.01)
            assert got and got[0].node == "gpu00001" and still_running(flooder)
        assert inbox.refused["foreign"] > 0 and inbox.refused["unsigned"] > 0
        assert set(inbox.refused) <= {"foreign", "unsigned"} and inbox.drains_cut_short >= 1
    finally:
        honest.close()
        inbox.close()


def test_after_the_flood_the_inbox_reads_every_honest_report_again() -> None:
    inbox = ReportInbox(KEY, "127.0.0.1")
    honest = ReportSender(KEY, ("127.0.0.1", inbox.port))
    try:
        with flooding(inbox.port):
            while not inbox.refused:
                inbox.drain()
                time.sleep(0.01)
        while inbox.drain() or inbox.cut_short:  # what the flood left in the queue
            pass
        for step in range(20):
            honest.send(report(step))
        got: list[NodeReport] = []
        deadline = time.monotonic() + 10
        while len(got) < 20 and time.monotonic() < deadline:
            got += inbox.drain()
        assert [r.seq for r in got] == list(range(20))
    finally:
        honest.close()
        inbox.close()


@pytest.mark.parametrize(("refused", "cut_short", "said"), [
    (0, 0, ""),
    (0, 3, ""),  # a burst of honest reports: nothing refused, nothing to say
    (12, 0, "refusing junk datagrams: 12 since the last summary"),
    (250_000, 40, "refusing junk datagrams: 250,000 since the last summary, more than the agent reads (40 reads "
                  "stopped at their bound): node reports may be lost; someone sends to the agent's report port"),
])
def test_the_agent_summary_says_when_it_is_refusing_junk(refused: int, cut_short: int, said: str) -> None:
    assert junk_text(refused, cut_short) == said
