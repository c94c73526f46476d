"""One node's report to its job's agent: its ranks' progress and liveness, and healthd's verdict.

Sent by the node's reporter (clusterctl.launcher.job.reporter, one per node of a step) to the
job's agent (clusterctl.launcher.job.agent) as one UDP datagram over the job's own network: at
once when something the agent acts on changes (a rank's process stopped or gone, healthd's
verdict, a phase), else once per heartbeat.  One message per node, never one per rank, and
nothing on shared storage or slurmctld.

Wire format: ``MAGIC`` (4 bytes), an HMAC-SHA256 of the body under the job's secret key (32 bytes), then the
body: the record as compact UTF-8 JSON (versions 1 to 5; what a reporter before version 5 sends).  Version 5's
reporters send the compact framing instead (MAGIC_COLUMNS: the HMAC covers the magic too; the JSON without the
ranks, then their columns packed, 66 bytes a rank): `decode` tells the framings apart by the magic, after the
HMAC, and refuses one it does not know (``CCN`` and another digit, signed with the job's key) saying to upgrade
clusterctl.  The key is made by the agent
for each job and handed to the step's processes in the environment (REPORT_KEY_ENV): a datagram
from anyone else (another user's process on a shared node, a forged packet) fails the HMAC and
is refused before its body is parsed.  A datagram larger than MAX_DATAGRAM, or whose body is not
exactly this record (NaN or infinite numbers, unknown phases, bad node names, too many ranks or
evidence lines, more than MAX_REPORTED_COPIES checkpoint copies, another node's holdings) is refused
with a RecordError that says what is wrong.

Version 2 adds `checkpoints`: the node's multi-level checkpoint holdings
(clusterctl.records.checkpoint_holdings, its newest MAX_REPORTED_COPIES copies), or null when the
node has none to tell (multi-level checkpoints off, no holdings file yet, a damaged one).  A
version-1 report (an older reporter) is refused like any other version.

Version 3 adds `metrics`: what the node's ranks said of their training (`NodeMetrics`: their tokens
and FLOPs summed, the loss and gradient norm of the node's lowest rank that reported one, the node's
GPU model), a fixed handful of fields whatever the node's rank count (about 300 bytes: a report of 8
ranks is ~1.9 KB with them), or null when its ranks report none of it.  A version-2 report is read with
none.

Version 4 adds `silent_peers`: the node's neighbours (launcher/pure/peer_watch.py) whose beats it
has not heard for PEER_SILENT_SECONDS, each `{"node": ..., "silent_s": ...}`, at most MAX_SILENT_PEERS;
empty when every neighbour beats.  A version-2 or 3 report is read with none.

Version 5 sends `ranks` as columns, one list per field (`{"rank": [...], "step": [...], ...}`, RANK_COLUMNS, all
of one length) instead of one object per rank: the agent takes 625 reports a second at 12,500 nodes, and per-rank
objects were most of their parsing (docs/measured.md, "The agent at 12,500 nodes: CPU").  A decoded report keeps its
ranks as those columns (`RankColumns`, a sequence of RankBeat made only when read one by one): the agent's watches
read whole columns (`NodeReport.columns`).  A version-2 to 4 report (one object per rank) is still read.

The holdings carry their own version (clusterctl.records.checkpoint_holdings): holdings version 3 adds what
the node's checkpoint copy server refused (`copies_refused`, null while nothing was: at most six small counts
and a time, under 200 bytes) without a new report version; holdings of versions 1 and 2 are still read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from clusterctl.records.checkpoint_holdings import VERSION as HOLDINGS_VERSION
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy
from clusterctl.records.rank_progress import MAX_TOTAL, PHASES, RankProgress
from clusterctl.records.versioned import (
    RecordError, check_header, checked, count_field, dated_field, field, header, measured_field, measured_to_json,
    seconds_field, text_field,
)
from clusterctl.slurm.names import node_name_problem

KIND = "node-report"
VERSION = 5
OLDEST_VERSION = 2
READ_VERSIONS = (2, 3, 4, 5)
MAGIC = b"CCN1"
DIGEST_BYTES = 32
MAX_DATAGRAM = 16 << 10
"""The largest report taken (bytes): 8 ranks make about 0.8 KB compact (1.5 KB as JSON objects, before version 5),
and with 32 checkpoint copies about 5.9 KB (as JSON objects)
(6.0 KB with the node's last resume, 6.1 KB with its copy server's refusals; measured: tests/unit/test_node_report.py, well under one 8 KiB datagram); 64 ranks and 16 evidence lines fit."""
MAX_RANKS = 64
MAX_EVIDENCE = 16
MAX_TEXT = 512
KEY_BYTES = 32
MAX_REPORTED_COPIES = 32
"""The most checkpoint copies one report carries: the node's newest (retention keeps a handful)."""
MAX_GPU_NAME = 96
MAX_SILENT_PEERS = 2
"""A node watches two neighbours (launcher/pure/peer_watch.py)."""
"""The longest GPU model name carried (NVML's own buffer for a device name: NVML_DEVICE_NAME_V2_BUFFER_SIZE)."""

REPORT_KEY_ENV = "CLUSTERCTL_REPORT_KEY"
"""The job's report key, hex: set by the agent for the step's processes only."""
REPORT_ADDR_ENV = "CLUSTERCTL_REPORT_ADDR"
"""`host:port` of the agent's report inbox."""
REPORT_LAUNCH_ENV = "CLUSTERCTL_REPORT_LAUNCH"
"""Which of the agent's steps the reporter belongs to (reports of an ended step are not mistaken for the new one's)."""
REPORT_INTERVAL_ENV = "CLUSTERCTL_REPORT_INTERVAL"
"""Seconds between two heartbeats of a node whose report did not change."""

