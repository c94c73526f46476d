"""The agent's ear: node reports from the step's reporters, taken without blocking and judged.

One `SignalWatch` per launched step: `poll()` drains the inbox (clusterctl.launcher.job.
report_channel: UDP, signed per job) and returns what the reports say now (launcher/pure/
node_signals.py); `fresh_records()` are the ranks' progress records that changed since the last
take, for the hang and straggler watches; `holdings()` the nodes' newest checkpoint holdings (multi-level checkpoints); `training()`
the job's training metrics (launcher/pure/training_metrics.py), taken once per summary interval.  What it costs: one recvfrom and ~70 µs of checking and parsing per report; at 12,500
nodes and a 20 s heartbeat, 625 reports a second (docs/measured.md).  Nothing here touches Slurm
or shared storage.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from clusterctl.launcher.pure.node_signals import NodeSignals, SignalPolicy, Signals
from clusterctl.launcher.pure.training_metrics import TrainingMeter, job_peak, window_seconds
from clusterctl.records.agent_summary import TrainingMetrics
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
        self.meter = TrainingMeter(window_seconds(policy.heartbeat))
        self.quiet_until = -math.inf
        """No node heard from is silent before this (NodeSignals.quiet_until), as of the last look."""
        self.last_poll = -math.inf

    @property
    def policy(self) -> SignalPolicy:
        """How the reports are judged."""
        return self.signals.policy

    def poll(self) -> Signals:
        """Take every report waiting now and judge what the step's nodes said."""
        reports = self.inbox.drain()
        now = self.clock()
        if now < self.last_poll:
            self.quiet_until = -math.inf  # the clock stepped back: reports taken now may be older than those held
        self.last_poll = now
        if reports:
            self.received += len(reports)
            self.signals = self.signals.observe(reports, now)
        if now >= self.quiet_until:
            self.quiet_until = self.signals.quiet_until()
        return self.signals.judge(now, self.quiet_until)

    def holdings(self) -> dict[str, CheckpointHoldings]:
        """Each node's newest checkpoint holdings (see NodeSignals.holdings)."""
        return dict(self.signals.holdings)

    def records(self) -> tuple[RankProgress, ...]:
        """Every rank's newest progress record, from its node's newest report."""
        return self.signals.records()

    def fresh_records(self) -> tuple[RankProgress, ...]:
        """The progress records of the nodes heard from since the last call (NodeSignals.take_fresh)."""
        self.signals, records = self.signals.take_fresh()
        return records

    def training(self, gpus: int, peak_tflops: float | None) -> TrainingMetrics | None:
        """The job's training metrics now, from each node's newest report (None: the program reports none).
        `gpus`: the step's GPUs; `peak_tflops`: the spec's peak per GPU (None: from the GPU model the nodes
        name).  Call it once per summary interval: each call adds the nodes' new samples."""
        self.meter = self.meter.observe((node, heard.report.metrics, heard.at)
                                        for node, heard in self.signals.heard.items() if heard.report.metrics)
        return self.meter.reading(self.clock(), gpus, job_peak(peak_tflops, self.meter.gpu_names()))
