"""The in-job agent's watch over one running step: until it ends, a node fails, its ranks hang, or a straggler swaps.

The node reports (launcher/job/signal_watch.py) are taken every STEP_POLL_SECONDS: a node whose
ranks froze ends the step at once; a node healthd says it drained, or that went silent, is asked
about in Slurm (one single-node query, then backing off while the hint lasts: `SlurmAsking`).
What no report carries (an operator's drain, a node Slurm declared DOWN) comes from a sweep of
the step's nodes in Slurm every `slurm_sweep_seconds`.  The hang and straggler watches take the
records of the nodes heard from since, once per heartbeat (`StepWatch._feeding`), in parts of a few
milliseconds with the reports taken between them, so a drain or a frozen node never waits for a whole
feed (a second or more at 100,000 ranks); the summary and what follows it are
written once per interval (launcher/job/agent_outputs.py).  What follows a step is the agent's
(launcher/job/agent.py): the watch only says how the step ended (`Watched`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.errors import SlurmCommandError
from clusterctl.launcher.job.agent_doors import AgentDoors
from clusterctl.launcher.job.agent_outputs import SUMMARY_MIN_SECONDS, AgentOutputs
from clusterctl.launcher.job.checkpoint_plan import TierPlanner
from clusterctl.launcher.job.leadership import Leadership
from clusterctl.launcher.job.node_probe import DEFAULT_SLURMD_PORT, NodeProber
from clusterctl.launcher.job.signal_watch import SignalWatch
from clusterctl.launcher.job.step_launch import Launched, resized_environment
from clusterctl.launcher.pure.classify import Blame, hardware_suspects, not_responding, operator_drains
from clusterctl.launcher.pure.hang_watch import HangPolicy, HangVerdict, HangWatch, progress_from_log_line
from clusterctl.launcher.pure.in_parts import Parts, next_part
from clusterctl.launcher.pure.node_signals import SMALL_STEP_NODES, SignalPolicy, Signals, slurm_sweep_seconds
from clusterctl.launcher.pure.reachability import Probes, unreachable
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.pure.straggler_verdict import SwapRoom
from clusterctl.launcher.pure.straggler_watch import StragglerWatch
from clusterctl.launcher.shared.straggler_actions import StragglerActions
from clusterctl.records.run_journal import StragglerFound
from clusterctl.slurm.nodes import NodeState

STEP_POLL_SECONDS = 0.2
"""How often the agent looks whether the step ended (a local waitpid, free)."""
FEED_TURN_SECONDS = 0.03
"""How long one turn of the loop feeds the watches before it takes the reports again: a poll at 12,500
nodes costs several ms (bench/signals_bench.py), so one after every part of the feed would cost more
than the feed's parts save; a turn stays near 50 ms with the last part."""
EVIDENCE_GRACE_SECONDS = 5.0
"""After a step failed with no node to blame yet: how long healthd's drain may take to show in Slurm."""
HINT_BACKOFF_MAX_SECONDS = 30.0
"""A node a report points at (healthd says drain, gone silent) is asked about at once, then at most
after 1, 2, 4, ... up to this many seconds while the hint lasts."""


@dataclass(frozen=True)
class Watched:
    """How watching a step ended: its exit code (None: ended for `suspects` or a hang), when it was seen."""

    exit_code: int | None
    suspects: list[Blame]
    seen: float
    hang: HangVerdict | None = None
    straggler: StragglerFound | None = None
    lost_s: float = 0.0
    """Time the step's stragglers cost it (the slowest rank's excess per step, summed)."""