VERDICTS = ("ok", "drain", "unknown")
"""healthd's verdict for the node: `drain` when it drained (or decided to drain) it; `unknown` without healthd."""

PROCESS_STATES = ("running", "stopped", "gone", "unknown")
"""A rank's process as its node sees it (/proc): `stopped` by a signal (SIGSTOP) or a tracer, `gone`: exited."""


@dataclass(frozen=True)
class RankBeat:
    """One rank as its node's reporter sees it: its last progress report and its process's state."""

    progress: RankProgress
    process: str = "running"  # one of PROCESS_STATES
    stopped_since: float = 0.0
    """When the reporter first saw the process stopped or gone (epoch s; 0 while it runs)."""

    def to_json(self) -> dict[str, Any]:
        """The rank's entry in the report."""
        p = self.progress
        return {"rank": p.rank, "step": p.step, "phase": p.phase, "at": p.at, "pid": p.pid,
                "compute_s": p.compute_s, "compute_steps": p.compute_steps, "alive_at": p.alive_at,
                "process": self.process, "stopped_since": self.stopped_since}


RANK_COLUMNS = ("rank", "step", "phase", "at", "pid", "compute_s", "compute_steps", "alive_at", "process",
                "stopped_since")
"""The columns of a version-5 report's `ranks`, one list per field of RankBeat (the rank's progress and process)."""


class RankColumns(Sequence[RankBeat]):
    """A node's ranks as one tuple per field (RANK_COLUMNS), as a version-5 report carries them.

    A sequence of RankBeat (each made when first read, then kept); `progress()` makes only the ranks' progress
    records (what the hang and straggler watches take), and the columns themselves (`process`, `step`, ...) are
    read without making any.  The agent decodes 100,000 ranks a heartbeat at 12,500 nodes: the per-rank objects
    are made when a watch needs them, once each.  Equal to a tuple of the same RankBeats."""

    __slots__ = ("node", "rank", "step", "phase", "at", "pid", "compute_s", "compute_steps", "alive_at", "process",
                 "stopped_since", "_beats", "_progress")

    def __init__(self, node: str, rank: tuple[int, ...], step: tuple[int, ...], phase: tuple[str, ...],
                 at: tuple[float, ...], pid: tuple[int, ...], compute_s: tuple[float, ...],
                 compute_steps: tuple[int, ...], alive_at: tuple[float, ...], process: tuple[str, ...],
                 stopped_since: tuple[float, ...], beats: tuple[RankBeat, ...] | None = None) -> None:
        self.node, self.rank, self.step, self.phase, self.at, self.pid = node, rank, step, phase, at, pid
        self.compute_s, self.compute_steps, self.alive_at = compute_s, compute_steps, alive_at
        self.process, self.stopped_since = process, stopped_since
        self._beats = beats
        self._progress: tuple[RankProgress, ...] | None = None if beats is None else tuple(b.progress for b in beats)

    @classmethod
    def of(cls, node: str, beats: Sequence[RankBeat]) -> RankColumns:
        """The columns of `beats` (a node's ranks as its reporter made them: reading them back gives these very
        RankBeats, with every field of their progress)."""
        if isinstance(beats, RankColumns):
            return beats
        beats = tuple(beats)
        progress = [b.progress for b in beats]
        return cls(node, tuple(p.rank for p in progress), tuple(p.step for p in progress),
                   tuple(p.phase for p in progress), tuple(p.at for p in progress), tuple(p.pid for p in progress),
                   tuple(p.compute_s for p in progress), tuple(p.compute_steps for p in progress),
                   tuple(p.alive_at for p in progress), tuple(b.process for b in beats),
                   tuple(b.stopped_since for b in beats), beats)

    def to_json(self) -> dict[str, list[Any]]:
        """The ranks as a version-5 report sends them."""
        return {name: list(getattr(self, name)) for name in RANK_COLUMNS}

    def progress(self) -> tuple[RankProgress, ...]:
        """The ranks' progress records, in order (made at the first call, then the same ones)."""
        made = self._progress
        if made is None:
            node = self.node
            made = self._progress = tuple([checked(RankProgress, {
                "rank": rank, "node": node, "step": step, "phase": phase, "at": at, "pid": pid, "compute_s": compute_s,
                "compute_steps": compute_steps, "alive_at": alive_at, "tokens": 0.0, "flops": 0.0, "loss": None,
                "loss_step": None, "grad_norm": None, "grad_norm_step": None})
                for rank, step, phase, at, pid, compute_s, compute_steps, alive_at in zip(
                    self.rank, self.step, self.phase, self.at, self.pid, self.compute_s, self.compute_steps,
                    self.alive_at)])
        return made

    def beats(self) -> tuple[RankBeat, ...]:
        """The ranks as RankBeats, in order (made at the first call, then the same ones)."""
        made = self._beats
        if made is None:
            made = self._beats = tuple([
                checked(RankBeat, {"progress": progress, "process": process, "stopped_since": since})
                for progress, process, since in zip(self.progress(), self.process, self.stopped_since)])
        return made

    def __len__(self) -> int:
        return len(self.rank)

    @overload
    def __getitem__(self, index: int) -> RankBeat: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[RankBeat, ...]: ...

    def __getitem__(self, index: int | slice) -> RankBeat | tuple[RankBeat, ...]:
        return self.beats()[index]

    def __iter__(self) -> Iterator[RankBeat]:
        return iter(self.beats())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankColumns):
            return self.beats() == other.beats()
        if isinstance(other, tuple):
            return self.beats() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.beats())

    def __repr__(self) -> str:
        return f"RankColumns({self.beats()!r})"


