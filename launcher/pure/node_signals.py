"""What a step's node reports say: frozen ranks, healthd's drains, nodes gone silent.  (pure)

Each node of a step has one reporter (clusterctl.launcher.job.reporter) that sends the job's agent
one NodeReport (clusterctl.records.node_report) at once when something changes and once per
heartbeat otherwise.  This module keeps the newest report of each node (`NodeSignals.observe`) and
judges them (`NodeSignals.judge`):

- **frozen**: a node's ranks whose processes are stopped (state T in /proc: SIGSTOP, a frozen
  cgroup) for `stopped_grace` seconds while the ranks of other nodes run.  Every node stopped
  at once is a suspended job (`scontrol suspend`), not a fault, and names nobody.
- **drained**: nodes whose healthd says it drained them (verdict `drain`).  The agent confirms
  with one single-node query to Slurm before it blames: healthd decides drains, Slurm shows them.
- **silent**: nodes not heard from for `silent_after` seconds (or never, `startup_grace` after
  the step started): the agent asks Slurm about those nodes alone, and only when they are a
  minority: most nodes silent at once is the channel's trouble (a firewall, the agent's own
  network), not the nodes', and then the agent falls back to reading the node table.

Times: `at` arguments are the agent's clock (epoch s); a report's own times are its node's clock,
used only as differences within one report (how long a process has been stopped), so a node
whose clock is off cannot make another node look frozen.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from clusterctl.launcher.pure.hang_watch import HangVerdict, StuckNode, ranks_text
from clusterctl.records.checkpoint_holdings import CheckpointHoldings
from clusterctl.records.node_report import NodeReport, RankColumns
from clusterctl.records.rank_progress import RankProgress

NODES_PER_HEARTBEAT_SECOND = 625
"""Reports per second the agent takes in steady state: ~65 µs each to check and parse (the compact format,
measured on a loaded core: docs/measured.md), so 625 a second cost ~4% of one core."""
MAX_HEARTBEAT = 20.0
MIN_HEARTBEAT = 1.0
SMALL_STEP_NODES = 32
"""Up to this many nodes the agent asks Slurm about each node in turn (single-node queries, 0.1-0.5 ms
of controller time each); beyond it, one read of the node table per TABLE_READ_SECONDS."""
TABLE_READ_SECONDS = 60.0


def heartbeat_seconds(nodes: int) -> float:
    """Seconds between two reports of a node whose report did not change: clamp(nodes / 625, 1, 20).

    A change (a stopped process, healthd's verdict, a phase) is sent at once whatever the heartbeat."""
    return min(MAX_HEARTBEAT, max(MIN_HEARTBEAT, nodes / NODES_PER_HEARTBEAT_SECOND))


def slurm_sweep_seconds(nodes: int) -> float:
    """Seconds between two looks at the step's nodes in Slurm (for what no report carries: an
    operator's drain, a node Slurm declared DOWN): every node in turn at most four single-node
    queries a second up to SMALL_STEP_NODES nodes, else one node-table read a minute."""
    return max(1.0, 0.25 * nodes) if nodes <= SMALL_STEP_NODES else TABLE_READ_SECONDS


@dataclass(frozen=True)
class SignalPolicy:
    """How the reports of a step of `nodes` nodes are judged (seconds)."""

    heartbeat: float = 1.0
    silent_after: float = 5.0
    """A node heard from before and silent this long: ask Slurm about it."""
    startup_grace: float = 120.0
    """A node never heard from this long after the step started (its Python starting, srun's fan-out)."""
    stopped_grace: float = 1.0
    """A rank's process stopped this long, while other nodes run, counts as frozen."""

    def __post_init__(self) -> None:
        for name in ("heartbeat", "silent_after", "startup_grace", "stopped_grace"):
            value = getattr(self, name)
            if not value >= 0 or value == float("inf"):
                raise ValueError(f"SignalPolicy.{name} must be a finite number of seconds, not {value!r}")

    @classmethod
    def for_nodes(cls, nodes: int, *, stopped_grace: float = 1.0) -> SignalPolicy:
        """The policy for a step of `nodes` nodes: a node is silent after three missed heartbeats."""
        heartbeat = heartbeat_seconds(nodes)
        return cls(heartbeat, 3 * heartbeat + 2.0, max(120.0, 6 * heartbeat), stopped_grace)


@dataclass(frozen=True)
class Heard:
    """A node's newest report and when the agent received it (its clock, epoch s)."""

    report: NodeReport
    at: float


@dataclass(frozen=True)
class Signals:
    """What the reports say at one moment."""

    frozen: HangVerdict | None = None
    """Nodes whose ranks stopped running while the others run (a hang verdict naming them)."""
    drained: tuple[str, ...] = ()
    """Nodes whose healthd says it drained them: ask Slurm, then blame."""
    silent: tuple[str, ...] = ()
    """Nodes to ask Slurm about because they stopped reporting (a minority of the step's nodes)."""
    channel_silent: int = 0
    """Nodes silent when most of the step is: the channel's trouble, not theirs (nobody is asked about)."""
    reporting: int = 0
    """Nodes heard from within `silent_after`."""
    witnessed: Mapping[str, str] = field(default_factory=dict)
    """Nodes whose neighbours say their beats stopped (launcher/pure/peer_watch.py), each with what the
    first witness said: a suspicion the agent checks with its own probe (launcher/pure/reachability.py)."""


@functools.lru_cache(maxsize=8)
def _members(nodes: tuple[str, ...]) -> frozenset[str]:
    """A step's nodes as a set: made once, not at each of its 12,500-node signals' five polls a second."""
    return frozenset(nodes)


@dataclass(frozen=True)
class NodeSignals:
    """The newest report of each node of one launched step, carried from one poll to the next."""

    policy: SignalPolicy
    job_id: str
    launch: str
    nodes: tuple[str, ...]
    started_at: float
    heard: Mapping[str, Heard] = field(default_factory=dict)
    ignored: int = 0
    """Reports of another job, another launch, a node not in the step, or older than the one held."""
    members: frozenset[str] = field(init=False, repr=False, compare=False)
    """`nodes` as a set (derived from them)."""
    # What the held reports say, kept as each arrives so that `judge` (every 0.2 s) looks only at the
    # few nodes that matter, not at 12,500 reports: nodes with a stopped rank, nodes with no rank
    # running, nodes whose healthd says drain.
    stopping: frozenset[str] = frozenset()
    idle: frozenset[str] = frozenset()
    draining: frozenset[str] = frozenset()
    witnessing: frozenset[str] = frozenset()
    """Nodes whose newest report names a silent neighbour."""
    holdings: Mapping[str, CheckpointHoldings] = field(default_factory=dict)
    """Each node's newest checkpoint holdings (multi-level checkpoints), from the newest report taken that
    carried any: a report without holdings (the node's file damaged, none yet) leaves what it said before.
    An unchanged node's entry stays the same object, so a caller compares cheaply."""
    fresh: frozenset[str] = frozenset()
    """Nodes whose report was taken since the last `take_fresh`: only their ranks' records can have changed."""

    @classmethod
    def start(cls, policy: SignalPolicy, job_id: str, launch: str, nodes: Sequence[str],
              started_at: float) -> NodeSignals:
        """The signals of step `launch` of job `job_id` on `nodes`, launched at `started_at`."""
        return cls(policy, job_id, launch, tuple(nodes), started_at)

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", _members(self.nodes))

    def observe(self, reports: Iterable[NodeReport], at: float) -> NodeSignals:
        """Take the reports received at `at`: each node's newest (by `seq`, a restarted reporter's
        by its send time) replaces the one held; others' reports are counted and dropped."""
        heard, ignored, members = dict(self.heard), self.ignored, self.members
        stopping, idle, draining, fresh = set(self.stopping), set(self.idle), set(self.draining), set(self.fresh)
        witnessing = set(self.witnessing)
        holdings: dict[str, CheckpointHoldings] | None = None  # copied at the first change
        for report in reports:
            node = report.node
            held = heard.get(node)
            if report.job_id != self.job_id or report.launch != self.launch or node not in members or (
                    held is not None and report.seq <= held.report.seq and report.sent_at <= held.report.sent_at):
                ignored += 1
                continue
            heard[node] = Heard(report, at)
            fresh.add(node)
            told = report.checkpoints
            if told is not None and (holdings or self.holdings).get(node) != told:
                holdings = dict(self.holdings) if holdings is None else holdings
                holdings[node] = told
            processes = report.columns.process  # a node's few ranks: no set made (625 reports a second)
            (stopping.add if "stopped" in processes else stopping.discard)(node)
            (idle.discard if "running" in processes else idle.add)(node)
            (draining.add if report.health.verdict == "drain" else draining.discard)(node)
            (witnessing.add if report.silent_peers else witnessing.discard)(node)
        return replace(self, heard=heard, ignored=ignored, stopping=frozenset(stopping), idle=frozenset(idle),
                       draining=frozenset(draining), witnessing=frozenset(witnessing), fresh=frozenset(fresh),
                       holdings=self.holdings if holdings is None else holdings)

    def records(self) -> tuple[RankProgress, ...]:
        """Every rank's newest progress record, as the hang and straggler watches take them."""
        return tuple(progress for heard in self.heard.values() for progress in heard.report.columns.progress())

    def step_range(self) -> tuple[int, int] | None:
        """The lowest and highest step among the ranks' newest reports (None: no rank reported), read from the
        reports' step columns (no record made per rank)."""
        columns = [steps for steps in (heard.report.columns.step for heard in self.heard.values()) if steps]
        if not columns:
            return None
        return min(map(min, columns)), max(map(max, columns))

    def take_fresh(self) -> tuple[NodeSignals, tuple[RankProgress, ...]]:
        """The ranks' records of the nodes heard from since the last take (in `records()`'s order), and
        these signals with none fresh: fed to the hang and straggler watches, they give what feeding
        every record gives, at the cost of the nodes that reported."""
        signals, columns = self.take_fresh_columns()
        return signals, tuple(progress for ranks in columns for progress in ranks.progress())

    def take_fresh_columns(self) -> tuple[NodeSignals, tuple[RankColumns, ...]]:
        """`take_fresh` as each fresh node's rank columns (no record made per rank: the straggler watch reads
        them as they are, StragglerWatch.observe_nodes)."""
        fresh = self.fresh
        if not fresh:
            return self, ()
        columns = tuple(heard.report.columns for node, heard in self.heard.items() if node in fresh)
        return replace(self, fresh=frozenset()), columns

    def quiet_until(self) -> float:
        """Before this time no node heard from is silent: while no report is older than one taken then,
        a caller may pass it to `judge` again and again (reports taken later only move it on)."""
        return min((heard.at for heard in self.heard.values()), default=math.inf) + self.policy.silent_after

    def judge(self, at: float, quiet_until: float = -math.inf) -> Signals:
        """What the reports held say at `at` (the agent's clock); `quiet_until`: what `quiet_until()` said
        since the last report older than the ones held was taken (the default: look at every node)."""
        policy = self.policy
        silent, reporting = [], 0
        if at < quiet_until and len(self.nodes) == len(self.members) and (
                len(self.heard) == len(self.nodes) or at - self.started_at < policy.startup_grace):
            reporting = len(self.heard)  # every 0.2 s at 12,500 nodes: no look at each node while none can be silent
        elif len(self.nodes) == len(self.members):
            # Every 0.2 s over 12,500 nodes: one pass over the reports held, in C; the step's order only
            # for the few silent ones.
            after, heard = policy.silent_after, self.heard
            late = {node for node, h in heard.items() if at - h.at >= after}
            unheard = len(heard) < len(self.nodes) and at - self.started_at >= policy.startup_grace
            if late or unheard:
                silent = [node for node in self.nodes if node in late or (unheard and node not in heard)]
            reporting = len(heard) - len(late)
        else:
            for node in self.nodes:
                heard_from = self.heard.get(node)
                if heard_from is None:
                    if at - self.started_at >= policy.startup_grace:
                        silent.append(node)
                elif at - heard_from.at >= policy.silent_after:
                    silent.append(node)
                else:
                    reporting += 1
        channel = len(silent) >= 2 and 2 * len(silent) > len(self.nodes)
        quiet = set(silent)
        drained = tuple(node for node in self.nodes if node in self.draining and node not in quiet) \
            if self.draining - quiet else ()
        return Signals(self._frozen(at, quiet), drained, () if channel else tuple(silent),
                       len(silent) if channel else 0, reporting, self._witnessed(at, quiet))

    def _witnessed(self, at: float, silent: set[str]) -> dict[str, str]:
        """The nodes a neighbour that is itself heard from names silent, with what it says (the first witness)."""
        witnessed: dict[str, str] = {}
        for witness in sorted(self.witnessing - silent):
            heard = self.heard[witness]
            for peer in heard.report.silent_peers:
                if peer.node in self.members and peer.node not in witnessed:
                    witnessed[peer.node] = (f"its neighbour {witness} has not heard its beats for "
                                            f"{peer.silent_s + max(0.0, at - heard.at):.1f} s")
        return witnessed

    def _frozen(self, at: float, silent: set[str]) -> HangVerdict | None:
        stopped: dict[str, tuple[list[int], float]] = {}
        # Heard, not silent, with a rank running: every heard node but the silent and the idle ones.
        running_nodes = (len(self.heard) - sum(1 for node in silent if node in self.heard)
                         - sum(1 for node in self.idle if node not in silent))
        for node in sorted(self.stopping - silent):
            heard = self.heard[node]
            report = heard.report
            frozen = [b for b in report.ranks if b.process == "stopped" and b.stopped_since > 0]
            if not frozen or len(frozen) < len([b for b in report.ranks if b.process != "gone"]):
                continue  # a node is frozen when every rank it still has stopped
            for_s = min(report.sent_at - b.stopped_since for b in frozen) + (at - heard.at)
            if for_s >= self.policy.stopped_grace:
                stopped[node] = (sorted(b.progress.rank for b in frozen), for_s)
        if not stopped or running_nodes == 0:
            return None  # nothing stopped, or everything: a suspended job, not a fault
        suspects = tuple(StuckNode(node, tuple(ranks), (
            f"{ranks_text(ranks)} on {node} stopped stepping and also stopped running: the node's reporter has "
            f"seen their processes stopped (state T: SIGSTOP or a frozen cgroup) for {for_s:.1f} s, while the "
            f"ranks of {running_nodes} other node{'s' if running_nodes != 1 else ''} run"))
            for node, (ranks, for_s) in sorted(stopped.items()))
        return HangVerdict(True, False, suspects, tuple(r for s in suspects for r in s.ranks),
                           tuple(s.evidence for s in suspects))

