"""Benchmark the in-job signal path: node reports over UDP to the agent, against the old rank files and sinfo reads.

    .venv/bin/python bench/signals_bench.py [--nodes 12500] [--trials 20] [--straggler-trials 5] \\
        [--steady-trials 5] [--steady-seconds 40] [--json PATH]
    .venv/bin/python bench/signals_bench.py --quick --json /tmp/signals-quick.json   # the smoke test's size
    .venv/bin/python bench/signals_bench.py --metrics-cost [--pairs 5] --json /tmp/metrics-12500.json

What is REAL, in this (the measuring) process: the agent's ear, a `ReportInbox` bound on 127.0.0.1
with a per-run random key, and a `SignalWatch` (the real `NodeSignals` judgement, `SignalPolicy.
for_nodes(N)`), polled as the agent's `_watch` loop polls it: `poll()` then a STEP_POLL_SECONDS
(0.2 s) sleep; once per heartbeat the fresh nodes' records are fed to a real `StragglerWatch(StragglerPolicy())`
and to a real `HangWatch(HangPolicy())`, its verdict judged, in parts as StepWatch does (from a checkout of
the code before, every record in one whole feed: `IN_PARTS`)
(--no-hang-watch leaves it out), and once per max(2 s,
heartbeat) the agent summary is written with `write_agent_summary` into a temp dir, as the agent
does.  Nothing asks Slurm: the single-node query the agent makes on a hint (a drained or silent
node) and its sweep (`slurm_sweep_seconds`) are not run; their cost is given as derived figures.

What is SIMULATED: the node reporters.  `--nodes` nodes x 8 ranks, split over `--senders` (1-2)
processes, each sending real signed datagrams with `ReportSender` over loopback: every node one
report per heartbeat (`heartbeat_seconds(N)`), the nodes' sends spread evenly over the heartbeat,
and a report AT ONCE when its state changes (healthd's verdict, a rank's process stopped), as the
real reporter does.  Every rank steps at 1 step per `--step-seconds` (default 1 s; steps start at
100, a job well past its warm-up) computing 0.4 s a step (each node within +-2%).  Faults are
passed from this process to the senders over a Pipe; their time is this process's time.time()
(one host, one clock).  The reporter's own delay in noticing a change (its /proc scan, healthd's
state file) is not simulated: the reporter is told at once.

Measured:
  (a) drain: healthd drains one node while its ranks run: its next report (sent at once) says
      verdict `drain`; latency from the injection until `poll()` returns it in `signals.drained`
      (the agent then asks Slurm once about that node before blaming: not included, see notes);
  (b) frozen: one node's ranks stop (SIGSTOP-like): its reports say process `stopped` with
      stopped_since = the injection; latency until `signals.frozen` names it (includes the
      policy's stopped_grace, 1.0 s, by design);
  (c) straggler: one node's compute per step becomes 1.5x (0.6 s against 0.4 s); latency until the
      straggler watch, fed once per heartbeat, reports it in `.found` (fewer trials: each takes
      2-4 heartbeats plus the watch's window of 30 steps);
  steady state: per second, over --steady-trials windows of --steady-seconds: reports and bytes
      received (the inbox's counters), this process's CPU (process_time / wall) and peak RSS
      (ru_maxrss), agent summaries written (files on shared storage), datagrams dropped (sent -
      received, and the socket's own drop counter from /proc/net/udp), poll() and per-heartbeat
      feed durations;
  OLD path, in the same run (after the senders stop): N x 8 rank progress files written with
      `write_rank_progress` into a temp dir on local disk (--old-trials chunks: ms per write) and
      read back with `read_progress` (--old-trials full reads); derived from the old code: files
      rewritten per second (one per rank per second), the old per-node sinfo schedule
      max(2, 0.25 x N) s (how late a drain whose ranks keep running was seen) and its RPCs per
      second.

--metrics-cost measures instead what the training metrics (issue #26) add to the agent, old against
new in the same run: after start-up, --pairs pairs of steady windows, alternating (a busy machine slows
both alike), "old" (reports without `metrics`, no `SignalWatch.training()` at the summary: today's agent)
and "new" (every report carries its node's `NodeMetrics`, growing counters and a loss; the summary
computes `training()` for the step's 100,000 GPUs and writes it), each after a heartbeat and a second
unmeasured so that the nodes' reports have all switched: the agent's CPU share, bytes/s, report size,
and the time of `training()` per summary.  In-process, no socket, --trials trials alternating: `decode`
of every node's report with and without metrics (µs per report), and `training()` over every node
(ms per summary).  The latency trials and the old file path are not run.

Figures: median, p50 and p99 (nearest rank: with 20 trials p99 is the largest) and min-max over the
trials.  A table on stdout, everything in --json; progress on stderr.  The default run at 12,500
nodes takes about 12 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import os
import random
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stats import percentile  # noqa: E402

from clusterctl.launcher.job.agent_doors import collect_garbage_rarely  # noqa: E402
from clusterctl.launcher.job.agent_outputs import SUMMARY_MIN_SECONDS  # noqa: E402
from clusterctl.launcher.job import step_watch  # noqa: E402
from clusterctl.launcher.job.step_watch import STEP_POLL_SECONDS, probe_suspects  # noqa: E402
from clusterctl.launcher.job.node_probe import NodeProber  # noqa: E402
from clusterctl.launcher.job.report_channel import ReportInbox, ReportSender  # noqa: E402
from clusterctl.launcher.job.reporter import TICK as REPORTER_TICK  # noqa: E402
from clusterctl.launcher.job.signal_watch import SignalWatch  # noqa: E402
from clusterctl.launcher.pure.classify import Blame  # noqa: E402
from clusterctl.launcher.pure.hang_watch import HangPolicy, HangWatch  # noqa: E402
from clusterctl.launcher.pure.node_signals import (  # noqa: E402
    SMALL_STEP_NODES, SignalPolicy, Signals, heartbeat_seconds, slurm_sweep_seconds,
)
from clusterctl.launcher.pure.peer_watch import PEER_BEAT_SECONDS, PeerWatch, neighbours  # noqa: E402
from clusterctl.launcher.pure.reachability import PROBE_TIMEOUT_SECONDS, Probes  # noqa: E402
from clusterctl.launcher.pure.straggler_watch import StragglerPolicy, StragglerWatch  # noqa: E402
from clusterctl.records.agent_summary import AgentSummary, write_agent_summary  # noqa: E402
from clusterctl.records.node_report import NodeHealth, NodeMetrics, NodeReport, RankBeat, decode, encode  # noqa: E402
from clusterctl.records.rank_progress import RankProgress, read_progress, write_rank_progress  # noqa: E402

RANKS_PER_NODE = 8
COMPUTE_S = 0.4
SLOW_FACTOR = 1.5
FIRST_STEP = 100
JOB_ID = "4242"
LAUNCH = "0"
TOKENS_PER_RANK_STEP = 4096.0
FLOPS_PER_TOKEN = 6 * 70e9  # a 70B-parameter dense model
GPU = "NVIDIA H100 80GB HBM3"
SINGLE_NODE_QUERY = "one `sinfo -n NODE` (REQUEST_NODE_INFO_SINGLE): 0.1-0.5 ms of controller time, ~0.01 s client wall"
TABLE_READ = "one node-table read (REQUEST_NODE_INFO, 12,500 nodes): 34-70 ms of controller time, 15 MB"


def say(message: str) -> None:
    print(f"signals-bench {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)


def spread(values: list[float]) -> dict[str, Any]:
    """Median, p50, p99 (nearest rank), min and max of finite values; `n` counts them all, `missed` the infinite."""
    finite = [v for v in values if math.isfinite(v)]
    out: dict[str, Any] = {"n": len(values), "missed": len(values) - len(finite)}
    if finite:
        out.update({"median": statistics.median(finite), "p50": percentile(finite, 0.5),
                    "p99": percentile(finite, 0.99), "min": min(finite), "max": max(finite)})
    return out


def node_name(index: int) -> str:
    return f"gpu{index + 1:05d}"


# ---- the simulated reporters (sender processes) ------------------------------------------------------
@dataclass
class SimNode:
    """One simulated node: its ranks step at the job's pace; what its reporter would send."""

    name: str
    index: int
    offset: float
    """Seconds into each heartbeat at which its periodic report goes out."""
    speed: float
    seq: int = 0
    verdict: str = "ok"
    state_at: float = 0.0
    stopped_since: float = 0.0
    """> 0: every rank's process is stopped since then (epoch s)."""
    lag: float = 0.0
    """Seconds the ranks spent stopped so far (they step again from where they stopped)."""
    rate: float = COMPUTE_S
    anchor_step: int = FIRST_STEP
    anchor_compute: float = 0.0
    cut: bool = False
    """Its link is cut: it sends nothing (its reports and its beats to its neighbours stop)."""
    watching: dict[str, PeerWatch] = field(default_factory=dict)
    """Its watch of each neighbour that was cut (the real PeerWatch): named in its reports once silent."""