@dataclass(frozen=True)
class NodeHealth:
    """healthd's verdict for the node, from its state file on the node, with its evidence."""

    verdict: str = "unknown"  # one of VERDICTS
    evidence: tuple[str, ...] = ()
    state_at: float = 0.0
    """When healthd last wrote its state file (epoch s; 0: no state file)."""

    def to_json(self) -> dict[str, Any]:
        """The verdict as sent."""
        return {"verdict": self.verdict, "evidence": list(self.evidence), "state_at": self.state_at}


@dataclass(frozen=True)
class NodeMetrics:
    """What a node's ranks said of their training, as one node's handful of numbers (never one per rank).

    Counters are summed over the node's ranks, each cumulative since its process started: the agent
    divides their growth between two reports by the growth of `at` (this node's clock), so nodes'
    clocks never meet.  `epoch` changes when the processes summed change (a rank restarted: its
    counters begin again at 0), telling the agent to measure that node afresh."""

    at: float
    """When the counters were last updated (the node's clock, epoch s: its ranks' newest record)."""
    ranks: int
    """Ranks summed."""
    epoch: int
    """A checksum of the (rank, pid) pairs summed."""
    step: int
    """The node's lowest rank's step ..."""
    step_at: float
    """... and when that rank reported it (the node's clock)."""
    tokens: float = 0.0
    flops: float = 0.0
    loss: float | None = None
    """The loss of the node's lowest rank that reported one (NaN and infinities kept), ..."""
    loss_step: int | None = None
    loss_rank: int | None = None
    grad_norm: float | None = None
    grad_norm_step: int | None = None
    grad_norm_rank: int | None = None
    gpu: str = ""
    """The node's GPU model as NVML names it ("" when NVML could not say)."""

    def to_json(self) -> dict[str, Any]:
        """The metrics as sent."""
        return {"at": self.at, "ranks": self.ranks, "epoch": self.epoch, "step": self.step, "step_at": self.step_at,
                "tokens": self.tokens, "flops": self.flops, "loss": measured_to_json(self.loss),
                "loss_step": self.loss_step, "loss_rank": self.loss_rank,
                "grad_norm": measured_to_json(self.grad_norm), "grad_norm_step": self.grad_norm_step,
                "grad_norm_rank": self.grad_norm_rank, "gpu": self.gpu}

    @classmethod
    def from_json(cls, body: object, where: str) -> NodeMetrics:
        """Parse a report's `metrics`; RecordError for anything not exactly understood."""
        # 625 reports a second at 12,500 nodes: a well-formed entry (finite numbers, no NaN loss) is taken in
        # one pass; anything else goes through the field-by-field checks below, which accept exactly the
        # same entries and say what is wrong.
        if type(body) is dict and body.keys() == _METRICS_KEYS:
            at, ranks, epoch, step, step_at = body["at"], body["ranks"], body["epoch"], body["step"], body["step_at"]
            tokens, flops, loss, norm, gpu = body["tokens"], body["flops"], body["loss"], body["grad_norm"], body["gpu"]
            loss_step, loss_rank = body["loss_step"], body["loss_rank"]
            norm_step, norm_rank = body["grad_norm_step"], body["grad_norm_rank"]
            if type(ranks) is int and type(epoch) is int and type(step) is int and min(ranks, epoch, step) >= 0 and \
                    type(at) is float and type(step_at) is float and type(tokens) is float and type(flops) is float and \
                    0 <= min(at, step_at, tokens, flops) and max(at, step_at, tokens, flops) <= _MAX_SUM and \
                    (loss is None and loss_step is None and loss_rank is None or type(loss) is float and
                     -math.inf < loss < math.inf and type(loss_step) is int and type(loss_rank) is int and
                     loss_step >= 0 and loss_rank >= 0) and \
                    (norm is None and norm_step is None and norm_rank is None or type(norm) is float and
                     0 <= norm < math.inf and type(norm_step) is int and type(norm_rank) is int and
                     norm_step >= 0 and norm_rank >= 0) and \
                    type(gpu) is str and len(gpu) <= MAX_GPU_NAME and gpu.isprintable():
                return cls(at, ranks, epoch, step, step_at, tokens, flops, loss, loss_step, loss_rank, norm, norm_step,
                           norm_rank, gpu)
        if not isinstance(body, dict):
            raise RecordError(where, "must be an object")
        gpu = text_field(body, "gpu", where, limit=MAX_GPU_NAME, printable=True)
        loss, grad_norm = measured_field(body, "loss", where), measured_field(body, "grad_norm", where)
        if grad_norm is not None and grad_norm < 0:
            raise RecordError(where, f"field `grad_norm` is {grad_norm!r}: a norm is not negative")
        return cls(at=seconds_field(body, "at", where), ranks=count_field(body, "ranks", where),
                   epoch=count_field(body, "epoch", where), step=count_field(body, "step", where),
                   step_at=seconds_field(body, "step_at", where), tokens=_total(body, "tokens", where),
                   flops=_total(body, "flops", where), loss=loss,
                   loss_step=dated_field(body, "loss_step", loss, where),
                   loss_rank=dated_field(body, "loss_rank", loss, where),
                   grad_norm=grad_norm, grad_norm_step=dated_field(body, "grad_norm_step", grad_norm, where),
                   grad_norm_rank=dated_field(body, "grad_norm_rank", grad_norm, where), gpu=gpu)


