"""What a node's reporter sends, and when: pure judgement over what it read on its node.

The reporter (clusterctl.launcher.job.reporter, one per node of a step) reads, every 0.25 s, its
ranks' progress files (node-local), each rank's process state (/proc/<pid>/stat) and healthd's
state file, and asks `next_report` whether to send: at once when something the agent acts on
changed since the last report sent (a rank's process state, pid or phase, a rank that appeared or
left, healthd's verdict, the node's checkpoint holdings), else once per heartbeat.  With multi-level
checkpoints on, every report carries the node's newest checkpoint copies and its last resume
(`reported_holdings`), so a lost datagram is made good by the next heartbeat.  Steps, compute time and liveness ride along
with the next report; they are not changes on their own (the agent judges them per heartbeat), and
so do the ranks' training metrics, summed into one `NodeMetrics` per node (`node_metrics`).

Nothing here runs: the reader of each fact is the reporter's, passed in as data.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy
from clusterctl.records.healthd_state import HealthdState, StateFinding
from clusterctl.records.node_report import (
    MAX_DATAGRAM, MAX_EVIDENCE, MAX_GPU_NAME, MAX_RANKS, MAX_REPORTED_COPIES, MAX_TEXT,
    NodeHealth, NodeMetrics, NodeReport, RankBeat, SilentPeer,
)
from clusterctl.records.node_report import datagram_size as encoded_size
from clusterctl.records.rank_progress import MAX_TOTAL, RankProgress
from clusterctl.text import one_line

HEALTHD_STALE_AFTER = 30.0
"""Seconds after which healthd's state file says nothing: healthd rewrites it several times a minute."""
RETRY_AFTER = 1.0
ECHOES = 2
ECHO_GAP = 0.5
"""A report telling the agent of something it acts on at once (healthd's verdict changed, a rank's process
stopped or went, a neighbour fell silent or was heard again) is sent ECHOES more times, ECHO_GAP s apart: one
lost datagram (a lossy network, or a stranger's flood filling the agent's socket, which then drops what
comes) must not hold the signal back a whole heartbeat (20 s at 12,500 nodes).  Two more datagrams per such
change, a few a job-hour on a healthy node."""
"""Seconds before a report whose send failed (no route, a full socket buffer) is tried again."""
SHORT_EVIDENCE = 160
"""Characters of healthd's first reason kept when a full report must shrink to fit one datagram."""
DOWN = ("stopped", "gone")
"""Process states whose start the reporter dates (`stopped_since`)."""


def process_state(stat_line: str) -> str:
    """A process's state from its /proc/<pid>/stat line: running, stopped, gone or unknown.

    The state is the field after the command name, which is in parentheses and may itself hold
    spaces and parentheses (a program may name itself `a) T (b`), so it is read after the last
    `)`.  `T` (stopped by a signal: SIGSTOP, a shell's ^Z) is `stopped`; `t` (stopped by a
    tracer: a debugger or py-spy, usually for a moment) counts as running; `Z` and `X` (exited,
    not yet reaped) are `gone`; a line that is not a stat line is `unknown`.
    """
    _, paren, rest = stat_line.rpartition(")")
    fields = rest.split()
    if not paren or not fields:
        return "unknown"
    code = fields[0]
    if code == "T":
        return "stopped"
    if code in ("Z", "X", "x"):
        return "gone"
    if code in ("R", "S", "D", "I", "t", "W", "P", "K"):
        return "running"
    return "unknown"


def node_health(state: HealthdState | None, now: float) -> NodeHealth:
    """healthd's verdict for the node as the agent reads it, from healthd's state at `now` (epoch s).

    `drain` when healthd's verdict drains the node (Action.drains) and it is not in dry-run (a
    dry-run healthd only says what it would do); `ok` below that; `unknown` without a state file
    or with one older than HEALTHD_STALE_AFTER (healthd stopped: it says nothing either way).
    With `drain`, one evidence line per draining finding (at most MAX_EVIDENCE, each at most
    MAX_TEXT characters, made printable: healthd quotes kernel and driver text).
    """
    if state is None or not math.isfinite(state.updated_at) or now - state.updated_at > HEALTHD_STALE_AFTER:
        return NodeHealth("unknown", (), _time(state.updated_at) if state is not None else 0.0)
    at = _time(state.updated_at)
    if not state.verdict.drains or state.dry_run:
        return NodeHealth("ok", (), at)
    return NodeHealth("drain", tuple(_evidence(state.findings()))[:MAX_EVIDENCE], at)


