"""The agent's ear: node reports from the step's reporters, taken without blocking and judged.

One `SignalWatch` per launched step: `poll()` drains the inbox (clusterctl.launcher.job.
report_channel: UDP, signed per job) and returns what the reports say now (launcher/pure/
node_signals.py); `records()` are the ranks' newest progress records for the hang and straggler
watches; `holdings()` the nodes' newest checkpoint holdings (multi-level checkpoints).  What it costs: one recvfrom and ~70 µs of checking and parsing per report; at 12,500
nodes and a 20 s heartbeat, 625 reports a second (docs/measured.md).  Nothing here touches Slurm
or shared storage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from clusterctl.launcher.pure.node_signals import NodeSignals, SignalPolicy, Signals
from clusterctl.records.checkpoint_holdings import CheckpointHoldings
from clusterctl.records.node_report import NodeReport
from clusterctl.records.rank_progress import RankProgress


class Inbox(Protocol):
    """Where reports arrive (report_channel.ReportInbox, or a test's fake)."""

    @property
    def port(self) -> int:
        """The UDP port the reporters send to."""

    @property
    def refused(self) -> Mapping[str, int]:
        """Datagrams refused so far, by kind."""

    def drain(self, limit: int = ...) -> list[NodeReport]: ...


class SignalWatch:
    """The node reports of one launched step."""

    def __init__(self, inbox: Inbox, job_id: str, launch: str, nodes: Sequence[str], policy: SignalPolicy,
                 started_at: float, clock: Callable[[], float] = time.time) -> None:
        self.inbox, self.clock = inbox, clock
        self.signals = NodeSignals.start(policy, job_id, launch, nodes, started_at)
        self.received = 0

    @property
    def policy(self) -> SignalPolicy:
        """How the reports are judged."""
        return self.signals.policy

    def poll(self) -> Signals:
        """Take every report waiting now and judge what the step's nodes said."""
        reports = self.inbox.drain()
        now = self.clock()
        if reports:
            self.received += len(reports)
            self.signals = self.signals.observe(reports, now)
        return self.signals.judge(now)

    def holdings(self) -> dict[str, CheckpointHoldings]:
        """Each node's newest checkpoint holdings (see NodeSignals.holdings)."""
        return dict(self.signals.holdings)

    def records(self) -> tuple[RankProgress, ...]:
        """Every rank's newest progress record, from its node's newest report."""
        return self.signals.records()