_METRICS_KEYS = NodeMetrics(0.0, 0, 0, 0, 0.0).to_json().keys()
_MAX_SUM = MAX_RANKS * MAX_TOTAL
"""The largest count a node's sum may be (its times are far below it too)."""


def _total(body: Mapping[str, Any], key: str, where: str) -> float:
    value = seconds_field(body, key, where)
    if value > MAX_RANKS * MAX_TOTAL:
        raise RecordError(where, f"field `{key}` is {value!r}: more than {MAX_RANKS} ranks can count")
    return value


@dataclass(frozen=True)
class SilentPeer:
    """A neighbour heard before whose beats have not come for `silent_s` seconds, as its watcher saw it."""

    node: str
    silent_s: float

    def to_json(self) -> dict[str, Any]:
        """The entry as sent."""
        return {"node": self.node, "silent_s": self.silent_s}

    @classmethod
    def from_json(cls, entry: object, where: str) -> SilentPeer:
        """One entry of `silent_peers`; RecordError for anything else."""
        if not isinstance(entry, dict) or set(entry) != {"node", "silent_s"}:
            raise RecordError(where, "each silent peer is exactly {\"node\": ..., \"silent_s\": ...}")
        node = field(entry, "node", str, where)
        problem = node_name_problem(node)
        if problem:
            raise RecordError(where, f"silent peer `node`: {problem}")
        return cls(node, seconds_field(entry, "silent_s", where))


@dataclass(frozen=True)
class NodeReport:
    """What one node tells the agent: who it is, which step, its ranks, its health, the checkpoint
    copies it holds (None: nothing to tell), and its ranks' training metrics (None: none reported)."""

    job_id: str
    launch: str
    node: str
    seq: int
    sent_at: float
    ranks: Sequence[RankBeat] = ()
    """A tuple as the reporter makes them; RankColumns as the agent decodes them (equal to the tuple)."""
    health: NodeHealth = NodeHealth()
    checkpoints: CheckpointHoldings | None = None
    metrics: NodeMetrics | None = None
    silent_peers: tuple[SilentPeer, ...] = ()

    def to_json(self, columns: bool = True) -> dict[str, Any]:
        """The record as JSON (its ranks as columns of lists; without `columns`, without them: `encode` packs them)."""
        return {**header(KIND, VERSION), "job_id": self.job_id, "launch": self.launch, "node": self.node,
                "seq": self.seq, "sent_at": self.sent_at, **({"ranks": self.columns.to_json()} if columns else {}),
                "health": self.health.to_json(),
                "checkpoints": None if self.checkpoints is None else self.checkpoints.to_json(),
                "metrics": None if self.metrics is None else self.metrics.to_json(),
                "silent_peers": [p.to_json() for p in self.silent_peers]}

    @property
    def columns(self) -> RankColumns:
        """The node's ranks as columns (RankColumns): what the agent reads of 100,000 ranks a heartbeat."""
        ranks = self.ranks
        if isinstance(ranks, RankColumns):
            return ranks
        made: RankColumns | None = self.__dict__.get("_columns")
        if made is None:
            made = RankColumns.of(self.node, ranks)
            object.__setattr__(self, "_columns", made)  # derived from a field: not part of equality
        return made

    @classmethod
    def from_json(cls, data: object, where: str) -> NodeReport:
        """Parse a received report; RecordError for anything not exactly understood."""
        # 625 reports a second at 12,500 nodes, nearly all of one shape (a compact report, healthd without
        # evidence): that shape is taken in one pass; anything else goes through the field-by-field checks below,
        # which accept the same reports and say what is wrong.
        if type(data) is dict and data.keys() == _REPORT_KEYS and data["kind"] == KIND and data["version"] == VERSION:
            job_id, launch, node, seq, sent_at = data["job_id"], data["launch"], data["node"], data["seq"], \
                data["sent_at"]
            ranks, health, held, told, peers = data["ranks"], data["health"], data["checkpoints"], data["metrics"], \
                data["silent_peers"]
            if type(ranks) is RankColumns and type(job_id) is str and type(launch) is str and type(node) is str and \
                    len(job_id) <= MAX_TEXT and len(launch) <= MAX_TEXT and job_id.isprintable() and \
                    launch.isprintable() and type(seq) is int and seq >= 0 and type(sent_at) is float and \
                    0 <= sent_at < math.inf and type(health) is dict and health.keys() == _HEALTH_KEYS and \
                    health["evidence"] == [] and health["verdict"] in VERDICTS and type(health["verdict"]) is str and \
                    type(health["state_at"]) is float and 0 <= health["state_at"] < math.inf and \
                    peers == [] and not node_name_problem(node):
                return checked(cls, {
                    "job_id": job_id, "launch": launch, "node": node, "seq": seq, "sent_at": sent_at, "ranks": ranks,
                    "health": checked(NodeHealth, {"verdict": health["verdict"], "evidence": (),
                                                   "state_at": health["state_at"]}),
                    "checkpoints": None if held is None else _holdings(held, node, f"{where}: checkpoints"),
                    "metrics": None if told is None else NodeMetrics.from_json(told, f"{where}: metrics"),
                    "silent_peers": ()})
        sent = data.get("version") if isinstance(data, dict) and data.get("kind") == KIND else None
        version = sent if sent in READ_VERSIONS and isinstance(sent, int) else VERSION
        body = check_header(data, KIND, version, where)
        node = field(body, "node", str, where)
        problem = node_name_problem(node)
        if problem:
            raise RecordError(where, f"field `node`: {problem}")
        if version >= 5 and isinstance(body.get("ranks"), list):
            raise RecordError(where, "field `ranks` must be the ranks' columns (an object of lists) in a version-5 report")
        ranks = field(body, "ranks", (dict, RankColumns) if version >= 5 else list, where)
        if version < 5 and len(ranks) > MAX_RANKS:
            raise RecordError(where, f"{len(ranks)} ranks: a node reports at most {MAX_RANKS}")
        health = field(body, "health", dict, where)
        held = field(body, "checkpoints", (dict, type(None)), where)
        told = None if version < 3 else field(body, "metrics", (dict, type(None)), where)
        peers = field(body, "silent_peers", list, where) if version >= 4 else []
        if len(peers) > MAX_SILENT_PEERS:
            raise RecordError(where, f"{len(peers)} silent peers: a node watches at most {MAX_SILENT_PEERS}")
        return checked(cls, {
            "job_id": text_field(body, "job_id", where, limit=MAX_TEXT, printable=True),
            "launch": text_field(body, "launch", where, limit=MAX_TEXT, printable=True), "node": node,
            "seq": count_field(body, "seq", where), "sent_at": seconds_field(body, "sent_at", where),
            "ranks": ranks if isinstance(ranks, RankColumns) else _rank_columns(ranks, node, where) if version >= 5 else
            tuple([_rank(entry, node, where, i) for i, entry in enumerate(ranks)]),
            "health": _health(health, f"{where}: health"),
            "checkpoints": None if held is None else _holdings(held, node, f"{where}: checkpoints"),
            "metrics": None if told is None else NodeMetrics.from_json(told, f"{where}: metrics"),
            "silent_peers": tuple(SilentPeer.from_json(p, f"{where}: silent_peers") for p in peers)})