@dataclass(frozen=True)
class SenderConfig:
    key: bytes
    port: int
    nodes: int
    heartbeat: float
    step_seconds: float
    t0: float


def step_of(node: SimNode, cfg: SenderConfig, now: float) -> int:
    t = node.stopped_since if node.stopped_since else now
    return FIRST_STEP + max(0, int((t - cfg.t0 - node.lag) / cfg.step_seconds))


def compute_of(node: SimNode, step: int) -> float:
    return node.anchor_compute + node.rate * node.speed * (step - node.anchor_step)


def set_rate(node: SimNode, cfg: SenderConfig, rate: float, now: float) -> None:
    step = step_of(node, cfg, now)
    node.anchor_compute, node.anchor_step, node.rate = compute_of(node, step), step, rate


def build_report(node: SimNode, cfg: SenderConfig, now: float, metrics: bool = False) -> NodeReport:
    """The node's report now; with `metrics`, its ranks' training metrics as its reporter sums them."""
    node.seq += 1
    step = step_of(node, cfg, now)
    step_at = cfg.t0 + node.lag + (step - FIRST_STEP) * cfg.step_seconds
    frozen = node.stopped_since > 0
    alive = node.stopped_since if frozen else now
    compute = compute_of(node, step)
    first = node.index * RANKS_PER_NODE
    ranks = tuple(RankBeat(RankProgress(rank, node.name, step, "step", step_at, 20_000 + rank % RANKS_PER_NODE,
                                        compute, step, alive),
                           "stopped" if frozen else "running", node.stopped_since)
                  for rank in range(first, first + RANKS_PER_NODE))
    evidence = ("healthd: drained (bench: injected fault)",) if node.verdict == "drain" else ()
    told = None
    if metrics:
        tokens = RANKS_PER_NODE * TOKENS_PER_RANK_STEP * (step - FIRST_STEP)
        told = NodeMetrics(alive, RANKS_PER_NODE, node.index, step, step_at, tokens, tokens * FLOPS_PER_TOKEN,
                           2.0 + 8.0 / step, step, first, 0.5 + 1.0 / step, step, first, GPU)
    peers = tuple(p for watch in node.watching.values() for p in watch.silent(now))
    return NodeReport(JOB_ID, LAUNCH, node.name, node.seq, now, ranks,
                      NodeHealth(node.verdict, evidence, node.state_at), metrics=told, silent_peers=peers)


def witness_at(cut_at: float, rng: random.Random) -> tuple[PeerWatch, float]:
    """A neighbour's watch of a node cut at `cut_at` and when its reporter first finds it silent: the last
    beat came up to PEER_BEAT_SECONDS before the cut, the reporter looks every TICK (a random phase)."""
    watch = PeerWatch(("cut",)).heard("cut", cut_at - rng.uniform(0.0, PEER_BEAT_SECONDS))
    at = cut_at + rng.uniform(0.0, REPORTER_TICK)
    while not watch.silent(at):
        at += REPORTER_TICK
    return watch, at


def sender_main(cfg: SenderConfig, indexes: list[int], conn: Connection, sent: Any, failed: Any) -> None:
    """One sender process: the reporters of `indexes`, each on its own heartbeat schedule; commands from `conn`."""
    rng = random.Random(indexes[0] if indexes else 0)
    nodes = {node_name(i): SimNode(node_name(i), i, i / cfg.nodes * cfg.heartbeat, rng.uniform(0.98, 1.02))
             for i in indexes}
    for node in nodes.values():
        node.anchor_compute = FIRST_STEP * node.rate * node.speed
        node.state_at = cfg.t0
    order = sorted(nodes.values(), key=lambda n: n.offset)
    sender = ReportSender(cfg.key, ("127.0.0.1", cfg.port))
    with_metrics = [False]

    def send(node: SimNode, now: float) -> None:
        if sender.send(build_report(node, cfg, now, with_metrics[0])):
            sent.value += 1
        else:
            failed.value += 1

    names = [node_name(i) for i in range(cfg.nodes)]
    witnesses: list[tuple[float, str, str, PeerWatch]] = []
    """(when, the witness, the cut node, the witness's watch of it): a neighbour finds a cut node silent."""
    cycle, at = 0, 0
    while order:
        due = cfg.t0 + cycle * cfg.heartbeat + order[at].offset
        if witnesses and witnesses[0][0] <= due:
            if conn.poll(max(0.0, witnesses[0][0] - time.time())):
                due = witnesses[0][0]  # a command first
            else:
                _, witness, cut, watch = witnesses.pop(0)
                holder = nodes[witness]
                holder.watching[cut] = PeerWatch((cut,), {cut: watch.heard_at["cut"]})
                if not holder.cut:
                    send(holder, time.time())  # a silent neighbour: at once
                continue
        if conn.poll(max(0.0, due - time.time())):
            command = conn.recv()
            kind = command[0]
            if kind == "stop":
                break
            if kind == "metrics":  # from the next report on, every node's carries its training metrics (or not)
                with_metrics[0] = bool(command[2])
                continue
            if kind in ("cut", "heal"):  # to every sender: the node's neighbours may be another's
                name, t = command[1], command[2]
                if name in nodes:
                    nodes[name].cut = kind == "cut"
                for peer in neighbours(names, name):
                    if peer not in nodes:
                        continue
                    if kind == "cut":
                        watch, when = witness_at(t, rng)
                        witnesses.append((when, peer, name, watch))
                        witnesses.sort(key=lambda w: w[0])
                    else:
                        witnesses[:] = [w for w in witnesses if w[2] != name]
                        if nodes[peer].watching.pop(name, None) is not None and not nodes[peer].cut:
                            send(nodes[peer], time.time())  # its neighbour beats again: at once
                if kind == "heal" and name in nodes:
                    send(nodes[name], time.time())
                continue
            node, t = nodes[command[1]], command[2]
            if kind == "drain":
                node.verdict, node.state_at = "drain", t
            elif kind == "freeze":
                node.stopped_since = t
            elif kind == "slow":
                set_rate(node, cfg, COMPUTE_S * SLOW_FACTOR, t)
                continue  # a slower compute is no change the reporter sends at once: the next heartbeat carries it
            elif kind == "restore":
                now = time.time()
                if node.stopped_since:
                    node.lag += now - node.stopped_since
                    node.stopped_since = 0.0
                if node.verdict != "ok":
                    node.verdict, node.state_at = "ok", now
                if node.rate != COMPUTE_S:
                    set_rate(node, cfg, COMPUTE_S, now)
            send(node, time.time())  # a change: at once
            continue
        now = time.time()
        while due <= now:
            if not order[at].cut:
                send(order[at], now)
            at += 1
            if at == len(order):
                at, cycle = 0, cycle + 1
            due = cfg.t0 + cycle * cfg.heartbeat + order[at].offset
    sender.close()
    conn.send(time.process_time())


@dataclass
class Senders:
    procs: list[Any]
    conns: list[Connection]
    sent: list[Any]
    failed: list[Any]
    count: int
    cpu_s: list[float] = field(default_factory=list)

    def command(self, kind: str, node: int, at: float) -> None:
        self.conns[node % self.count].send((kind, node_name(node), at))

    def everyone(self, kind: str, node: int, at: float) -> None:
        """A command for every sender (a cut node's neighbours may be another sender's)."""
        for conn in self.conns:
            conn.send((kind, node_name(node), at))

    def set_metrics(self, on: bool) -> None:
        """Every sender's reports carry training metrics from now on (or no more)."""
        for conn in self.conns:
            conn.send(("metrics", "", on))

    def total_sent(self) -> int:
        return sum(v.value for v in self.sent)

    def total_failed(self) -> int:
        return sum(v.value for v in self.failed)

    def stop(self) -> None:
        for conn in self.conns:
            conn.send(("stop",))
        for conn, proc in zip(self.conns, self.procs):
            if conn.poll(10):
                self.cpu_s.append(conn.recv())
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def start_senders(cfg: SenderConfig, count: int) -> Senders:
    ctx = multiprocessing.get_context("fork")
    procs, conns, sent, failed = [], [], [], []
    for k in range(count):
        mine, theirs = ctx.Pipe()
        sent.append(ctx.Value("q", 0, lock=False))
        failed.append(ctx.Value("q", 0, lock=False))
        proc = ctx.Process(target=sender_main, args=(cfg, list(range(k, cfg.nodes, count)), theirs, sent[-1],
                                                     failed[-1]), daemon=True, name=f"signals-bench-sender-{k}")
        proc.start()
        theirs.close()
        procs.append(proc)
        conns.append(mine)
    return Senders(procs, conns, sent, failed, count)