class SlurmAsking:
    """When the watch asks Slurm about the step's nodes: a node a report points at (healthd drained it, it
    went silent) at once, then backing off while the hint lasts; every node on a sweep every
    `slurm_sweep_seconds`; and since when each node Slurm was asked about has not responded."""

    def __init__(self, nodes: Sequence[str], start: float) -> None:
        self.nodes = nodes
        self.sweep_every = slurm_sweep_seconds(len(nodes))
        self.next_sweep = start
        self.hints: dict[str, tuple[float, float]] = {}
        """node -> (when it may be asked again, the back-off)."""
        self.silent_since: dict[str, float] = {}

    def due(self, signals: Signals, now: float) -> tuple[list[str], bool]:
        """The hinted nodes to ask about now, and whether a sweep is due; a hint that is over is forgotten."""
        hinted = [n for n in (*signals.drained, *signals.silent) if self.hints.get(n, (0.0, 0.0))[0] <= now]
        for name in [n for n in self.hints if n not in signals.drained and n not in signals.silent]:
            del self.hints[name]  # the hint is over: a new one is asked about at once
        return hinted, now >= self.next_sweep

    def asked(self, hinted: Sequence[str], sweep: bool, now: float) -> None:
        """Slurm was asked at `now` about the `hinted` nodes (and on a `sweep`, all): when to ask again."""
        if sweep:
            self.next_sweep = now + self.sweep_every
        for name in hinted:
            backoff = min(HINT_BACKOFF_MAX_SECONDS, max(1.0, 2 * self.hints.get(name, (0.0, 0.5))[1]))
            self.hints[name] = (now + backoff, backoff)

    def silences(self, states: Mapping[str, NodeState], now: float) -> dict[str, float]:
        """How long each node Slurm says is not responding has been so, as of `now`."""
        for name, state in states.items():
            if not_responding(state):
                self.silent_since.setdefault(name, now)
            else:
                self.silent_since.pop(name, None)
        return {n: now - t for n, t in self.silent_since.items()}


@dataclass
class _Feed:
    """What one step's watches hold between two polls: the reports taken last, the hang and straggler
    watches, and where the job's log was read up to."""

    hangs: HangWatch
    stragglers: StragglerWatch
    log_offset: int
    signals: Signals = field(default_factory=Signals)
    probes: Probes = field(default_factory=Probes)