_NUMBER_TYPES = frozenset({int, float})
_REPORT_KEYS = NodeReport("0", "0", "x", 0, 0.0).to_json().keys()
_HEALTH_KEYS = NodeHealth().to_json().keys()
_COLUMN_KEYS = frozenset(RANK_COLUMNS)
_PHASE_SET = frozenset(PHASES)
_PROCESS_SET = frozenset(PROCESS_STATES)


def _rank_columns(columns: Mapping[str, Any], node: str, where: str) -> RankColumns:
    """A version-5 report's `ranks`: every column a list of the same length, at most MAX_RANKS, each value of
    its field's kind (as a version-4 rank entry's); RecordError naming the column and the rank's index."""
    # 625 reports a second at 12,500 nodes: the columns of a kind joined and checked at C speed (a set of their
    # values' types, min and max), a few calls a report whatever its rank count; anything refused goes through
    # _columns_problem, which says what is wrong.
    if columns.keys() == _COLUMN_KEYS:
        rank, step, pid, compute_steps = columns["rank"], columns["step"], columns["pid"], columns["compute_steps"]
        phase, process = columns["phase"], columns["process"]
        at, compute_s, alive_at, since = columns["at"], columns["compute_s"], columns["alive_at"], \
            columns["stopped_since"]
        count = len(rank) if type(rank) is list else -1
        if 0 <= count <= MAX_RANKS and type(step) is list and type(pid) is list and type(compute_steps) is list and \
                type(phase) is list and type(process) is list and type(at) is list and type(compute_s) is list and \
                type(alive_at) is list and type(since) is list and len(step) == count and len(pid) == count and \
                len(compute_steps) == count and len(phase) == count and len(process) == count and \
                len(at) == count and len(compute_s) == count and len(alive_at) == count and len(since) == count:
            if count == 0:
                return RankColumns(node, (), (), (), (), (), (), (), (), (), ())
            whole, times, words = rank + step + pid + compute_steps, at + compute_s + alive_at + since, phase + process
            kinds = set(map(type, times))
            # JSON carries no NaN (the parser refuses it); 1e400 reads as infinity, which `max` catches.
            if set(map(type, whole)) == _INT and min(whole) >= 0 and (kinds == _FLOAT or kinds <= _NUMBER_TYPES) and \
                    min(times) >= 0 and max(times) < math.inf and set(map(type, words)) == _STR and \
                    _PHASE_SET.issuperset(phase) and _PROCESS_SET.issuperset(process):
                if kinds != _FLOAT:
                    at, compute_s, alive_at, since = (list(map(float, c)) for c in (at, compute_s, alive_at, since))
                return RankColumns(node, tuple(rank), tuple(step), tuple(phase), tuple(at), tuple(pid),
                                   tuple(compute_s), tuple(compute_steps), tuple(alive_at), tuple(process),
                                   tuple(since))
    raise RecordError(where, _columns_problem(columns))


_INT, _FLOAT, _STR = {int}, {float}, {str}