class GcMeter:
    """The cyclic collector's passes in this (the agent's) process: how many, by generation, and their CPU
    time (process time: on a loaded machine a niced process's wall time also counts the time it waits)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pauses: list[float] = []
        self.started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.process_time()
        else:
            self.pauses.append(time.process_time() - self.started)
            self.collections[info["generation"]] += 1

    def figures(self) -> dict[str, Any]:
        """Collections by generation, CPU seconds in all, the longest pause (CPU ms)."""
        return {"collections": list(self.collections), "seconds": sum(self.pauses),
                "longest_ms": 1e3 * max(self.pauses, default=0.0)}


GC = GcMeter()

FEED_PARTS = ("records", "hang_observe", "straggler_observe", "hang_verdict")
IN_PARTS = hasattr(HangWatch, "observing")
FEED_TURN_SECONDS = getattr(step_watch, "FEED_TURN_SECONDS", 0.0)
"""The code measured feeds its watches in parts between polls, the records of the nodes heard from since the
last feed only (issue #39); False: the code before it (one whole feed of every record per heartbeat), when
this file is run from a checkout of it to measure the old figure beside the new."""


class Agent:
    """The part of the agent's `_watch` loop that takes the reports: poll every STEP_POLL_SECONDS,
    the hang and straggler watches fed once per heartbeat, the summary once per max(2 s, heartbeat)."""

    def __init__(self, inbox: ReportInbox, nodes: list[str], policy: SignalPolicy, started_at: float,
                 job_dir: Path, hang_watch: bool) -> None:
        self.inbox, self.job_dir, self.nodes = inbox, job_dir, nodes
        self.watch = SignalWatch(inbox, JOB_ID, LAUNCH, nodes, policy, started_at)
        self.heartbeat = policy.heartbeat
        self.stragglers = StragglerWatch.start(StragglerPolicy(), started_at)
        self.hangs = HangWatch.start(HangPolicy(), started_at,
                                     {n * RANKS_PER_NODE + r: name for n, name in enumerate(nodes)
                                      for r in range(RANKS_PER_NODE)})
        self.hang_watch = hang_watch
        self.next_judge = self.next_summary = time.monotonic()
        self.signals = Signals()
        self.found: list[tuple[float, str]] = []
        self.hung_verdicts = 0
        self.summaries = 0
        self.poll_s: list[float] = []
        self.turn_s: list[float] = []
        """Each turn of the loop: its poll, the summary when due, and the feed's work done in it (no sleep)."""
        self.feed_s: list[float] = []
        """Each feed's work (its parts, not the polls between them)."""
        self.feed_wall_s: list[float] = []
        """Each feed from its start to its end (in parts: the polls between them too)."""
        self.feed_parts: dict[str, list[float]] = {part: [] for part in FEED_PARTS}
        self.feeding: Generator[None, None, None] | None = None
        self.phase = FEED_PARTS[0]
        self.this_feed: dict[str, float] = {}
        self.feed_started = 0.0
        self.on_feed: list[Callable[[], None]] = []
        """Run as the next feed starts (a trial's fault lands in a feed)."""
        self.actions: list[tuple[float, Callable[[], None]]] = []
        self.metrics = False
        """Compute the training metrics at each summary, as the new agent does (False: as the old one)."""
        self.training_s: list[float] = []
        self.training: Any = None
        self.cut: set[str] = set()
        """Nodes whose probe never answers (their link is cut): the probe's door says so."""
        self.prober = NodeProber(6818, time.monotonic, self._probe)
        self.probes = Probes()
        self.gone: list[Blame] = []
        """The nodes the agent's decision (StepWatch._unreachable) blames now: suspected and unanswered."""
        self.batch_host = nodes[0]

    def _probe(self, node: str, port: int) -> tuple[bool | None, str]:
        """The probe's door (node_probe.probe_once's place): a cut node answers nothing within the timeout."""
        if node in self.cut:
            time.sleep(PROBE_TIMEOUT_SECONDS)
            return False, f"no answer from {node}:{port} within {PROBE_TIMEOUT_SECONDS:g} s (bench: its link is cut)"
        return True, f"port {port} answered (bench)"

    def _unreachable(self) -> None:
        """StepWatch's own look (step_watch.probe_suspects): the suspected nodes (named by a neighbour, or silent), probed; those
        whose probes went unanswered are blamed."""
        self.probes, self.gone = probe_suspects(self.signals, self.watch.policy.silent_after, self.batch_host,
                                                self.probes, self.prober, time.monotonic())

    def tick(self) -> Signals:
        """One turn of the loop: the reports, the summary when due, and a feed's next part (or, in the old
        code, the whole feed) when one is due."""
        started = time.perf_counter()
        self.signals = self.watch.poll()
        self._unreachable()
        self.poll_s.append(time.perf_counter() - started)
        now = time.monotonic()
        if now >= self.next_summary:
            self.next_summary = now + max(SUMMARY_MIN_SECONDS, self.heartbeat)
            self._summarize()
        if self.feeding is not None:
            self._feed_turn()
        elif now >= self.next_judge:
            self.next_judge = now + self.heartbeat
            for action in self.on_feed:
                action()
            self.on_feed.clear()
            self.feed_started = time.perf_counter()
            if IN_PARTS:
                self.this_feed = {part: 0.0 for part in FEED_PARTS}
                self.feeding = self._feeding()
                self._feed_turn()
            else:
                self._feed_whole()
        self.turn_s.append(time.perf_counter() - started)
        return self.signals

    def _feeding(self) -> Generator[None, None, None]:
        """As StepWatch._feeding: the fresh nodes' records, each watch fed in parts, the verdict."""
        self.phase = "records"
        records, columns = fresh_feed(self.watch)
        yield
        self.phase = "hang_observe"
        if self.hang_watch:
            self.hangs = yield from self.hangs.observing(records())  # type: ignore[attr-defined]
        self.phase = "straggler_observe"
        if columns is not None:
            self.stragglers = yield from self.stragglers.observing_nodes(columns)  # type: ignore[attr-defined]
        else:
            self.stragglers = yield from self.stragglers.observing(records())  # type: ignore[attr-defined]
        self.found += [(time.time(), s.node) for s in self.stragglers.found]
        yield
        self.phase = "hang_verdict"
        if self.hang_watch and self.hangs.latest:
            verdict = yield from self.hangs.verdicting(time.time())  # type: ignore[attr-defined]
            self.hung_verdicts += verdict.hung

    def _feed_turn(self) -> None:
        """As StepWatch._feed_turn: parts of the feed for FEED_TURN_SECONDS (at least one)."""
        until = time.monotonic() + FEED_TURN_SECONDS
        self._feed_part()
        while self.feeding is not None and time.monotonic() < until:
            self._feed_part()

    def _feed_part(self) -> None:
        assert self.feeding is not None
        started = time.perf_counter()
        try:
            next(self.feeding)
            done = False
        except StopIteration:
            done = True
        self.this_feed[self.phase] += time.perf_counter() - started
        if done:
            self.feeding = None
            self.feed_wall_s.append(time.perf_counter() - self.feed_started)
            self.feed_s.append(sum(self.this_feed.values()))
            for part, seconds in self.this_feed.items():
                self.feed_parts[part].append(seconds)

    def _feed_whole(self) -> None:
        """The old code's feed: every record, each watch whole, the reports taken between the watches."""
        t = [time.perf_counter()]
        records = self.watch.records()
        t.append(time.perf_counter())
        if self.hang_watch:
            self.hangs = self.hangs.observe(records)
        t.append(time.perf_counter())
        if self._frozen_between_parts():
            return
        t[-1] += self.poll_s[-1]  # the poll between parts is not the feed's
        self.stragglers = self.stragglers.observe(records)
        self.found += [(time.time(), s.node) for s in self.stragglers.found]
        t.append(time.perf_counter())
        if self._frozen_between_parts():
            return
        t[-1] += self.poll_s[-1]
        if self.hang_watch and self.hangs.latest and self.hangs.verdict(time.time()).hung:
            self.hung_verdicts += 1
        t.append(time.perf_counter())
        parts = [b - a for a, b in zip(t, t[1:])]  # the polls between parts are not the feed's
        self.feed_s.append(sum(parts))
        self.feed_wall_s.append(t[-1] - t[0])
        for part, seconds in zip(FEED_PARTS, parts):
            self.feed_parts[part].append(seconds)

    def _frozen_between_parts(self) -> bool:
        """As agent._watch between the parts of a feed: take the reports; frozen ranks end the feed
        (the agent ends the step)."""
        started = time.perf_counter()
        self.signals = self.watch.poll()
        self.poll_s.append(time.perf_counter() - started)
        return self.signals.frozen is not None

    def _summarize(self) -> None:
        """As the agent's `_summarize`: one file rewritten per interval."""
        watch, signals = self.watch, self.signals
        steps = [r.step for r in watch.records()]
        stopped = tuple(sorted({h.report.node for h in watch.signals.heard.values()
                                for process in _processes(h.report) if process in ("stopped", "gone")}))
        training = None
        if self.metrics:
            started = time.perf_counter()
            training = self.training = watch.training(len(self.nodes) * RANKS_PER_NODE, None)
            self.training_s.append(time.perf_counter() - started)
        write_agent_summary(self.job_dir, AgentSummary(
            job_id=JOB_ID, launch=LAUNCH, at=time.time(), interval=max(SUMMARY_MIN_SECONDS, self.heartbeat),
            state="watching", nodes=len(self.nodes), reporting=signals.reporting, silent=signals.silent,
            stopped=stopped, drained=signals.drained, min_step=min(steps) if steps else None,
            max_step=max(steps) if steps else None, refused=dict(self.inbox.refused), training=training))
        self.summaries += 1

    def at(self, delay: float, action: Callable[[], None]) -> None:
        """Run `action` `delay` s from now, during the loop's sleeps (the loop's cadence is kept)."""
        self.actions.append((time.monotonic() + delay, action))
        self.actions.sort(key=lambda a: a[0])

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.actions and self.actions[0][0] <= end:
            when, action = self.actions.pop(0)
            time.sleep(max(0.0, when - time.monotonic()))
            action()
        time.sleep(max(0.0, end - time.monotonic()))

    def run(self, until: Callable[[Signals], bool], timeout: float) -> bool:
        """Poll as the agent does until `until(signals)` (True) or `timeout` s (False)."""
        deadline = time.monotonic() + timeout
        while True:
            if until(self.tick()):
                return True
            if time.monotonic() >= deadline:
                return False
            if self.feeding is None:  # as StepWatch: no sleep between the parts of a feed
                self.sleep(STEP_POLL_SECONDS)


# ---- the trials ------------------------------------------------------------------------------------
def _processes(report: NodeReport) -> Sequence[str]:
    """The report's ranks' processes: read from its columns where the code measured has them (the old: its beats)."""
    columns = getattr(report, "columns", None)
    return columns.process if columns is not None else [b.process for b in report.ranks]


def frozen_names(signals: Signals) -> set[str]:
    return {s.node for s in signals.frozen.suspects} if signals.frozen is not None else set()


def names_node(kind: str, name: str) -> Callable[[Signals], bool]:
    """Whether the judgement names `name`: in `drained` (kind `drain`) or among the frozen."""
    if kind == "drain":
        return lambda s: name in s.drained
    return lambda s: name in frozen_names(s)


def negate(test: Callable[[Signals], bool]) -> Callable[[Signals], bool]:
    return lambda s: not test(s)


def found_since(agent: Agent, name: str, before: int) -> Callable[[Signals], bool]:
    """Whether the straggler watch has found `name` since its `before`-th finding."""
    return lambda _: any(n == name for _, n in agent.found[before:])


def until_named(agent: Agent, injected: list[float], feeds: list[int], named: Callable[[Signals], bool],
                timeout: float) -> tuple[float, bool]:
    """Run the agent until the fault injected at `injected[0]` is `named`: the latency (inf: not within
    `timeout`), and whether the feed running at the injection (the `feeds[0]`-th) had not ended yet."""
    seen = agent.run(lambda s: bool(injected) and named(s), timeout)
    latency = time.time() - injected[0] if seen and injected else math.inf
    return latency, seen and len(agent.feed_wall_s) == feeds[0]


def latency_trials(agent: Agent, senders: Senders, kind: str, trials: int, rng: random.Random, nodes: int,
                   timeout: float, gap: tuple[float, float], mid_feed: list[bool]) -> list[float]:
    """(a) `drain` or (b) `freeze`: inject on a random node as a heartbeat's feed of the watches starts (the
    worst moment for a single-threaded loop), time until the judgement names it, restore.  `mid_feed` gets,
    per trial, whether the judgement named it before that feed ended."""
    latencies: list[float] = []
    used: set[int] = set()
    for trial in range(trials):
        index = rng.choice([i for i in range(nodes) if i not in used] or list(range(nodes)))
        used.add(index)
        name = node_name(index)
        agent.run(lambda s: False, rng.uniform(*gap))
        injected: list[float] = []
        feeds: list[int] = []

        def inject(index: int = index, injected: list[float] = injected, feeds: list[int] = feeds) -> None:
            injected.append(time.time())
            feeds.append(len(agent.feed_wall_s))  # feeds ended before the one that starts now
            senders.command(kind, index, injected[0])

        agent.on_feed.append(inject)
        named = names_node(kind, name)
        latency, during = until_named(agent, injected, feeds, named, timeout + agent.heartbeat)
        latencies.append(latency)
        mid_feed.append(during)
        say(f"{kind} trial {trial + 1}/{trials}: {name} seen after {latency:.3f} s, injected as a feed started; "
            + ("seen while that feed ran" if during else f"seen after that feed ended ({agent.feed_wall_s[-1]:.2f} s)"))
        senders.command("restore", index, time.time())
        agent.run(negate(named), timeout)
        agent.on_feed.clear()
    return latencies


def cut_trials(agent: Agent, senders: Senders, trials: int, rng: random.Random, nodes: int,
               timeout: float) -> tuple[list[float], list[bool]]:
    """(d) one node's link cut (not the batch host): its reports and beats stop, its two neighbours name
    it in their reports, the agent probes it (the probe's door never answers for it) and blames it.  Every
    other trial is injected as a heartbeat's feed starts, the others at a random moment; the latency
    runs from the cut to the agent's verdict, and whether that feed was still running is kept."""
    latencies: list[float] = []
    mid_feed: list[bool] = []
    used: set[int] = {0}  # the batch host is not cut here
    for trial in range(trials):
        index = rng.choice([i for i in range(nodes) if i not in used] or list(range(1, nodes)))
        used.add(index)
        name = node_name(index)
        agent.run(lambda s: False, rng.uniform(1.0, 2.0))
        injected: list[float] = []
        feeds: list[int] = []

        def cut(index: int = index, name: str = name, injected: list[float] = injected,
                feeds: list[int] = feeds) -> None:
            injected.append(time.time())
            feeds.append(len(agent.feed_wall_s))
            agent.cut.add(name)
            senders.everyone("cut", index, injected[0])

        on_feed = trial % 2 == 0
        if on_feed:
            agent.on_feed.append(cut)
        else:
            agent.at(rng.uniform(0.0, agent.heartbeat), cut)
        blamed = lambda s, name=name: any(b.node == name for b in agent.gone)  # noqa: E731
        latency, during = until_named(agent, injected, feeds, blamed, timeout + agent.heartbeat)
        latencies.append(latency)
        mid_feed.append(during)
        say(f"cut trial {trial + 1}/{trials}: {name} blamed after {latency:.3f} s, cut "
            + ("as a feed started; " + ("blamed while that feed ran" if during else "blamed after that feed ended")
               if on_feed else "at a random moment"))
        agent.cut.discard(name)
        senders.everyone("heal", index, time.time())
        agent.run(lambda s, name=name: name not in s.witnessed and not any(b.node == name for b in agent.gone),
                  timeout)
        agent.on_feed.clear()
    return latencies, mid_feed


def straggler_trials(agent: Agent, senders: Senders, trials: int, rng: random.Random, nodes: int,
                     timeout: float) -> list[float]:
    """(c): one node computes 1.5x from a random moment; time until the straggler watch finds it."""
    latencies: list[float] = []
    used: set[int] = set()
    for trial in range(trials):
        index = rng.choice([i for i in range(nodes) if i not in used] or list(range(nodes)))
        used.add(index)
        name = node_name(index)
        agent.run(lambda s: False, rng.uniform(0.0, agent.heartbeat))
        injected = time.time()
        senders.command("slow", index, injected)
        before = len(agent.found)
        seen = agent.run(found_since(agent, name, before), timeout)
        latency = next((at for at, n in agent.found[before:] if n == name), math.inf) - injected if seen else math.inf
        latencies.append(latency)
        others = sorted({n for _, n in agent.found[before:] if n != name})
        say(f"straggler trial {trial + 1}/{trials}: {name} found after {latency:.1f} s"
            + (f"; also flagged: {', '.join(others)}" if others else ""))
        senders.command("restore", index, time.time())
    return latencies


def socket_drops(port: int) -> int | None:
    """The kernel's drop counter of the inbox's socket (/proc/net/udp, last column), None if not found."""
    try:
        lines = Path("/proc/net/udp").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 13 and parts[1].endswith(f":{port:04X}"):
            return int(parts[-1])
    return None


def steady_state(agent: Agent, senders: Senders, trials: int, seconds: float) -> dict[str, Any]:
    windows = []
    for trial in range(trials):
        inbox = agent.inbox
        before = (time.monotonic(), time.process_time(), inbox.received, inbox.received_bytes, agent.summaries,
                  senders.total_sent(), len(agent.poll_s), len(agent.feed_s), agent.watch.signals.ignored)
        turns = len(agent.turn_s)
        agent.run(lambda s: False, seconds)
        after = (time.monotonic(), time.process_time(), inbox.received, inbox.received_bytes, agent.summaries,
                 senders.total_sent(), len(agent.poll_s), len(agent.feed_s), agent.watch.signals.ignored)
        wall = after[0] - before[0]
        window = {"seconds": wall, "cpu_share": (after[1] - before[1]) / wall,
                  "reports_per_s": (after[2] - before[2]) / wall, "bytes_per_s": (after[3] - before[3]) / wall,
                  "summary_files_per_s": (after[4] - before[4]) / wall,
                  "sent_minus_received": (after[5] - before[5]) - (after[2] - before[2]),
                  "polls": after[6] - before[6], "feeds": after[7] - before[7],
                  "longest_turn_ms": 1e3 * max(agent.turn_s[turns:], default=0.0),
                  "reporting": agent.signals.reporting, "silent": len(agent.signals.silent),
                  "channel_silent": agent.signals.channel_silent, "ignored": after[8] - before[8]}
        windows.append(window)
        say(f"steady window {trial + 1}/{trials}: {window['reports_per_s']:.0f} reports/s, "
            f"{window['bytes_per_s'] / 1e6:.2f} MB/s, CPU {100 * window['cpu_share']:.1f}% of a core, longest turn "
            f"{window['longest_turn_ms']:.0f} ms, "
            f"{window['reporting']} nodes reporting, sent-received {window['sent_minus_received']}")
    return {"windows": windows, **{key: spread([w[key] for w in windows]) for key in
                                   ("cpu_share", "reports_per_s", "bytes_per_s", "summary_files_per_s",
                                    "longest_turn_ms")}}


# ---- what the training metrics add (issue #26) -------------------------------------------------------
def metrics_windows(agent: Agent, senders: Senders, pairs: int, seconds: float, heartbeat: float) -> dict[str, Any]:
    """Steady windows alternating old (no metrics) and new (metrics in every report, training() at each
    summary), each after heartbeat + 1 s unmeasured (every node's newest report switched)."""
    windows: list[dict[str, Any]] = []
    for pair in range(pairs):
        for mode in (("old", "new") if pair % 2 == 0 else ("new", "old")):
            on = mode == "new"
            senders.set_metrics(on)
            agent.metrics = on
            agent.run(lambda s: False, heartbeat + 1.0)
            inbox = agent.inbox
            before = (time.monotonic(), time.process_time(), inbox.received, inbox.received_bytes,
                      len(agent.training_s))
            agent.run(lambda s: False, seconds)
            after = (time.monotonic(), time.process_time(), inbox.received, inbox.received_bytes,
                     len(agent.training_s))
            wall = after[0] - before[0]
            heard = agent.watch.signals.heard.values()
            carrying = sum(1 for h in heard if h.report.metrics is not None)
            window = {"mode": mode, "seconds": wall, "cpu_share": (after[1] - before[1]) / wall,
                      "reports_per_s": (after[2] - before[2]) / wall, "bytes_per_s": (after[3] - before[3]) / wall,
                      "bytes_per_report": (after[3] - before[3]) / max(1, after[2] - before[2]),
                      "training_ms": [t * 1e3 for t in agent.training_s[before[4]:after[4]]],
                      "nodes_with_metrics": carrying, "reporting": agent.signals.reporting}
            windows.append(window)
            say(f"metrics pair {pair + 1}/{pairs}, {mode}: CPU {100 * window['cpu_share']:.1f}% of a core, "
                f"{window['reports_per_s']:.0f} reports/s, {window['bytes_per_report']:.0f} B/report, "
                f"{carrying:,} nodes' reports with metrics"
                + (f", training() {statistics.median(window['training_ms']):.0f} ms" if window["training_ms"] else ""))
    senders.set_metrics(False)
    agent.metrics = False
    by_mode = {mode: [w for w in windows if w["mode"] == mode] for mode in ("old", "new")}
    return {"windows": windows, **{mode: {key: spread([w[key] for w in ws]) for key in
                                          ("cpu_share", "reports_per_s", "bytes_per_s", "bytes_per_report")}
                                   for mode, ws in by_mode.items()},
            "training_ms_per_summary": spread([t for w in by_mode["new"] for t in w["training_ms"]]),
            "last_training": agent.training.to_json() if agent.training is not None else None}


def metrics_in_process(nodes: int, trials: int, step_seconds: float, heartbeat: float) -> dict[str, Any]:
    """No socket: `decode` of every node's report with and without metrics, and `SignalWatch.training()` over
    every node (each call with every node's next report), trials alternating."""
    key = os.urandom(32)
    cfg = SenderConfig(key, 0, nodes, heartbeat, step_seconds, time.time() - 600.0)
    sims = [SimNode(node_name(i), i, 0.0, 1.0) for i in range(nodes)]
    decode_us: dict[str, list[float]] = {"old": [], "new": []}
    training_ms: list[float] = []
    for trial in range(trials):
        now = time.time()
        datagrams = {mode: [encode(build_report(n, cfg, now, mode == "new"), key) for n in sims]
                     for mode in ("old", "new")}
        for mode in (("old", "new") if trial % 2 == 0 else ("new", "old")):
            started = time.perf_counter()
            for datagram in datagrams[mode]:
                decode(datagram, key, "bench")
            decode_us[mode].append((time.perf_counter() - started) / nodes * 1e6)
    watch = SignalWatch(_ListInbox(), JOB_ID, LAUNCH, [n.name for n in sims], SignalPolicy.for_nodes(nodes),
                        time.time() - 600.0)
    for look in range(trials + 1):
        now = time.time() + look * heartbeat  # the next heartbeat's reports: counters grown, as at each summary
        watch.inbox.pending = [build_report(n, cfg, now, True) for n in sims]
        watch.poll()
        started = time.perf_counter()
        watch.training(nodes * RANKS_PER_NODE, None)
        if look:  # the first look only fills the meter
            training_ms.append((time.perf_counter() - started) * 1e3)
    return {"decode_us_per_report": {mode: spread(v) for mode, v in decode_us.items()},
            "decode_values": decode_us, "training_ms_per_summary": spread(training_ms),
            "training_values": training_ms}


class _ListInbox:
    """An inbox that hands over what was put in `pending` (no socket)."""

    port = 0
    refused: dict[str, int] = {}
    drains_cut_short = 0

    def __init__(self) -> None:
        self.pending: list[NodeReport] = []

    def drain(self, limit: int = 1 << 20) -> list[NodeReport]:
        taken, self.pending = self.pending, []
        return taken


def metrics_table(result: dict[str, Any]) -> str:
    steady, local = result["steady"], result["in_process"]
    summary_s = result["summary_interval_s"]
    training = steady["training_ms_per_summary"]
    rows = [
        f"# signals_bench --metrics-cost: {result['nodes']:,} nodes x {RANKS_PER_NODE} ranks, heartbeat "
        f"{result['heartbeat_s']:g} s, summary every {summary_s:g} s; {result['pairs']} pairs of "
        f"{result['steady_seconds']:g} s windows, old and new alternating",
        "",
        "| figure | old (no metrics) | new (metrics in every report, training() at each summary) |",
        "|---|---|---|",
        f"| agent CPU, share of one core | {fmt(steady['old']['cpu_share'], 100, 1)} % | "
        f"{fmt(steady['new']['cpu_share'], 100, 1)} % |",
        f"| bytes per report | {fmt(steady['old']['bytes_per_report'], digits=0)} | "
        f"{fmt(steady['new']['bytes_per_report'], digits=0)} |",
        f"| bytes received per second (MB/s) | {fmt(steady['old']['bytes_per_s'], 1e-6)} | "
        f"{fmt(steady['new']['bytes_per_s'], 1e-6)} |",
        f"| training() per summary, in the loop (ms) | - | {fmt(training, digits=0)}"
        + (f" = {training['median'] / 1e3 / summary_s * 100:.2f} % of a core" if "median" in training else "") + " |",
        f"| decode, in-process (µs per report) | {fmt(local['decode_us_per_report']['old'], digits=1)} | "
        f"{fmt(local['decode_us_per_report']['new'], digits=1)} |",
        f"| training() over every node, in-process (ms per summary) | - | "
        f"{fmt(local['training_ms_per_summary'], digits=0)} |",
        f"| files written on shared storage per second | {1 / summary_s:.3f} (the summary) | {1 / summary_s:.3f} "
        "(the same summary, with its `training`) |",
    ]
    return "\n".join(rows)


# ---- the old path ---------------------------------------------------------------------------------
def old_path(nodes: int, trials: int, directory: str | None) -> dict[str, Any]:
    """Today's file channel on local disk, and the old per-node sinfo schedule (derived)."""
    ranks = nodes * RANKS_PER_NODE
    job_dir = Path(tempfile.mkdtemp(prefix="signals-bench-old-", dir=directory))
    try:
        now = time.time()
        chunk = math.ceil(ranks / trials)
        write_ms = []
        for trial in range(trials):
            first, last = trial * chunk, min(ranks, (trial + 1) * chunk)
            if first >= last:
                break
            started = time.perf_counter()
            for rank in range(first, last):
                write_rank_progress(job_dir, RankProgress(rank, node_name(rank // RANKS_PER_NODE), 1000, "step", now,
                                                          20_000 + rank % RANKS_PER_NODE, 400.0, 1000, now))
            write_ms.append((time.perf_counter() - started) / (last - first) * 1e3)
            say(f"old path: wrote ranks {first}-{last - 1}: {write_ms[-1]:.3f} ms per file")
        read_s = []
        for _ in range(trials):
            started = time.perf_counter()
            records, problems = read_progress(job_dir, time.time())
            read_s.append(time.perf_counter() - started)
            if len(records) != ranks or problems:
                raise SystemExit(f"old path: read {len(records)} of {ranks} records, problems {problems[:3]}")
            say(f"old path: read {ranks} progress files: {read_s[-1]:.2f} s")
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    interval = max(2.0, 0.25 * nodes)  # node_read_interval, launcher/pure/classify.py before e9b4fa4
    return {"files": ranks, "disk": str(Path(directory or tempfile.gettempdir())),
            "write_ms_per_file": spread(write_ms), "read_s_per_full_read": spread(read_s),
            "derived": {"files_rewritten_per_s": ranks / 1.0, "metadata_ops_per_s": 4 * ranks / 1.0,
                        "write_busy_s_per_s": ranks * statistics.median(write_ms) / 1e3,
                        "node_read_interval_s": interval, "drain_seen_late_worst_s": interval,
                        "slurm_rpcs_per_s": nodes / interval, "sinfo_subprocesses_per_read": nodes}}


# ---- output ---------------------------------------------------------------------------------------
def fmt(stats: dict[str, Any], scale: float = 1.0, digits: int = 3) -> str:
    if "median" not in stats:
        return f"not seen ({stats.get('missed', 0)} of {stats.get('n', 0)} missed)"
    missed = f"; {stats['missed']} missed" if stats.get("missed") else ""
    return (f"median {stats['median'] * scale:.{digits}f} (p50 {stats['p50'] * scale:.{digits}f}, "
            f"p99 {stats['p99'] * scale:.{digits}f}, min-max {stats['min'] * scale:.{digits}f}-"
            f"{stats['max'] * scale:.{digits}f}; n={stats['n']}{missed})")


def table(result: dict[str, Any]) -> str:
    lat, steady, dg, old, new = (result["latency_s"], result["steady"], result["datagrams"], result["old"],
                                 result["new_derived"])
    c = lat["c_straggler"]
    parts = ", ".join(f"{part} {v.get('median', 0):.0f}" for part, v in result["agent"]["feed_ms_by_part"].items())
    fed = {k: sum(1 for n in v if n) for k, v in lat["seen_while_the_feed_ran"].items()}
    agent = result["agent"]
    interval = old["derived"]["node_read_interval_s"]
    rows = [
        f"# signals_bench: {result['nodes']:,} nodes x {RANKS_PER_NODE} ranks, heartbeat {result['heartbeat_s']:g} s, "
        f"{result['senders']} sender processes, step every {result['step_seconds']:g} s",
        "",
        "| figure | new: node reports (measured unless marked) | old: rank files + per-node sinfo |",
        "|---|---|---|",
        f"| (a) healthd drains a node, ranks running: s to the agent's verdict | {fmt(lat['a_drain'])} "
        f"+ one single-node Slurm query (not run) | up to {old['derived']['node_read_interval_s']:,.0f} s "
        f"(derived: the per-node sinfo schedule) |",
        f"| (b) a node's ranks frozen: s to `signals.frozen` (incl. {result['policy']['stopped_grace']:g} s grace) | "
        f"{fmt(lat['b_frozen'])} | the hang watch's step timeout (≥ 30 s), then the next file read: up to "
        f"{interval:,.0f} s + 30 s (derived) |",
        f"| (c) one node 1.5x slower: s to the straggler watch's finding | {fmt(c['latency'], digits=1)}; window "
        f"{c['window_steps']} steps = {c['window_s']:g} s, fed every {result['heartbeat_s']:g} s: bound "
        f"{c['bound_s']:g} s | same watch fed by the file read every {interval:,.0f} s: 2-3 reads, up to "
        f"{3 * interval:,.0f} s (derived) |",
        f"| (d) a node's link cut: s to the agent's verdict (neighbours' reports + 2 unanswered probes) | "
        f"{fmt(lat['d_cut'])} | Slurm's NOT_RESPONDING + 30 s (SlurmdTimeout 300 s: minutes) |",
        f"| Slurm RPCs per second | 0 from reports; sweep {new['sweep_table_reads_per_s']:.4f} table reads/s "
        f"(derived, 1/{new['sweep_seconds']:g} s) | {old['derived']['slurm_rpcs_per_s']:.1f} single-node reads/s "
        f"(derived; {old['derived']['sinfo_subprocesses_per_read']:,} sinfo processes per read) |",
        f"| files written on shared storage per second | {fmt(steady['summary_files_per_s'])} (the agent summary; "
        f"derived {new['summary_files_per_s']:.3f}) | {old['derived']['files_rewritten_per_s']:,.0f} "
        f"(derived: one per rank per s; ~{old['derived']['metadata_ops_per_s']:,.0f} metadata ops/s) |",
        f"| bytes received per second (MB/s) | {fmt(steady['bytes_per_s'], 1e-6)} | - |",
        f"| reports received per second | {fmt(steady['reports_per_s'], digits=0)} | - |",
        f"| agent CPU, share of one core | {fmt(steady['cpu_share'], 100, 1)} % | read of {old['files']:,} files: "
        f"{fmt(old['read_s_per_full_read'], digits=2)} s each |",
        f"| agent peak RSS | {result['peak_rss_mb']:.0f} MB | - |",
        f"| one rank file write (local disk) | - | {fmt(old['write_ms_per_file'])} ms |",
        f"| datagrams: sent / received / dropped | {dg['sent']:,} / {dg['received']:,} / {dg['dropped']:,} "
        f"(socket drop counter {dg['socket_drops']}; refused {dg['refused']}; send failures {dg['send_failed']}) | - |",
        f"| poll() (ms) | {fmt(result['agent']['poll_ms'], digits=2)} | - |",
        f"| per-heartbeat feed of the watches (ms of work) | {fmt(agent['feed_ms'], digits=0)}; "
        f"by part (median ms): {parts} | - |",
        f"| that feed from start to end (ms of wall, polls between parts included) | "
        f"{fmt(agent['feed_wall_ms'], digits=0)}; {'in parts' if agent['feed_in_parts'] else 'whole'} | - |",
        f"| one turn of the loop (ms; poll, summary, feed work) | {fmt(agent['turn_ms'], digits=1)}; "
        f"{agent['turns_over_50_ms']} of {agent['turns']:,} over 50 ms | - |",
        f"| longest turn per steady window (ms) | {fmt(steady['longest_turn_ms'], digits=0)} | - |",
        f"| (a)/(b) trials injected as a feed started, seen while it ran | {fed['a_drain']} of "
        f"{len(lat['values']['a_drain'])} / {fed['b_frozen']} of {len(lat['values']['b_frozen'])} | - |",
        f"| (d) cut trials seen while a feed ran (half are cut as a feed starts) | {fed['d_cut']} of "
        f"{len(lat['values']['d_cut'])} | - |",
        f"| the collector: collections (by generation), s in all, longest pause (ms) | "
        f"{result['gc']['collections']}, {result['gc']['seconds']:.2f} s, {result['gc']['longest_ms']:.0f} ms | - |",
    ]
    return "\n".join(rows + ["", *(f"- {note}" for note in result["notes"])])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=12_500)
    p.add_argument("--trials", type=int, default=20, help="trials of (a) and (b)")
    p.add_argument("--straggler-trials", type=int, default=5, help="trials of (c): each takes 2-4 heartbeats + 30 steps")
    p.add_argument("--cut-trials", type=int, default=6, help="trials of (d): a node's link cut")
    p.add_argument("--steady-trials", type=int, default=5)
    p.add_argument("--steady-seconds", type=float, default=40.0, help="length of each steady-state window")
    p.add_argument("--old-trials", type=int, default=5, help="chunks of the old files' writes, and full reads")
    p.add_argument("--senders", type=int, default=2, choices=(1, 2))
    p.add_argument("--step-seconds", type=float, default=1.0, help="the simulated job's step time")
    p.add_argument("--old-dir", help="where the old path's rank files go (default: the temp dir; local disk)")
    p.add_argument("--seed", type=int, default=23)
    p.add_argument("--no-hang-watch", dest="hang_watch", action="store_false",
                   help="do not feed the hang watch (observe + verdict) each heartbeat; agent._watch does, and so does "
                        "this benchmark by default")
    p.add_argument("--metrics-cost", action="store_true",
                   help="measure what the training metrics add to the agent, old and new alternating (see above)")
    p.add_argument("--pairs", type=int, default=5, help="--metrics-cost: pairs of old/new steady windows")
    p.add_argument("--cpu-replay", type=int, default=0, metavar="HEARTBEATS",
                   help="only the agent's CPU per heartbeat, replayed in-process on a simulated clock for this many "
                        "heartbeats (after two unmeasured): no sockets, no waiting; see cpu_replay")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes for the smoke test: 50 nodes, 2 trials, 1 s steady windows, 0.05 s steps")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.trials, args.straggler_trials, args.pairs, args.cut_trials = 50, 2, 1, 1, 2
        args.steady_trials, args.steady_seconds, args.old_trials, args.step_seconds = 2, 1.0, 2, 0.05
    if args.nodes < 4 or args.trials < 1 or args.steady_trials < 1 or args.old_trials < 1 or args.step_seconds <= 0:
        p.error("need at least 4 nodes, 1 trial of each kind and a positive step time")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    rng = random.Random(args.seed)
    python_default_gc = gc.get_threshold()
    collect_garbage_rarely()  # as the agent's process does (launcher/job/__main__.py)
    if args.cpu_replay:
        replay = cpu_replay(args.nodes, args.cpu_replay, args.hang_watch)
        print(f"cpu replay, {args.nodes:,} nodes: agent CPU {fmt(replay['cpu_share'], 100, 1)} % of a core; "
              f"collector {replay['gc']}")
        if args.json:
            Path(args.json).write_text(json.dumps(replay, indent=2) + "\n")
        return 0
    nodes = [node_name(i) for i in range(args.nodes)]
    policy = SignalPolicy.for_nodes(args.nodes)
    heartbeat = heartbeat_seconds(args.nodes)
    key = os.urandom(32)
    inbox = ReportInbox(key, host="127.0.0.1")
    rcvbuf = inbox.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    job_dir = Path(tempfile.mkdtemp(prefix="signals-bench-job-"))
    t0 = time.time()
    say(f"{args.nodes:,} nodes x {RANKS_PER_NODE} ranks, heartbeat {heartbeat:g} s, inbox 127.0.0.1:{inbox.port} "
        f"(receive buffer {rcvbuf:,} bytes), {args.senders} sender processes")
    senders = start_senders(SenderConfig(key, inbox.port, args.nodes, heartbeat, args.step_seconds, t0), args.senders)
    agent = Agent(inbox, nodes, policy, t0 - 1.0, job_dir, args.hang_watch)
    try:
        all_in = agent.run(lambda s: s.reporting == args.nodes, heartbeat * 3 + 10)
        startup_s = time.time() - t0
        say(f"start-up: {agent.signals.reporting:,} of {args.nodes:,} nodes reporting after {startup_s:.1f} s")
        if not all_in:
            raise SystemExit("not every node reported within three heartbeats: the channel is not working")
        if args.metrics_cost:
            return metrics_main(args, agent, senders, heartbeat, startup_s)
        timeout = max(10.0, 3 * heartbeat)
        gap = (0.2, 0.5) if args.quick else (1.0, 2.0)
        drain_fed: list[bool] = []
        frozen_fed: list[bool] = []
        say(f"(a) healthd drains a node: {args.trials} trials")
        drain = latency_trials(agent, senders, "drain", args.trials, rng, args.nodes, timeout, gap, drain_fed)
        say(f"(b) a node's ranks frozen: {args.trials} trials")
        frozen = latency_trials(agent, senders, "freeze", args.trials, rng, args.nodes, timeout, gap, frozen_fed)
        say(f"(d) a node's link cut: {args.cut_trials} trials")
        cut, cut_fed = cut_trials(agent, senders, args.cut_trials, rng, args.nodes, timeout)
        say(f"steady state: {args.steady_trials} windows of {args.steady_seconds:g} s")
        steady = steady_state(agent, senders, args.steady_trials, args.steady_seconds)
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        sp = StragglerPolicy()
        window_s = sp.window_steps * args.step_seconds
        steps_per_feed = heartbeat / args.step_seconds
        # The slow node's next report (<= 1 heartbeat), the feed after it (<= 1), a first slow read whose
        # steps do not count (<= 1 more when the onset's read was mixed), then window_steps in whole feeds.
        bound_s = heartbeat * (3 + math.ceil(sp.window_steps / max(1.0, steps_per_feed)))
        say(f"(c) one node 1.5x slower: {args.straggler_trials} trials (bound {bound_s:g} s each)")
        strag = straggler_trials(agent, senders, args.straggler_trials, rng, args.nodes, bound_s + 2 * heartbeat + 10)
        hung = agent.hung_verdicts
        before_stop = senders.total_sent()
        senders.stop()
        time.sleep(0.5)
        agent.tick()
        drops = socket_drops(inbox.port)
        sent, received = senders.total_sent(), inbox.received
        say(f"senders stopped: {sent:,} sent ({before_stop:,} before stop), {received:,} received, "
            f"socket drops {drops}")
    finally:
        if senders.procs and any(p.is_alive() for p in senders.procs):
            senders.stop()
        inbox.close()
        shutil.rmtree(job_dir, ignore_errors=True)
    gc.set_threshold(*python_default_gc)  # the old agent ran with Python's default
    say(f"old path: {args.nodes * RANKS_PER_NODE:,} rank files, {args.old_trials} trials")
    old = old_path(args.nodes, args.old_trials, args.old_dir)
    sweep = slurm_sweep_seconds(args.nodes)
    result: dict[str, Any] = {
        "nodes": args.nodes, "ranks": args.nodes * RANKS_PER_NODE, "heartbeat_s": heartbeat,
        "senders": args.senders, "step_seconds": args.step_seconds, "seed": args.seed, "hang_watch": args.hang_watch,
        "policy": {"heartbeat": policy.heartbeat, "silent_after": policy.silent_after,
                   "startup_grace": policy.startup_grace, "stopped_grace": policy.stopped_grace,
                   "poll_seconds": STEP_POLL_SECONDS},
        "startup_s_all_reporting": startup_s,
        "latency_s": {
            "a_drain": spread(drain), "b_frozen": spread(frozen),
            "c_straggler": {"latency": spread(strag), "window_steps": sp.window_steps, "window_s": window_s,
                            "margin": sp.margin, "bound_s": bound_s, "steps_per_feed": steps_per_feed},
            "d_cut": spread(cut),
            "values": {"a_drain": drain, "b_frozen": frozen, "c_straggler": strag, "d_cut": cut},
            "seen_while_the_feed_ran": {"a_drain": drain_fed, "b_frozen": frozen_fed, "d_cut": cut_fed}},
        "gc": GC.figures(),
        "steady": steady,
        "peak_rss_mb": peak_rss_mb,
        "datagrams": {"sent": sent, "received": received, "dropped": sent - received, "socket_drops": drops,
                      "refused": sum(inbox.refused.values()), "send_failed": senders.total_failed(),
                      "receive_buffer_bytes": rcvbuf},
        "agent": {"poll_ms": spread([s * 1e3 for s in agent.poll_s]),
                  "feed_ms": spread([s * 1e3 for s in agent.feed_s]),
                  "feed_wall_ms": spread([s * 1e3 for s in agent.feed_wall_s]),
                  "turn_ms": spread([s * 1e3 for s in agent.turn_s]),
                  "turns_over_50_ms": sum(1 for t in agent.turn_s if t > 0.05), "turns": len(agent.turn_s),
                  "feed_in_parts": IN_PARTS,
                  "feed_ms_by_part": {part: spread([s * 1e3 for s in v]) for part, v in agent.feed_parts.items()},
                  "feed_cpu_share_derived": (statistics.median(agent.feed_s) / heartbeat) if agent.feed_s else 0.0,
                  "hang_verdicts_hung": hung,
                  "ignored_reports": agent.watch.signals.ignored, "sender_cpu_s": senders.cpu_s},
        "new_derived": {"slurm_rpcs_per_s_from_reports": 0, "sweep_seconds": sweep,
                        "sweep_table_reads_per_s": 1 / sweep if args.nodes > SMALL_STEP_NODES else 0.0,
                        "sweep_single_node_queries_per_s": args.nodes / sweep if args.nodes <= SMALL_STEP_NODES
                        else 0.0,
                        "summary_files_per_s": 1 / max(SUMMARY_MIN_SECONDS, heartbeat)},
        "old": old,
        "notes": [
            f"(a) stops when poll() names the node; the agent then makes {SINGLE_NODE_QUERY} "
            "(shared/notes/fleet-scale.md, slurm/nodes.py) before it blames: not included.",
            "The reporter is told of a change at once: its own delay (its /proc scan, healthd's state file) is not in "
            "(a) or (b).",
            f"The sweep for what no report carries is {TABLE_READ} per {sweep:g} s (derived, not run).",
            f"(c) ran {args.straggler_trials} trials (not {args.trials}): each takes the watch's window "
            f"({sp.window_steps} steps = {window_s:g} s) plus 2-4 heartbeat feeds.",
            "p99 is by nearest rank: with 20 trials it is the largest value.",
            f"Old path's files are on {old['disk']} (local disk), not shared storage: on NFS/Lustre each "
            "open/rename is a network round trip; the old agent's sinfo schedule and RPCs are derived from its "
            "formula max(2, 0.25 x nodes) s, not run.",
            "Steady windows include every heartbeat's feed of the straggler watch"
            + (" and the hang watch" if args.hang_watch else " (not the hang watch: --no-hang-watch)")
            + " and the summary writes.",
            ("The agent's loop is single-threaded (as StepWatch): it feeds the watches the records of the nodes heard "
             "from since the last feed, in parts of a few ms, and takes the reports between two parts, so a drain or a "
             "frozen node waits for one part at most." if IN_PARTS else
             "The agent's loop is single-threaded (the old StepWatch): it takes the reports between the parts of a "
             "heartbeat's feed (after the hang watch's observe, after the straggler watch's), so a frozen node waits "
             "for one part at most; a drain waits for the feed's end."),
            "(a) and (b) inject each fault as a heartbeat's feed starts: the worst moment for the loop.",
        ],
        "seconds": round(time.monotonic() - started, 1),
    }
    text = table(result)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        say(f"wrote {args.json}")
    return 0


class _DatagramInbox:
    """ReportInbox.drain without the socket: the datagrams put in `pending`, checked and parsed (`decode`)."""

    port = 0

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.pending: list[bytes] = []
        self.refused: dict[str, int] = {}
        self.received = 0
        self.drains_cut_short = 0

    def drain(self, limit: int = 1 << 20) -> list[NodeReport]:
        taken, self.pending = self.pending, []
        self.received += len(taken)
        return [decode(datagram, self.key, "report from the replay") for datagram in taken]


def fresh_feed(watch: SignalWatch) -> tuple[Callable[[], Sequence[Any]], Sequence[Any] | None]:
    """As StepWatch._feeding takes the fresh nodes: the ranks' records (made when first asked for, once) and,
    where the tree has them (h-decode2 on), the nodes' rank columns the straggler watch reads instead."""
    if not hasattr(watch, "fresh_columns"):
        records = watch.fresh_records()  # type: ignore[attr-defined]  # not in the oldest code
        return lambda: records, None
    columns = watch.fresh_columns()
    made: list[Sequence[Any]] = []

    def records_of() -> Sequence[Any]:
        if not made:
            made.append(tuple(progress for ranks in columns for progress in ranks.progress()))
        return made[0]
    return records_of, columns


def cpu_replay(nodes: int, heartbeats: int, hang_watch: bool) -> dict[str, Any]:
    """The agent's CPU per heartbeat at `nodes` nodes, replayed in this process on a simulated clock: every
    node's report of each heartbeat is made and signed beforehand (not measured), then taken as the agent
    takes them, STEP_POLL_SECONDS of reports per poll (`decode` and `SignalWatch.poll`), one feed of the
    watches and one summary per heartbeat; the CPU time of that over the heartbeat is the agent's share of a
    core, whatever else runs on the machine (a loaded machine stretches the wall time, hardly the CPU time).
    The first two heartbeats fill the watches and are not measured."""
    key = os.urandom(32)
    heartbeat, policy = heartbeat_seconds(nodes), SignalPolicy.for_nodes(nodes)
    t0 = time.time()
    cfg = SenderConfig(key, 0, nodes, heartbeat, 1.0, t0)
    rng = random.Random(5)
    sims = [SimNode(node_name(i), i, i / nodes * heartbeat, rng.uniform(0.98, 1.02)) for i in range(nodes)]
    for sim in sims:
        sim.anchor_compute, sim.state_at = FIRST_STEP * sim.rate * sim.speed, t0
    clock = [t0]
    inbox = _DatagramInbox(key)
    names = [sim.name for sim in sims]
    watch = SignalWatch(inbox, JOB_ID, LAUNCH, names, policy, t0 - 1.0, clock=lambda: clock[0])
    stragglers = StragglerWatch.start(StragglerPolicy(), t0 - 1.0)
    hangs = HangWatch.start(HangPolicy(), t0 - 1.0, {n * RANKS_PER_NODE + r: name for n, name in enumerate(names)
                                                     for r in range(RANKS_PER_NODE)})
    polls = round(heartbeat / STEP_POLL_SECONDS)
    job_dir = Path(tempfile.mkdtemp(prefix="signals-bench-replay-"))
    cpu: list[float] = []
    try:
        for beat in range(heartbeats + 2):
            slots: list[list[bytes]] = [[] for _ in range(polls)]
            for sim in sims:  # each node's report of this heartbeat, in the poll after its send time
                slot = min(polls - 1, int(sim.offset / STEP_POLL_SECONDS))
                sent = t0 + beat * heartbeat + sim.offset
                slots[slot].append(encode(build_report(sim, cfg, sent), key))
            started = time.process_time()
            for slot, datagrams in enumerate(slots):
                clock[0] = t0 + beat * heartbeat + (slot + 1) * STEP_POLL_SECONDS
                inbox.pending = datagrams
                signals = watch.poll()
                if slot == 0:  # the heartbeat's feed (whole: its parts cost the same) and the summary
                    records, columns = fresh_feed(watch)
                    if hang_watch:
                        hangs = hangs.observe(records())
                    stragglers = stragglers.observe_nodes(columns) if columns is not None \
                        else stragglers.observe(records())  # type: ignore[attr-defined]
                    if hang_watch and hangs.latest:
                        hangs.verdict(clock[0])
                    steps = watch.signals.step_range() if hasattr(watch.signals, "step_range") \
                        else (lambda all_steps: (min(all_steps), max(all_steps)) if all_steps else None)(
                            [r.step for r in watch.records()])
                    write_agent_summary(job_dir, AgentSummary(
                        job_id=JOB_ID, launch=LAUNCH, at=clock[0], interval=max(SUMMARY_MIN_SECONDS, heartbeat),
                        state="watching", nodes=nodes, reporting=signals.reporting, silent=signals.silent,
                        stopped=(), drained=signals.drained, min_step=steps[0] if steps else None,
                        max_step=steps[1] if steps else None, refused={}, training=None))
            spent = time.process_time() - started
            if beat >= 2:
                cpu.append(spent / heartbeat)
                say(f"cpu replay: heartbeat {beat - 1}/{heartbeats}: {spent:.2f} s of CPU = "
                    f"{100 * cpu[-1]:.1f}% of a core; {signals.reporting:,} nodes reporting")
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    return {"nodes": nodes, "heartbeat_s": heartbeat, "polls_per_heartbeat": polls, "reports": inbox.received,
            "cpu_share": spread(cpu), "values": cpu, "gc": GC.figures(), "hang_watch": hang_watch}


def metrics_main(args: argparse.Namespace, agent: Agent, senders: Senders, heartbeat: float,
                 startup_s: float) -> int:
    """--metrics-cost: the steady windows old and new, then the in-process figures; table and --json."""
    say(f"metrics cost: {args.pairs} pairs of {args.steady_seconds:g} s windows, old and new alternating")
    steady = metrics_windows(agent, senders, args.pairs, args.steady_seconds, heartbeat)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    senders.stop()
    say(f"metrics cost: in-process decode and training(), {max(5, args.trials)} trials")
    local = metrics_in_process(args.nodes, max(5, args.trials), args.step_seconds, heartbeat)
    result = {"nodes": args.nodes, "ranks": args.nodes * RANKS_PER_NODE, "heartbeat_s": heartbeat,
              "summary_interval_s": max(SUMMARY_MIN_SECONDS, heartbeat), "pairs": args.pairs,
              "steady_seconds": args.steady_seconds, "step_seconds": args.step_seconds, "seed": args.seed,
              "startup_s_all_reporting": startup_s, "peak_rss_mb": peak_rss_mb, "steady": steady,
              "in_process": local}
    print(metrics_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