class StepWatch:
    """Watches the agent's steps, one at a time, and says how each ended."""

    def __init__(self, spec: JobSpec, environ: Mapping[str, str], doors: AgentDoors, *, batch_host: str,
                 log_path: Path, tiers: TierPlanner | None, straggler_actions: StragglerActions,
                 outputs: AgentOutputs, lease: Leadership) -> None:
        self.spec, self.environ, self.doors, self.batch_host, self.log_path = spec, environ, doors, batch_host, log_path
        self.tiers, self.straggler_actions, self.outputs, self.lease = tiers, straggler_actions, outputs, lease
        self.prober: NodeProber | None = None
        if doors.probe is not None:
            try:
                port = doors.slurmd_port()
            except SlurmCommandError as exc:
                port = DEFAULT_SLURMD_PORT
                doors.say(f"cannot read slurmd's port from Slurm ({exc}); probing suspected nodes on {port}")
            self.prober = NodeProber(port, doors.monotonic, doors.probe)

    def watch(self, launched: Launched, spares: int) -> Watched:
        """Wait for the step to end, for one of its nodes to fail, for its ranks to hang, or for a
        straggler to swap (`spares`: nodes of the allocation beyond the job's, left to swap in); the
        time its stragglers cost it counts for the job's next step."""
        watched = self._until_ended(launched, spares)
        self.straggler_actions.step_ended(watched.lost_s)
        return watched

    def _until_ended(self, launched: Launched, spares: int) -> Watched:
        nodes = launched.slots
        stragglers = StragglerWatch.start(self.spec.stragglers, launched.started_at)
        watch = launched.signals
        heartbeat = watch.policy.heartbeat if watch else 1.0
        start = self.doors.monotonic()
        asking = SlurmAsking(nodes, start)
        next_judge = next_summary = start
        rank_map = launched.rank_map
        hangs = HangWatch.start(self._hang_policy(watch.policy if watch else SignalPolicy()), launched.started_at,
                                {r: rank_map.location(r)[0] for r in range(rank_map.world_size)})
        feed = _Feed(hangs, stragglers, launched.log_offset)
        feeding: Parts[Watched | None] | None = None
        while True:
            code = launched.step.exit_code()
            if code is not None:
                return Watched(code, [], self.doors.monotonic(), lost_s=feed.stragglers.lost_s)
            if (frozen := self._frozen_now(watch, feed)) is not None:
                return frozen
            now = self.doors.monotonic()
            if (gone := self._unreachable(feed, watch, now)):
                return Watched(None, gone, now, lost_s=feed.stragglers.lost_s)
            hinted, sweep = asking.due(feed.signals, now)
            if now >= next_summary and watch is not None:
                next_summary = now + max(SUMMARY_MIN_SECONDS, heartbeat)
                self.outputs.summarize(launched, watch, feed.signals, stragglers=feed.stragglers)
                self.lease.check_in_charge()
                if self.tiers is not None:
                    self.tiers.record_due()
            if hinted or sweep:
                suspects, now = self._ask_slurm(asking, hinted, sweep, now, spares)
                if suspects:
                    return Watched(None, suspects, now, lost_s=feed.stragglers.lost_s)
            if feeding is not None:
                # FEED_TURN_SECONDS of the heartbeat's feed per turn, no sleep: the reports are taken between.
                finished, ended = self._feed_turn(feeding)
                if finished:
                    feeding = None
                    if ended is not None:
                        return ended
                continue
            if now < next_judge:
                if not hinted and not sweep:
                    self.doors.sleep(STEP_POLL_SECONDS)
                continue
            next_judge = now + heartbeat
            feeding = self._feeding(launched, spares, feed, now)

    def _frozen_now(self, watch: SignalWatch | None, feed: _Feed) -> Watched | None:
        """Take the reports waiting now; a Watched when they say a node's ranks froze."""
        if watch is None:
            return None
        feed.signals = watch.poll()
        if feed.signals.frozen is None:
            return None
        return Watched(None, list(feed.signals.frozen.blames()), self.doors.monotonic(), feed.signals.frozen,
                       lost_s=feed.stragglers.lost_s)

    def _unreachable(self, feed: _Feed, watch: SignalWatch | None, now: float) -> list[Blame]:
        """The nodes the job itself knows are gone, without Slurm: suspected (a neighbour or the agent lost
        them) and unanswered by the agent's own probes (launcher/pure/reachability.py); probes those due."""
        if self.prober is None or watch is None:
            return []
        feed.probes, gone = probe_suspects(feed.signals, watch.policy.silent_after, self.batch_host, feed.probes,
                                           self.prober, now)
        return gone

    def _ask_slurm(self, asking: SlurmAsking, hinted: Sequence[str], sweep: bool, now: float,
                   spares: int) -> tuple[list[Blame], float]:
        """The step's nodes to blame after asking Slurm about the `hinted` ones (and on a `sweep`, all), and
        the time the answer came."""
        nodes = asking.nodes
        states = self._look_in_slurm(nodes, hinted, sweep)
        asking.asked(hinted, sweep, now)
        now = self.doors.monotonic()
        silences = asking.silences(states, now)
        suspects = hardware_suspects(nodes, states, silences, self.spec.restart.unresponsive_seconds)
        if not suspects and spares >= 1:  # an operator wants the node back: a spare takes its place
            suspects = [b for b in operator_drains(nodes, states) if b.node != self.batch_host]
        return suspects, now

    def _feed_turn(self, feeding: Parts[Watched | None]) -> tuple[bool, Watched | None]:
        """Parts of a feed for FEED_TURN_SECONDS (at least one): whether it is over, and how it ended."""
        until = self.doors.monotonic() + FEED_TURN_SECONDS
        finished, ended = next_part(feeding)
        while not finished and self.doors.monotonic() < until:
            finished, ended = next_part(feeding)
        return finished, ended

    def _feeding(self, launched: Launched, spares: int, feed: _Feed, now: float) -> Parts[Watched | None]:
        """One heartbeat's feed of the hang and straggler watches (and the job's log, for a progress
        pattern), in parts: returns a Watched when the step is to end."""
        watch = launched.signals
        if self.tiers is not None and self.tiers.resuming is not None and watch is not None:
            self.outputs.journal_resume(watch.holdings())
        # Only the nodes heard from since the last feed: the others' records are the ones fed before.  The
        # straggler watch reads the nodes' rank columns as they came (100,000 ranks a heartbeat at 12,500 nodes).
        columns = watch.fresh_columns() if watch is not None else ()
        feed.hangs = yield from feed.hangs.observing(progress for ranks in columns for progress in ranks.progress())
        if self.spec.stragglers.action != "off":
            feed.stragglers = yield from feed.stragglers.observing_nodes(columns)
            self.straggler_actions.write_table(feed.stragglers)
            for found in feed.stragglers.found:
                env = resized_environment(self.environ, launched.slots)
                swap = self.straggler_actions.act(found, env, SwapRoom(spares, self.batch_host))
                if swap is not None:
                    return Watched(None, [swap], now, straggler=found, lost_s=feed.stragglers.lost_s)
        pattern = self.spec.restart.progress_pattern
        if pattern:
            lines, feed.log_offset = self.doors.read_log(self.log_path, feed.log_offset)
            for line in lines:
                logged = progress_from_log_line(line, pattern)
                if logged is not None:
                    feed.hangs = feed.hangs.observe_log_step(logged, self.doors.now())
        if feed.hangs.latest or feed.hangs.logged is not None:  # the program reports progress: judge it
            verdict = yield from feed.hangs.verdicting(self.doors.now())
            if verdict.hung:
                return Watched(None, list(verdict.blames()), now, verdict, lost_s=feed.stragglers.lost_s)
        return None

    def _look_in_slurm(self, nodes: Sequence[str], hinted: Sequence[str], sweep: bool) -> dict[str, NodeState]:
        """The states of the `hinted` nodes (one single-node query each), and on a `sweep` of every
        node of the step: one query each up to SMALL_STEP_NODES nodes, else one node-table read."""
        states: dict[str, NodeState] = {}
        if sweep and len(nodes) > SMALL_STEP_NODES and self.doors.node_table is not None:
            try:
                table = self.doors.node_table()
                states.update({n: table[n] for n in nodes if n in table})
            except SlurmCommandError as exc:
                self.doors.say(f"cannot read the node table ({exc}); judging without it")
        elif sweep:
            states.update(self._states(nodes))
        states.update(self._states([n for n in hinted if n not in states]))
        return states

    def evidence_after(self, nodes: Sequence[str]) -> list[Blame]:
        """The step failed by itself: healthd's drain (or Slurm's DOWN) may show a moment later."""
        deadline = self.doors.monotonic() + EVIDENCE_GRACE_SECONDS
        while True:
            states = self._states(nodes)
            suspects = hardware_suspects(nodes, states, {n: float("inf") for n, s in states.items()
                                                         if not_responding(s)}, 0.0)
            if suspects or self.doors.monotonic() >= deadline:
                return suspects
            self.doors.sleep(0.5)

    def _states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        states = {}
        for name in nodes:
            try:
                states[name] = self.doors.node_state(name)
            except SlurmCommandError as exc:
                self.doors.say(f"cannot read {name} from Slurm ({exc}); judging without it")
        return states

    def _hang_policy(self, signals: SignalPolicy) -> HangPolicy:
        """The spec's hang timeouts, widened to what the report channel can tell apart: a node's
        records reach the agent up to a heartbeat late (two when a datagram is lost), so healthy
        ranks' reports differ by that much, and a node is only silent after `silent_after`."""
        r = self.spec.restart
        lag = 2 * signals.heartbeat + 1.0
        floor = max(r.hang_min_step_seconds, signals.silent_after)
        return HangPolicy(startup_timeout=r.hang_startup_seconds, checkpoint_timeout=r.hang_checkpoint_seconds,
                          safety_factor=r.hang_safety_factor, min_step_timeout=floor,
                          max_step_timeout=max(1800.0, floor), silence_gap=max(HangPolicy.silence_gap, lag),
                          liveness_gap=max(HangPolicy.liveness_gap, lag))


def probe_suspects(signals: Signals, silent_after: float, batch_host: str, probes: Probes, prober: NodeProber,
                   now: float) -> tuple[Probes, list[Blame]]:
    """One look of the agent's second witness: the suspected nodes (named by a neighbour, or silent to the
    agent), their finished probes taken, those due probed again; the probes kept and the nodes now blamed
    `unreachable` (launcher/pure/reachability.py).  The agent's own node is never suspected: if it were
    gone, so would be the agent."""
    suspected = dict(signals.witnessed)
    for node in signals.silent:
        suspected.setdefault(node, f"the agent has not heard its reports for {silent_after:g} s or more")
    suspected.pop(batch_host, None)
    probes = probes.forget(set(suspected))
    for result in prober.finished():
        if result.node in suspected:
            probes = probes.took(result)
    for node in suspected:
        if probes.due(node, now):
            prober.start(node)
    return probes, unreachable(suspected, probes)