def _time(value: float) -> float:
    return value if math.isfinite(value) and value >= 0 else 0.0


def _evidence(findings: Iterable[StateFinding]) -> Iterable[str]:
    for finding in findings:
        if not finding.action.drains:
            continue
        line = (f"healthd: {finding.what}" + (f" gpu{finding.gpu}" if finding.gpu is not None else "")
                + (f": {finding.reason}" if finding.reason else ""))
        yield one_line(line)[:MAX_TEXT]


def reported_holdings(holdings: CheckpointHoldings | None) -> CheckpointHoldings | None:
    """What a report says of the node's holdings: its newest MAX_REPORTED_COPIES copies (by step, then
    when each was complete), newest first, its last resume (what the agent journals of a resumed
    step) and what its copy server refused, times to the millisecond (what the agent plans with; about
    125 bytes a copy on the wire)."""
    if holdings is None:
        return None
    newest = sorted(holdings.copies, key=lambda c: (c.step, c.written_at, c.tier, c.of_node), reverse=True)
    resumed, refused = holdings.last_resume, holdings.copies_refused
    return CheckpointHoldings(holdings.node, tuple(replace(c, written_at=round(c.written_at, 3),
                                                           save_seconds=round(c.save_seconds, 3))
                                                   for c in newest[:MAX_REPORTED_COPIES]),
                              round(holdings.written_at, 3),
                              replace(resumed, seconds=round(resumed.seconds, 3), at=round(resumed.at, 3))
                              if resumed is not None else None,
                              replace(refused, since=round(refused.since, 3)) if refused is not None else None)


def node_metrics(records: Iterable[RankProgress], gpu: str = "") -> NodeMetrics | None:
    """The node's training metrics from its ranks' newest records (every rank, not only the MAX_RANKS a
    report lists): tokens and FLOPs summed, the loss and gradient norm of the lowest rank that reported
    one, the lowest rank's step; None when no rank reported any of them.  `gpu`: NVML's name of the
    node's GPUs ("" unknown), made one printable line of at most MAX_GPU_NAME characters."""
    newest: dict[int, RankProgress] = {}
    for record in records:
        newest[record.rank] = record
    if not any(record.has_metrics for record in newest.values()):
        return None
    ranks = sorted(newest)
    lowest = newest[ranks[0]]
    loss = next((newest[r] for r in ranks if newest[r].loss is not None), None)
    norm = next((newest[r] for r in ranks if newest[r].grad_norm is not None), None)
    epoch = zlib.crc32(",".join(f"{r}:{newest[r].pid}" for r in ranks).encode())
    ceiling = MAX_RANKS * MAX_TOTAL  # what a report may carry, whatever the node's rank count
    return NodeMetrics(
        at=max(max(r.at, r.alive_at) for r in newest.values()), ranks=len(ranks), epoch=epoch, step=lowest.step,
        step_at=lowest.at, tokens=min(ceiling, math.fsum(r.tokens for r in newest.values())),
        flops=min(ceiling, math.fsum(r.flops for r in newest.values())),
        loss=loss.loss if loss else None, loss_step=loss.loss_step if loss else None,
        loss_rank=loss.rank if loss else None, grad_norm=norm.grad_norm if norm else None,
        grad_norm_step=norm.grad_norm_step if norm else None, grad_norm_rank=norm.rank if norm else None,
        gpu=one_line(gpu)[:MAX_GPU_NAME])


@dataclass(frozen=True)
class ReporterIdentity:
    """Who sends: the job, the agent's step (`launch`) and the node, as every report carries them."""

    job_id: str
    launch: str
    node: str


