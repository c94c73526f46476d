"""healthd's applier: the journaled Slurm actions (drain, resume), applied one at a time on its own thread.

The main thread journals each planned action and hands it over (`actions`); the applier asks
Slurm about the node, takes the action through the drain door with healthd's rules
(healthd/drain_requests.py, clusterctl/slurm/drains.py), which decides and makes the one call,
journals the outcome and hands an `Applied` back.  While slurmctld cannot be reached it retries
the same action, waiting longer each time (up to 5 s).

What it owns, and which thread touches it:
  actions           the queue of planned actions: main thread in, applier thread out
  slots             the drain slots of the partition (`BreakerSlots`): the lock that settles a drain's
                    slot, also taken by the periodic thread when it gives a slot back (`give_back_slot`)
  applied_node      the node as the last applied call left it: applier thread (or a caller of `apply`)
  refusals          breaker refusals in a row: main thread only (`retry_after`)
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from clusterctl.clock import Clock
from clusterctl.errors import SlurmCommandError
from clusterctl.healthd import engine
from clusterctl.healthd.breaker import Breaker, node_partition
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.drain_requests import apply_decision, breaker_partition, drain_rules, planned_request
from clusterctl.healthd.journal import Journal, PlannedAction
from clusterctl.healthd.metrics import Metrics
from clusterctl.slurm import drains
from clusterctl.slurm.nodes import NodeSlurm, NodeState

log = logging.getLogger("healthd")


@dataclass(frozen=True)
class Applied:
    """The applier's outcome for one planned action."""

    action: PlannedAction
    decision: engine.ApplyDecision
    node: NodeState | None = None
    """The node as the applied call left it (None: unchanged, or not known)."""