def _columns_problem(columns: Mapping[str, Any]) -> str:
    """What is wrong with a version-5 `ranks` that the one-pass check refused."""
    missing, extra = _COLUMN_KEYS - columns.keys(), columns.keys() - _COLUMN_KEYS
    if missing or extra:
        return (f"`ranks` must have exactly the columns {', '.join(RANK_COLUMNS)}"
                f"{'; missing ' + ', '.join(sorted(missing)) if missing else ''}"
                f"{'; unknown ' + ', '.join(sorted(map(str, extra))) if extra else ''}")
    for name in RANK_COLUMNS:
        if type(columns[name]) is not list:
            return f"`ranks` column `{name}` must be a list"
    count = len(columns["rank"])
    if count > MAX_RANKS:
        return f"{count} ranks: a node reports at most {MAX_RANKS}"
    for name in RANK_COLUMNS:
        column = columns[name]
        if len(column) != count:
            return f"`ranks` column `{name}` has {len(column)} values, column `rank` {count}"
        for index, value in enumerate(column):
            if name in ("phase", "process"):
                allowed = PHASES if name == "phase" else PROCESS_STATES
                if type(value) is not str or value not in allowed:
                    return f"ranks[{index}]: {name} {value!r} is not one of {', '.join(allowed)}"
            elif name in ("rank", "step", "pid", "compute_steps"):
                if type(value) is not int or value < 0:
                    return f"ranks[{index}]: field `{name}` is {value!r}: a whole number, not negative"
            elif type(value) not in _NUMBER_TYPES or not 0 <= value < math.inf:
                return (f"ranks[{index}]: field `{name}` is {value!r}: a finite number of seconds, "
                        "not negative")
    return "`ranks` is not a node's rank columns"  # not reached: the one-pass check accepts the rest


def _rank(entry: object, node: str, where: str, index: int) -> RankBeat:
    # The agent parses 8 of these per report, 625 reports a second at 12,500 nodes: a well-formed
    # entry is taken in one pass, its records made without their __init__ (`checked`); anything else
    # goes through the field-by-field checks below, which accept exactly the same entries and say what
    # is wrong.
    if type(entry) is dict:
        get: Callable[[str], Any] = entry.get
        rank, step, pid, compute_steps = get("rank"), get("step"), get("pid"), get("compute_steps")
        at, compute_s, alive_at, stopped_since = get("at"), get("compute_s"), get("alive_at"), get("stopped_since")
        phase, process = get("phase"), get("process")
        numbers = _NUMBER_TYPES
        if phase in PHASES and process in PROCESS_STATES and type(rank) is int and type(step) is int and \
                type(pid) is int and type(compute_steps) is int and min(rank, step, pid, compute_steps) >= 0 and \
                type(at) in numbers and type(compute_s) in numbers and type(alive_at) in numbers and \
                type(stopped_since) in numbers and 0 <= at < math.inf and 0 <= compute_s < math.inf and \
                0 <= alive_at < math.inf and 0 <= stopped_since < math.inf:
            progress = checked(RankProgress, {
                "rank": rank, "node": node, "step": step, "phase": phase, "at": float(at), "pid": pid,
                "compute_s": float(compute_s), "compute_steps": compute_steps, "alive_at": float(alive_at),
                "tokens": 0.0, "flops": 0.0, "loss": None, "loss_step": None, "grad_norm": None,
                "grad_norm_step": None})
            return checked(RankBeat, {"progress": progress, "process": process, "stopped_since": float(stopped_since)})
    return _checked_rank(entry, node, f"{where}: ranks[{index}]")


def _checked_rank(entry: object, node: str, where: str) -> RankBeat:
    if not isinstance(entry, dict):
        raise RecordError(where, "must be an object")
    phase = field(entry, "phase", str, where)
    if phase not in PHASES:
        raise RecordError(where, f"phase {phase!r} is not one of {', '.join(PHASES)}")
    process = field(entry, "process", str, where)
    if process not in PROCESS_STATES:
        raise RecordError(where, f"process {process!r} is not one of {', '.join(PROCESS_STATES)}")
    progress = RankProgress(rank=count_field(entry, "rank", where), node=node,
                            step=count_field(entry, "step", where), phase=phase,
                            at=seconds_field(entry, "at", where), pid=count_field(entry, "pid", where),
                            compute_s=seconds_field(entry, "compute_s", where),
                            compute_steps=count_field(entry, "compute_steps", where),
                            alive_at=seconds_field(entry, "alive_at", where))
    return RankBeat(progress, process, seconds_field(entry, "stopped_since", where))


_last_holdings: dict[str, CheckpointHoldings] = {}
"""Per node, the holdings its last report carried (the agent's reports hold these same objects)."""


def _holdings(body: Mapping[str, Any], node: str, where: str) -> CheckpointHoldings:
    # Every heartbeat repeats a node's holdings, unchanged until the node's checkpoint thread rewrites them.
    # Checking 32 copies field by field took 200 µs a report, five times the rest of it (625 reports a
    # second at 12,500 nodes): holdings equal, field for field, to the ones last taken from this node are
    # those (already checked) ones.
    copies = body.get("copies")
    held = _last_holdings.get(node)
    if held is not None and type(copies) is list and len(copies) == len(held.copies) and \
            body.get("written_at") == held.written_at and body.get("node") == node and \
            body.get("version") == HOLDINGS_VERSION and body.keys() == _HOLDINGS_KEYS and \
            body["last_resume"] == (held.last_resume.to_json() if held.last_resume is not None else None) and \
            body["copies_refused"] == (held.copies_refused.to_json() if held.copies_refused is not None else None) and \
            all(type(c) is dict and c.keys() == _COPY_KEYS and c["step"] == h.step and c["slot"] == h.slot and
                c["slots"] == h.slots and c["tier"] == h.tier and c["of_node"] == h.of_node and
                c["written_at"] == h.written_at and c["save_seconds"] == h.save_seconds
                for c, h in zip(copies, held.copies)):
        return held
    if isinstance(copies, list) and len(copies) > MAX_REPORTED_COPIES:
        raise RecordError(where, f"{len(copies)} copies: a report carries at most {MAX_REPORTED_COPIES}")
    holdings = CheckpointHoldings.from_json(body, where)
    if holdings.node != node:
        raise RecordError(where, f"the holdings of {holdings.node}, not of the reporting node {node}")
    _last_holdings[node] = holdings
    return holdings