@dataclass(frozen=True)
class ReporterMemory:
    """What the reporter remembers between two looks: its last report sent, and since when each rank is down."""

    last_sent: NodeReport | None = None
    last_sent_at: float = -math.inf
    """When it was sent (the reporter's monotonic clock)."""
    delivered: bool = True
    """False when the last send failed: it is tried again after RETRY_AFTER, not a whole heartbeat."""
    down_since: Mapping[int, tuple[int, str, float]] = field(default_factory=dict)
    """Per rank: (pid, state, epoch s when the reporter first saw that pid stopped or gone)."""
    holdings: CheckpointHoldings | None = None
    """The node's checkpoint holdings as last reported (`reported_holdings`, before a report is fitted)."""
    echoes_due: int = 0
    """Copies of the last report still to send, ECHO_GAP apart: it told of something the agent acts on at once."""

    def after_send(self, report: NodeReport, at: float, *, delivered: bool) -> ReporterMemory:
        """The memory once `report` was sent at `at` (monotonic), or failed to leave (`delivered` False)."""
        return replace(self, last_sent=report, last_sent_at=at, delivered=delivered)


@dataclass(frozen=True)
class ReportDecision:
    """`report` to send now, or None; `reason` says why (a change, the heartbeat); the memory to keep."""

    report: NodeReport | None
    reason: str
    memory: ReporterMemory


def rank_beats(records: Iterable[RankProgress], processes: Mapping[int, str], now: float,
               down_since: Mapping[int, tuple[int, str, float]]) -> tuple[tuple[RankBeat, ...],
                                                                     dict[int, tuple[int, str, float]]]:
    """Each rank's beat (the first MAX_RANKS by rank number), and the new `down_since` memory.

    `processes` maps a pid to its state (process_state); a pid not in it is `unknown`.  A rank's
    `stopped_since` is when the reporter first saw that process stopped or gone (kept across a
    stopped → gone change), 0 while it runs or cannot be seen.
    """
    newest: dict[int, RankProgress] = {}
    for record in records:
        newest[record.rank] = record
    beats: list[RankBeat] = []
    remembered: dict[int, tuple[int, str, float]] = {}
    for rank in sorted(newest)[:MAX_RANKS]:
        record = newest[rank]
        state = processes.get(record.pid, "unknown")
        since = 0.0
        if state in DOWN:
            before = down_since.get(rank)
            since = before[2] if before is not None and before[0] == record.pid else now
            remembered[rank] = (record.pid, state, since)
        beats.append(RankBeat(record, state, since))
    return tuple(beats), remembered


def changes(before: NodeReport | None, after: NodeReport) -> tuple[str, ...]:
    """What the agent acts on that differs between the last report sent and this one (empty: nothing)."""
    if before is None:
        return ("first report",)
    found: list[str] = []
    if before.health.verdict != after.health.verdict:
        found.append(f"healthd {before.health.verdict} → {after.health.verdict}")
    old = {beat.progress.rank: beat for beat in before.ranks}
    new = {beat.progress.rank: beat for beat in after.ranks}
    for rank in sorted(new.keys() - old.keys()):
        found.append(f"rank {rank} appeared")
    for rank in sorted(old.keys() - new.keys()):
        found.append(f"rank {rank} left")
    for rank in sorted(new.keys() & old.keys()):
        a, b = old[rank], new[rank]
        if a.process != b.process or a.progress.pid != b.progress.pid:
            found.append(f"rank {rank} {a.process} → {b.process}")
        if a.progress.phase != b.progress.phase:
            found.append(f"rank {rank} {a.progress.phase} → {b.progress.phase}")
    return tuple(found)


def _process_changed(before: NodeReport, after: NodeReport) -> bool:
    """A rank seen in both whose process changed state (ranks appearing at a step's start are not urgent)."""
    old = {beat.progress.rank: (beat.process, beat.progress.pid) for beat in before.ranks}
    return any(old.get(beat.progress.rank, (beat.process, beat.progress.pid)) != (beat.process, beat.progress.pid)
               for beat in after.ranks)