class Applier:
    """Applies planned actions to this node in Slurm, exactly once each (the journal says which are done)."""

    def __init__(self, config: HealthdConfig, settings: engine.EngineSettings, *, slurm: NodeSlurm,
                 journal: Journal, metrics: Metrics, clock: Clock, jitter: Callable[[float, float], float],
                 stop: threading.Event, beat: Callable[[], None], report: Callable[[Applied], None]) -> None:
        self.config, self.settings = config, settings
        self.slurm, self.journal, self.metrics, self.clock, self.jitter = slurm, journal, metrics, clock, jitter
        self.stop, self.beat, self.report = stop, beat, report
        self.actions: queue.Queue[PlannedAction] = queue.Queue()
        """Planned (already journaled) actions waiting to be applied, in order."""
        self.applied_node: NodeState | None = None
        """The node as the last `apply` left it (None: not known)."""
        self.slots = BreakerSlots(Breaker(slurm, settings.node, config.breaker_dir, config.breaker_max_share,
                                          now=clock.now), clock)
        self._refusals = 0  # breaker refusals in a row: each doubles the wait before the next try

    def reconfigure(self, config: HealthdConfig, settings: engine.EngineSettings) -> None:
        """Use a reloaded configuration from the next action on (the breaker keeps its ledger)."""
        self.config, self.settings = config, settings

    def run(self) -> None:
        """The applier thread: actions left pending by an earlier healthd first, then each one handed over."""
        backoff = 0.2
        for action in self.journal.pending():  # decided before a restart: apply now, exactly once
            self.actions.put(action)
        while not self.stop.is_set():
            self.beat()
            try:
                action = self.actions.get(timeout=0.5)
            except queue.Empty:
                continue
            while not self.stop.is_set():
                try:
                    decision = self.apply(action)
                    break
                except SlurmCommandError as exc:
                    self.beat()
                    log.warning("slurm unreachable, will retry %s: %s", action.op, exc)
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
            else:
                return
            backoff = 0.2
            self.journal.done(action.id, decision.result)
            self.metrics.drain_actions.labels(action.op, decision.result).inc()
            log.info("%s node %s: %s (%s)", action.op, self.settings.node, decision.result, action.reason)
            self.report(Applied(action, decision, self.applied_node))

    def apply(self, action: PlannedAction) -> engine.ApplyDecision:
        """Ask Slurm about this node, let the engine decide, make the Slurm call it chose.

        With `breaker_dir` set, a drain claims one of the partition's slots in the shared ledger
        (healthd/breaker.py) and reads no node table.  Without it, a drain first waits a random
        time that grows with the partition (breaker_spread_per_node) when the breaker must count
        it, then reads this node again (it may have been drained meanwhile) and the partition's
        share.  Sets `applied_node` to the node as the call left it.
        Raises SlurmCommandError while Slurm cannot be reached (the applier retries).
        """
        self.applied_node = None
        node = self.slurm.state()
        partition = breaker_partition(self.settings, action, node)
        size = None
        # The spread only staggers the whole-table counts; a ledger claim reads no table.
        if partition and self.config.breaker_spread_per_node > 0 and self.config.breaker_dir is None:
            size = self.slurm.partition_size(partition)
            spread = size * self.config.breaker_spread_per_node
            if spread > 0 and self.stop.wait(self.jitter(0.0, spread)):
                raise SlurmCommandError(["healthd"], None, "stopping before the drain was decided")
            node = self.slurm.state()  # it may have been drained meanwhile: the door decides on this read
        with self.slots.settling() as breaker:  # the drain door: decide, claim the breaker's share, make the call
            done = drains.apply(self.slurm, drain_rules(self.settings), planned_request(self.settings, action),
                                breaker, node=node, partition_size=size)
        self.applied_node = done.after  # just read (and changed by the call): fresh whatever was decided
        decision = apply_decision(action.reason, done.verdict, self.clock.now())
        if decision.call == "resume":
            self.slots.breaker.release(node_partition(self.config.partition, node))
        elif decision.result == "dry-run":
            log.warning("dry run: would %s %s: %s", action.op, self.settings.node, action.reason)
        return decision

    def give_back_slot(self, node: NodeState, read_from: float) -> None:
        """With `node` as read from monotonic time `read_from` on: give back this node's breaker slot
        when it is back in service (or claim one for a drain the ledger missed).

        A read begun before a drain finished cannot give its slot back.
        """
        self.slots.give_back(node, node_partition(self.config.partition, node), read_from)

    def retry_after(self, decision: engine.ApplyDecision) -> float:
        """How long the engine waits before the breaker is asked again about a refused fault (main thread:
        once per applied action, in order): breaker_retry, doubling with each refusal in a row up to
        8 × breaker_retry, jittered ±20%."""
        self._refusals = self._refusals + 1 if decision.result == "breaker-open" else 0
        retry = min(self.settings.breaker_retry * 2 ** (self._refusals - 1), 8 * self.settings.breaker_retry)
        return retry * self.jitter(0.8, 1.2)


class BreakerSlots:
    """The breaker's drain slots as two threads share them: the applier settles a drain's slot
    (`settling`), the periodic thread gives one back after reading the node (`give_back`).

    One lock orders the two, and a read begun before a drain was settled gives nothing back (it
    may show the node as it was before the drain).
    """

    def __init__(self, breaker: Breaker, clock: Clock) -> None:
        self.breaker, self.clock = breaker, clock
        self._lock = threading.Lock()
        self._settled_at = float("-inf")  # monotonic time the last drain attempt's slot was settled

    @contextmanager
    def settling(self) -> Iterator[Breaker]:
        """Hold the lock while a drain claims or frees its slot; settled when the block ends, however it ends."""
        with self._lock:
            try:
                yield self.breaker
            finally:
                self._settled_at = self.clock.monotonic()

    def give_back(self, node: NodeState, partition: str | None, read_from: float) -> None:
        """Let the ledger agree with `node` (read from monotonic time `read_from` on), unless a drain
        was settled since the read began."""
        with self._lock:
            if read_from > self._settled_at:
                self.breaker.reconcile(node, partition)