_HOLDINGS_KEYS = CheckpointHoldings("x").to_json().keys()
_COPY_KEYS = HeldCopy(0, "x", "local", 0, 1, 0.0, 0.0).to_json().keys()


def _health(body: Mapping[str, Any], where: str) -> NodeHealth:
    verdict = field(body, "verdict", str, where)
    if verdict not in VERDICTS:
        raise RecordError(where, f"verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
    evidence = field(body, "evidence", list, where)
    if len(evidence) > MAX_EVIDENCE or not all(isinstance(e, str) and len(e) <= MAX_TEXT for e in evidence):
        raise RecordError(where, f"evidence must be at most {MAX_EVIDENCE} strings of {MAX_TEXT} characters")
    return NodeHealth(verdict, tuple(evidence), seconds_field(body, "state_at", where))


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a report may carry")


_JSON = json.JSONDecoder(parse_constant=_refuse_constant)
"""json.loads with an argument makes a decoder per call: a tenth of a report's parsing."""


class ReportRefused(RecordError):
    """A datagram the agent does not take, with `kind`: `too large`, `foreign`, `unsigned`, `unreadable`, `malformed`."""

    def __init__(self, where: str, message: str, kind: str) -> None:
        super().__init__(where, message)
        self.kind = kind


def encode(report: NodeReport, key: bytes) -> bytes:
    """The datagram for `report`, signed with the job's `key` (the compact framing, MAGIC_COLUMNS: the record's JSON
    without its ranks, then their columns packed); ValueError when it would be too large or a value does not pack."""
    body = _packed(report)
    datagram = MAGIC_COLUMNS + hmac.digest(key, MAGIC_COLUMNS + body, hashlib.sha256) + body
    if len(datagram) > MAX_DATAGRAM:
        raise ValueError(f"a report of {len(datagram)} bytes is larger than {MAX_DATAGRAM}")
    return datagram


def datagram_size(report: NodeReport) -> int:
    """The bytes `encode` makes of `report`, whatever the key and even beyond MAX_DATAGRAM (ValueError when a value
    does not pack)."""
    return len(MAGIC_COLUMNS) + DIGEST_BYTES + len(_packed(report))


def _packed(report: NodeReport) -> bytes:
    columns = report.columns
    count = len(columns)
    if count > MAX_RANKS:
        raise ValueError(f"{count} ranks: a report carries at most {MAX_RANKS}")
    head = json.dumps({**report.to_json(columns=False), "ranks": count}, separators=(",", ":"),
                      allow_nan=False).encode()
    try:
        block = _BLOCKS[count].pack(*columns.rank, *columns.step, *columns.pid, *columns.compute_steps, *columns.at,
                                    *columns.compute_s, *columns.alive_at, *columns.stopped_since,
                                    *[_PHASE_CODES[phase] for phase in columns.phase],
                                    *[_PROCESS_CODES[process] for process in columns.process])
    except (struct.error, KeyError) as exc:
        raise ValueError(f"a rank's value does not fit the report's columns ({exc.__class__.__name__}: {exc})") from None
    return _HEAD_LENGTH.pack(len(head)) + head + block


def decode(datagram: bytes, key: bytes, where: str) -> NodeReport:
    """The report in `datagram`; ReportRefused (a RecordError) when it is too large, not signed with `key`, or not a report.

    The signature is checked before anything of the body is read, so bytes from outside the job
    are never parsed.  Both framings are read (MAGIC: all JSON; MAGIC_COLUMNS: JSON, then the ranks' columns
    packed); a framing this clusterctl does not know, signed with the job's key, is refused saying so."""
    if len(datagram) > MAX_DATAGRAM:
        raise ReportRefused(where, f"{len(datagram)} bytes: a report is at most {MAX_DATAGRAM}", "too large")
    magic = datagram[:len(MAGIC)]
    if not magic.startswith(_MAGIC_FAMILY) or len(datagram) < len(MAGIC) + DIGEST_BYTES:
        raise ReportRefused(where, "not a clusterctl node report (wrong magic)", "foreign")
    digest, body = datagram[len(MAGIC):len(MAGIC) + DIGEST_BYTES], datagram[len(MAGIC) + DIGEST_BYTES:]
    # The compact framing and any later one sign their magic too: a datagram re-framed on the way is refused here.
    if not hmac.compare_digest(digest, hmac.digest(key, body if magic == MAGIC else magic + body, hashlib.sha256)):
        raise ReportRefused(where, "not signed with this job's key (from outside the job, or damaged)", "unsigned")
    if magic not in (MAGIC, MAGIC_COLUMNS):
        raise ReportRefused(where, f"a node report framed as {magic!r}, which this clusterctl does not understand "
                                   f"(it reads {MAGIC!r} and {MAGIC_COLUMNS!r}): upgrade clusterctl on this host",
                            "malformed")
    block = b""
    if magic == MAGIC_COLUMNS:
        if len(body) < _HEAD_LENGTH.size:
            raise ReportRefused(where, "a columns report shorter than its own head's length", "unreadable")
        end = _HEAD_LENGTH.size + _HEAD_LENGTH.unpack_from(body)[0]
        body, block = body[_HEAD_LENGTH.size:end], body[end:]
    try:
        data = _JSON.decode(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ReportRefused(where, f"not a readable JSON report ({exc.__class__.__name__})", "unreadable") from None
    try:
        if magic == MAGIC_COLUMNS:
            sent = data.get("version") if isinstance(data, dict) else None
            if sent == VERSION:
                node = data["node"] if isinstance(data.get("node"), str) else ""
                data["ranks"] = _unpacked_columns(block, data.get("ranks"), node, where)
            elif not isinstance(sent, int) or sent < VERSION:
                raise RecordError(where, f"a report framed as {MAGIC_COLUMNS!r} is a {KIND} record of version "
                                         f"{VERSION} or later, not {sent!r}")
            # a later version: from_json says it is newer than this clusterctl understands
        elif isinstance(data, dict) and data.get("version") == VERSION and not isinstance(data.get("ranks"), dict):
            raise RecordError(where, "field `ranks` must be the ranks' columns (an object of lists) in a version-5 report")
        return NodeReport.from_json(data, where)
    except ReportRefused:
        raise
    except RecordError as exc:
        raise ReportRefused(exc.where, str(exc).removeprefix(f"{exc.where}: "), "malformed") from None


MAGIC_COLUMNS = b"CCN2"
"""The compact framing (version 5 and after): ``MAGIC_COLUMNS``, the HMAC of the magic and the body (the framing is
signed too, and so must any later one be), then the body: the head's
length (2 bytes, big-endian), the head (the record as compact UTF-8 JSON whose `ranks` is their count n), then the
ranks' columns packed little-endian: n unsigned 64-bit `rank`, then `step`, `pid`, `compute_steps`; n 64-bit floats
`at`, then `compute_s`, `alive_at`, `stopped_since`; n bytes `phase` (its index in WIRE_PHASES), n bytes `process`
(its index in WIRE_PROCESS_STATES).  66 bytes a rank, read with one struct call: JSON numbers were most of a report's
parsing at 625 reports a second."""
_MAGIC_FAMILY = b"CCN"
"""The first bytes of every node report's framing, known or yet to come (the last byte numbers the framing)."""
WIRE_PHASES = ("startup", "step", "checkpoint-save", "checkpoint-load")
"""The phases as numbered on the wire: append only (a test holds it to rank_progress.PHASES)."""
WIRE_PROCESS_STATES = ("running", "stopped", "gone", "unknown")
"""The process states as numbered on the wire: append only (a test holds it to PROCESS_STATES)."""
_PHASE_CODES = {phase: code for code, phase in enumerate(WIRE_PHASES)}
_PROCESS_CODES = {state: code for code, state in enumerate(WIRE_PROCESS_STATES)}
_HEAD_LENGTH = struct.Struct(">H")
_BLOCKS = tuple(struct.Struct(f"<{4 * n}Q{4 * n}d{2 * n}B") for n in range(MAX_RANKS + 1))


def _unpacked_columns(block: bytes, count: object, node: str, where: str) -> RankColumns:
    """The ranks' columns packed after a columns report's head (`count`: the head's `ranks`)."""
    if type(count) is not int or not 0 <= count <= MAX_RANKS:
        raise RecordError(where, f"field `ranks` is {count!r}: a columns report counts its ranks, at most {MAX_RANKS}")
    layout = _BLOCKS[count]
    if len(block) != layout.size:
        raise RecordError(where, f"{len(block)} bytes of rank columns for {count} ranks, not {layout.size}")
    values = layout.unpack(block)
    n = count
    times, codes = values[4 * n:8 * n], values[8 * n:]
    phases, processes = codes[:n], codes[n:]
    # 625 reports a second at 12,500 nodes: each kind checked whole, at C speed.
    if n == 0 or all(map(math.isfinite, times)) and min(times) >= 0 and max(phases) < len(WIRE_PHASES) and \
            max(processes) < len(WIRE_PROCESS_STATES):
        return RankColumns(node, values[:n], values[n:2 * n], tuple(map(WIRE_PHASES.__getitem__, phases)),
                           times[:n], values[2 * n:3 * n], times[n:2 * n], values[3 * n:4 * n], times[2 * n:3 * n],
                           tuple(map(WIRE_PROCESS_STATES.__getitem__, processes)), times[3 * n:])
    for index in range(n):
        for name, column in (("at", 0), ("compute_s", 1), ("alive_at", 2), ("stopped_since", 3)):
            value = times[column * n + index]
            if not 0 <= value < math.inf:
                raise RecordError(f"{where}: ranks[{index}]",
                                  f"field `{name}` is {value!r}: it must be a finite number of seconds, not negative")
        if phases[index] >= len(WIRE_PHASES):
            raise RecordError(f"{where}: ranks[{index}]", f"phase number {phases[index]} is not one of "
                                                           f"0-{len(WIRE_PHASES) - 1} ({', '.join(WIRE_PHASES)})")
        if processes[index] >= len(WIRE_PROCESS_STATES):
            raise RecordError(f"{where}: ranks[{index}]",
                              f"process number {processes[index]} is not one of 0-{len(WIRE_PROCESS_STATES) - 1} "
                              f"({', '.join(WIRE_PROCESS_STATES)})")
    raise RecordError(where, "the rank columns do not hold")  # not reached: the one-pass check accepts the rest


def parse_key(text: str, where: str = REPORT_KEY_ENV) -> bytes:
    """The job's report key from its hex form; RecordError when it is not KEY_BYTES bytes of hex."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise RecordError(where, "is not hexadecimal") from None
    if len(key) != KEY_BYTES:
        raise RecordError(where, f"holds {len(key)} bytes, not {KEY_BYTES}")
    return key