def next_report(identity: ReporterIdentity, records: Iterable[RankProgress], processes: Mapping[int, str],
                health: NodeHealth, memory: ReporterMemory, *, now: float, monotonic: float, heartbeat: float,
                force: bool = False, checkpoints: CheckpointHoldings | None = None, gpu: str = "",
                silent_peers: tuple[SilentPeer, ...] = ()) -> ReportDecision:
    """The report to send now, if any: at once on a change (see `changes`), else once per `heartbeat` s.

    `now` is the node's wall clock (the report's `sent_at`, `stopped_since`), `monotonic` its
    monotonic clock (the heartbeat).  `seq` counts the reports sent, from 1.  `force` sends
    whatever changed (the reporter's last report before it exits).  `checkpoints`: the node's
    holdings as read (None: none to tell); the report carries `reported_holdings` of them.  `gpu`: the
    node's GPU model, carried in the ranks' training metrics (`node_metrics`).  `silent_peers`: the
    neighbours whose beats stopped (launcher/pure/peer_watch.py); a neighbour newly silent, or heard
    again, is a change.  The
    caller sends the report and keeps `memory.after_send(...)`; with no report, it keeps
    `decision.memory`.
    """
    records = tuple(records)
    beats, down_since = rank_beats(records, processes, now, memory.down_since)
    last = memory.last_sent
    held = reported_holdings(checkpoints)
    report = NodeReport(identity.job_id, identity.launch, identity.node, (last.seq + 1) if last else 1,
                        max(now, 0.0), beats, health, held, node_metrics(records, gpu), silent_peers)
    changed = changes(last, report)
    was = {p.node for p in last.silent_peers} if last is not None else set()
    if {p.node for p in silent_peers} != was:
        changed += (f"neighbours silent: {' '.join(p.node for p in silent_peers) or 'none'}",)
    # A copy server's refusals ride the next heartbeat: under a flood of strangers they change every rewrite of
    # the holdings, and the agent only summarizes them.
    if last is not None and _kept(held) != _kept(memory.holdings):  # before `fitted` may drop the oldest copies
        resumed = held.last_resume if held is not None else None
        before = memory.holdings.last_resume if memory.holdings is not None else None
        changed += ("checkpoint holdings " + ("gone" if held is None else f"now {len(held.copies)} copies")
                    + (f", resumed step {resumed.step}" if resumed is not None and resumed != before else ""),)
    urgent = last is not None and (last.health.verdict != report.health.verdict
                                   or {p.node for p in silent_peers} != was
                                   or _process_changed(last, report))
    memory = replace(memory, down_since=down_since, holdings=held)
    if changed:
        return ReportDecision(fitted(report), "; ".join(changed),
                              replace(memory, echoes_due=ECHOES if urgent else 0))
    if force:
        return ReportDecision(fitted(report), "last report", memory)
    if memory.echoes_due > 0 and monotonic - memory.last_sent_at >= ECHO_GAP:
        return ReportDecision(fitted(report), "again: what changed is sent more than once",
                              replace(memory, echoes_due=memory.echoes_due - 1))
    due_after = heartbeat if memory.delivered else min(heartbeat, RETRY_AFTER)
    if monotonic - memory.last_sent_at >= due_after:
        return ReportDecision(fitted(report), "heartbeat" if memory.delivered else "again after a failed send", memory)
    return ReportDecision(None, "", memory)


def _kept(holdings: CheckpointHoldings | None) -> CheckpointHoldings | None:
    """The holdings without their copy server's refusals."""
    return replace(holdings, copies_refused=None) if holdings is not None else None


def datagram_size(report: NodeReport) -> int:
    """The bytes `report` takes on the wire (clusterctl.records.node_report.encode), whatever the key."""
    return encoded_size(report)


def fitted(report: NodeReport) -> NodeReport:
    """`report` cut to one datagram (MAX_DATAGRAM): evidence lines dropped from the end down to the first,
    that line cut to SHORT_EVIDENCE characters, then the oldest checkpoint copies, and only then the
    last ranks dropped.

    Only a node with many ranks and healthd quoting long text (non-ASCII text is sent escaped, up to
    six bytes a character) comes near the limit; the agent still hears the verdict and its first reason,
    and the node's newest checkpoint copies.
    """
    def evidence(lines: tuple[str, ...]) -> NodeReport:
        return replace(report, health=replace(report.health, evidence=lines))

    while datagram_size(report) > MAX_DATAGRAM and len(report.health.evidence) > 1:
        report = evidence(report.health.evidence[:-1])
    if datagram_size(report) > MAX_DATAGRAM and report.health.evidence:
        report = evidence((report.health.evidence[0][:SHORT_EVIDENCE],))
    while datagram_size(report) > MAX_DATAGRAM and report.checkpoints is not None and report.checkpoints.copies:
        kept: tuple[HeldCopy, ...] = report.checkpoints.copies[:-1]  # newest first: the oldest goes
        report = replace(report, checkpoints=replace(report.checkpoints, copies=kept))
    while datagram_size(report) > MAX_DATAGRAM and report.ranks:
        report = replace(report, ranks=report.ranks[:-1])
    return report
