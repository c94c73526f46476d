"""The agent's ear: node reports from the step's reporters, taken without blocking and judged.

One `SignalWatch` per launched step: `poll()` drains the inbox (clusterctl.launcher.job.
report_channel: UDP, signed per job) and returns what the reports say now (launcher/pure/
node_signals.py); `fresh_records()` are the ranks' progress records that changed since the last
take, for the hang and straggler watches; `holdings()` the nodes' newest checkpoint holdings (multi-level checkpoints); `training()`
the job's training metrics (launcher/pure/training_metrics.py), taken once per summary interval.  What it costs: one recvfrom and ~65 µs of checking and parsing per report (the compact format); at 12,500
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
from clusterctl.clock import utc
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, CopyRefusals
from clusterctl.records.node_report import NodeReport, RankColumns
from clusterctl.records.rank_progress import RankProgress


class Inbox(Protocol):
    """Where reports arrive (report_channel.ReportInbox, or a test's fake)."""

    @property
    def port(self) -> int:
        """The UDP port the reporters send to."""

    @property
    def refused(self) -> Mapping[str, int]:
        """Datagrams refused so far, by kind."""

    @property
    def drains_cut_short(self) -> int:
        """Drains so far that stopped at their bound with datagrams still waiting."""

    def drain(self, limit: int = ...) -> list[NodeReport]: ...


class SignalWatch:
    """The node reports of one launched step."""

    def __init__(self, inbox: Inbox, job_id: str, launch: str, nodes: Sequence[str], policy: SignalPolicy,
                 started_at: float, clock: Callable[[], float] = time.time) -> None:
        self.inbox, self.clock = inbox, clock
        self.signals = NodeSignals.start(policy, job_id, launch, nodes, started_at)
        self.received = 0
        self.meter = TrainingMeter(window_seconds(policy.heartbeat))
        self._junk_seen = (sum(inbox.refused.values()), inbox.drains_cut_short)
        self._copy_refusals_seen: dict[str, CopyRefusals] = {}
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

    def refusing(self) -> str:
        """What the inbox refused since the last call, for the agent's summary ("" when nothing was)."""
        now = (sum(self.inbox.refused.values()), self.inbox.drains_cut_short)
        refused, cut_short = now[0] - self._junk_seen[0], now[1] - self._junk_seen[1]
        self._junk_seen = now
        return junk_text(refused, cut_short)

    def copies_refusing(self) -> str:
        """The nodes whose checkpoint copy servers refused connections, for the agent's summary: those whose
        count changed since the last call ("" when none did).  The counts ride the nodes' holdings in their
        reports (one pass over the nodes' newest holdings per summary)."""
        grown = []
        for node, held in self.signals.holdings.items():
            refused = held.copies_refused
            if refused is not None and refused != self._copy_refusals_seen.get(node):
                self._copy_refusals_seen[node] = refused
                grown.append((node, refused))
        return copy_refusals_text(grown)

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

    def fresh_columns(self) -> tuple[RankColumns, ...]:
        """`fresh_records` as the nodes' rank columns, no record made per rank (NodeSignals.take_fresh_columns)."""
        self.signals, columns = self.signals.take_fresh_columns()
        return columns

    def training(self, gpus: int, peak_tflops: float | None) -> TrainingMetrics | None:
        """The job's training metrics now, from each node's newest report (None: the program reports none).
        `gpus`: the step's GPUs; `peak_tflops`: the spec's peak per GPU (None: from the GPU model the nodes
        name).  Call it once per summary interval: each call adds the nodes' new samples."""
        self.meter = self.meter.observe((node, heard.report.metrics, heard.at)
                                        for node, heard in self.signals.heard.items() if heard.report.metrics)
        return self.meter.reading(self.clock(), gpus, job_peak(peak_tflops, self.meter.gpu_names()))


def junk_text(refused: int, cut_short: int) -> str:
    """The agent's line on datagrams refused since its last summary: `refused` of them, `cut_short` drains
    stopped at their bound meanwhile (more arrived than the agent reads: honest reports may be lost)."""
    if refused <= 0:
        return ""
    text = f"refusing junk datagrams: {refused:,} since the last summary"
    if cut_short > 0:
        text += (f", more than the agent reads ({cut_short:,} reads stopped at their bound): node reports may be "
                 "lost; someone sends to the agent's report port")
    return text


MAX_REFUSING_NAMED = 3
"""The most nodes the summary names one by one for refused checkpoint-copy connections; the rest are counted."""


def copy_refusals_text(grown: Sequence[tuple[str, CopyRefusals]]) -> str:
    """The agent's line on nodes whose copy servers refused connections (what each refused since its server
    started, by reason, most first): the MAX_REFUSING_NAMED nodes that refused most named, the others counted;
    "" for none."""
    if not grown:
        return ""
    ordered = sorted(grown, key=lambda item: (-item[1].total, item[0]))
    parts = []
    for node, refused in ordered[:MAX_REFUSING_NAMED]:
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(refused.counts, key=lambda c: -c[1]))
        parts.append(f"{node} refused {refused.total:,} checkpoint-copy connection{'s' * (refused.total != 1)} "
                     f"({reasons}) since {utc(refused.since)}")
    rest = ordered[MAX_REFUSING_NAMED:]
    if rest:
        parts.append(f"{len(rest):,} more node{'s' * (len(rest) != 1)} refused "
                     f"{sum(refused.total for _, refused in rest):,}")
    return "; ".join(parts)
