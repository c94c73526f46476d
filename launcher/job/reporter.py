"""A node's reporter: one process per node of a step, telling the job's agent how the node's ranks do.

Runs inside the job on every compute node of an agent's step, as the job's user:
`python -m clusterctl.launcher.job reporter --watch-pid <pid>`, started detached by the wrapper
of the node's first task (`clusterctl.launcher.job.steps`) before it becomes the training program.

Every 0.25 s it reads, all on its own node:
- the ranks' progress files, `$CLUSTERCTL_NODE_DIR/progress/<rank>.json` (node-local tmpfs,
  written by `clusterctl.progress.beat`; a few hundred bytes each, never shared storage);
- `/proc/<pid>/stat` of each rank's process (stopped by a signal, exited, or running);
- healthd's state file (`$CLUSTERCTL_HEALTHD_STATE_DIR/state.json`, default /run/healthd), at
  most once a second;
- with multi-level checkpoints on, the node's checkpoint holdings (`holdings.json` in the
  node's tier root, from `$CLUSTERCTL_CHECKPOINT`: one stat per tick, read again only when its size or modification time changed;
  a damaged one is said once in the reporter's log and reported as none);
- once, in a thread of its own when it starts, the node's GPU model as NVML names it (for the job's
  MFU; `GpuModel`: nvmlInit may take seconds, and the reporter never waits for it);
With a peer port from the agent ($CLUSTERCTL_PEER_PORT) it also beats to its two neighbours in the
step every 0.5 s and hears theirs (launcher/job/peer_link.py, launcher/pure/peer_watch.py): a neighbour
silent 2.5 s is named in its next report, sent at once.  It
sends one signed UDP datagram (~1.6 KB for 8 ranks, ~6 KB with 32 checkpoint copies and a resume; clusterctl.records.node_report) to the
agent: at once when something the agent acts on changed (twice more, 0.5 s apart, when it acts on it at
once: one lost datagram must not wait a heartbeat), else once per heartbeat ($CLUSTERCTL_REPORT_INTERVAL).  What to send and when is `clusterctl.launcher.pure.node_report_build`.
Sends never block (a non-blocking socket: an absent agent costs a failed sendto), so a busy or
stopped agent never slows training; the reporter's own cost is a few file reads per tick.

It exits 2 s after the watched process (the program of the task that started it) is gone, after
one last report, and at once (after one last report) on SIGTERM or SIGINT.  A bad or missing
setting: one line on stderr naming the variable, exit 2.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from clusterctl.clock import SYSTEM_CLOCK, Clock
from clusterctl.errors import ClusterctlError, HostlistError
from clusterctl.launcher.job.peer_link import PeerLink
from clusterctl.launcher.job.report_channel import ReportSender, parse_address
from clusterctl.launcher.pure.peer_watch import PEER_BEAT_SECONDS, PeerWatch, neighbours
from clusterctl.launcher.pure.node_report_build import (
    ReporterIdentity, ReporterMemory, next_report, node_health, process_state,
)
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, read_holdings
from clusterctl.node_dir import NODE_DIR_ENV
from clusterctl.text import one_line
from clusterctl.records.healthd_state import read_healthd_state
from clusterctl.records.checkpoint_holdings import HOLDINGS_NAME
from clusterctl.records.checkpoint_settings import SETTINGS_ENV, CheckpointSettings
from clusterctl.records.node_report import (
    MAX_TEXT, REPORT_ADDR_ENV, REPORT_INTERVAL_ENV, REPORT_KEY_ENV, REPORT_LAUNCH_ENV,
    NodeHealth, NodeReport, parse_key,
)
from clusterctl.records.peer_beat import PEER_PORT_ENV, PeerBeat, parse_peer_port
from clusterctl.records.rank_progress import RankProgress, progress_dir, read_rank_progress
from clusterctl.records.versioned import RecordError
from clusterctl.slurm import hostlist
from clusterctl.slurm.names import node_name_problem

HEALTHD_STATE_DIR_ENV = "CLUSTERCTL_HEALTHD_STATE_DIR"
"""Where healthd keeps its state file on this node (healthd's `state_dir`), when not /run/healthd."""
DEFAULT_HEALTHD_STATE_DIR = Path("/run/healthd")
DEFAULT_HEARTBEAT = 1.0
TICK = 0.25
"""Seconds between two looks at the node: how late a stopped rank or a new verdict is sent at most."""
HEALTHD_EVERY = 1.0
"""Seconds between two reads of healthd's state file (healthd rewrites it several times a minute)."""
WATCHED_GONE_GRACE = 2.0
"""Seconds the watched process must stay gone before the reporter ends (its last report says so)."""
EXIT_SETTINGS = 2


class ReporterSettingError(ClusterctlError):
    """A setting of the reporter (an environment variable) that is missing or wrong."""

    exit_code = EXIT_SETTINGS

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


@dataclass(frozen=True)
class ReportSettings:
    """Where and how a node reports: from the environment the agent gave the step."""

    identity: ReporterIdentity
    key: bytes
    address: tuple[str, int]
    heartbeat: float
    healthd_state_dir: Path
    holdings_path: Path | None = None
    """The node's checkpoint holdings file (None: multi-level checkpoints are off)."""
    peer_port: int | None = None
    """The step's peer port (None: an agent that asks for no neighbour watch)."""
    peers: tuple[str, ...] = ()
    """The neighbours this node beats to and watches (launcher/pure/peer_watch.py)."""


def report_settings(environ: Mapping[str, str]) -> ReportSettings:
    """The reporter's settings from `environ`; ReporterSettingError naming the variable that is wrong."""
    def required(name: str) -> str:
        value = environ.get(name, "").strip()
        if not value:
            raise ReporterSettingError(name, "not set (the job's agent sets it for the step's processes)")
        return value

    try:
        key = parse_key(required(REPORT_KEY_ENV))
    except RecordError as exc:
        raise ReporterSettingError(REPORT_KEY_ENV, f"{str(exc).removeprefix(f'{REPORT_KEY_ENV}: ')} "
                                                   "(the job's report key: 32 bytes of hex)") from None
    try:
        address = parse_address(required(REPORT_ADDR_ENV))
    except ValueError as exc:
        raise ReporterSettingError(REPORT_ADDR_ENV, str(exc)) from None
    launch = required(REPORT_LAUNCH_ENV)
    job_id = required("SLURM_JOB_ID")
    for name, value in ((REPORT_LAUNCH_ENV, launch), ("SLURM_JOB_ID", job_id)):
        if len(value) > MAX_TEXT or not value.isprintable():
            raise ReporterSettingError(name, f"{one_line(value[:80])!r} is not printable text of at most "
                                             f"{MAX_TEXT} characters")
    text = environ.get(REPORT_INTERVAL_ENV, "").strip()
    try:
        heartbeat = float(text) if text else DEFAULT_HEARTBEAT
    except ValueError:
        heartbeat = math.nan
    if not math.isfinite(heartbeat) or heartbeat < 0:
        raise ReporterSettingError(REPORT_INTERVAL_ENV, f"{one_line(text[:80])!r} is not a number of seconds "
                                                        "(finite, not negative)")
    node = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    problem = node_name_problem(node)
    if problem:
        raise ReporterSettingError("SLURMD_NODENAME", f"{one_line(node[:80])!r}: {problem}")
    state_dir = Path(environ.get(HEALTHD_STATE_DIR_ENV) or DEFAULT_HEALTHD_STATE_DIR)
    try:
        checkpoints = CheckpointSettings.from_env(environ)
    except RecordError as exc:
        raise ReporterSettingError(SETTINGS_ENV, f"{str(exc).removeprefix(f'{SETTINGS_ENV}: ')}") from None
    holdings = checkpoints.tier_root(node) / HOLDINGS_NAME if checkpoints is not None else None
    peer_port, peers = peer_settings(environ, node)
    return ReportSettings(ReporterIdentity(job_id, launch, node), key, address, heartbeat, state_dir, holdings,
                          peer_port, peers)


def peer_settings(environ: Mapping[str, str], node: str) -> tuple[int | None, tuple[str, ...]]:
    """The peer port and this node's neighbours on the ring over the step's nodes (SLURM_STEP_NODELIST,
    else SLURM_JOB_NODELIST); (None, ()) when the agent set no peer port."""
    text = environ.get(PEER_PORT_ENV, "").strip()
    if not text:
        return None, ()
    try:
        port = parse_peer_port(text)
    except ValueError as exc:
        raise ReporterSettingError(PEER_PORT_ENV, str(exc)) from None
    listed = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    try:
        nodes = hostlist.expand(listed) if listed else []
    except HostlistError as exc:
        raise ReporterSettingError("SLURM_STEP_NODELIST", f"{one_line(listed[:80])!r}: {exc}") from None
    return port, neighbours(nodes, node)


def node_dir_setting(environ: Mapping[str, str]) -> Path:
    """$CLUSTERCTL_NODE_DIR, which must be a directory; ReporterSettingError otherwise."""
    text = environ.get(NODE_DIR_ENV, "")
    if not text:
        raise ReporterSettingError(NODE_DIR_ENV, "not set (the rank wrapper sets it for the node's processes)")
    if not Path(text).is_dir():
        raise ReporterSettingError(NODE_DIR_ENV, f"{one_line(text)} is not a directory")
    return Path(text)


# ---- what the reporter reads on its node ----------------------------------------------------------

def read_process_state(pid: int, proc: Path = Path("/proc")) -> str:
    """The state of process `pid` (running, stopped, gone, unknown) from `/proc/<pid>/stat`."""
    if pid <= 0:
        return "unknown"
    try:
        text = (proc / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    except OSError:
        return "unknown"
    return process_state(text)


def read_node_progress(node_dir: Path, now: float) -> tuple[RankProgress, ...]:
    """Every progress file the node's ranks wrote; files refused by the reader are skipped (never raises)."""
    try:
        names = sorted(entry.name for entry in os.scandir(progress_dir(node_dir)) if entry.name.endswith(".json")
                       and not entry.name.startswith("."))
    except OSError:
        return ()
    records: list[RankProgress] = []
    for name in names:
        try:
            records.append(read_rank_progress(progress_dir(node_dir) / name, now))
        except (RecordError, OSError, ValueError):
            continue
    return tuple(records)


def read_node_health(state_dir: Path, now: float) -> NodeHealth:
    """healthd's verdict for this node at `now`; `unknown` when its state file is missing, unreadable or stale."""
    try:
        state = read_healthd_state(state_dir)
    except (RecordError, OSError, ValueError, RecursionError):
        return NodeHealth()
    return node_health(state, now)


def no_holdings() -> CheckpointHoldings | None:
    """Multi-level checkpoints off: nothing to tell."""
    return None


class HoldingsReader:
    """The node's checkpoint holdings, read again only when the file changed (its size, modification time
    or inode: one stat of tmpfs per tick, free); None while there is no file or it is damaged (said once
    until it reads again)."""

    def __init__(self, path: Path, node: str, say: Callable[[str], None]) -> None:
        self.path, self.node, self.say = path, node, say
        self.seen: tuple[int, int, int] | None = None
        self.holdings: CheckpointHoldings | None = None
        self.bad = False

    def __call__(self) -> CheckpointHoldings | None:
        """The holdings now."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
            seen: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            seen = None
        if seen == self.seen:
            return self.holdings
        self.seen = seen
        try:
            self.holdings = read_holdings(self.path) if seen is not None else None
            if self.holdings is not None and self.holdings.node != self.node:
                raise RecordError(str(self.path), f"the holdings of {self.holdings.node}, not of this node "
                                                  f"{self.node}")
            self.bad = False
        except (RecordError, OSError) as exc:
            self.holdings = None
            if not self.bad:
                self.say(f"cannot read the node's checkpoint holdings ({one_line(str(exc))[:300]}): reporting none "
                         "until the file is rewritten")
            self.bad = True
        return self.holdings


def nvml_gpu_name() -> str:
    """NVML's name of the first of this node's GPUs it can read ("NVIDIA H100 80GB HBM3"); "" when it
    names none.  NVMLError (no driver, no GPU) and ImportError go to the caller."""
    import pynvml  # only here: the one NVML question the launcher asks (healthd asks the rest)

    pynvml.nvmlInit()
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:  # a GPU of another job, behind the job's device cgroup, may refuse: the next one answers
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            except pynvml.NVMLError:
                continue
            return name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        return ""
    finally:
        pynvml.nvmlShutdown()


class GpuModel:
    """The node's GPU model, asked once in a daemon thread: "" until it answers, and for good when it
    cannot (no NVML, no GPU, an error).  nvmlInit takes seconds on a node whose GPUs are not in
    persistence mode, and a wedged driver may never answer: the reporter's loop never waits for it."""

    def __init__(self, ask: Callable[[], str] = nvml_gpu_name) -> None:
        self.name = ""
        self.thread = threading.Thread(target=self._ask, args=(ask,), name="clusterctl-gpu-model", daemon=True)
        self.thread.start()

    def _ask(self, ask: Callable[[], str]) -> None:
        try:
            self.name = ask()
        except Exception:  # NVMLError, ImportError: the job's MFU then needs [job] gpu_peak_tflops
            self.name = ""

    def __call__(self) -> str:
        """The model as known now ("" not yet, or never)."""
        return self.name


def no_gpu_model() -> str:
    """No GPU model to tell (a test's reporter)."""
    return ""


@dataclass(frozen=True)
class ReporterDoors:
    """Everything the reporter's loop does to the world, passed in (tests drive it with a fake clock)."""

    clock: Clock
    read_progress: Callable[[Path, float], Sequence[RankProgress]]
    process_state: Callable[[int], str]
    read_health: Callable[[Path, float], NodeHealth]
    send: Callable[[NodeReport], bool]
    stop_requested: Callable[[], bool] = lambda: False
    say: Callable[[str], None] = lambda message: None
    holdings: Callable[[], CheckpointHoldings | None] = no_holdings
    """The node's checkpoint holdings now (HoldingsReader; None: none to tell)."""
    gpu_model: Callable[[], str] = no_gpu_model
    """The node's GPU model as NVML names it ("" unknown; GpuModel)."""
    peers: PeerLink | None = None
    """The line to the node's neighbours (None: no neighbour watch)."""


def default_doors(sender: ReportSender, stop_requested: Callable[[], bool],
                  settings: ReportSettings | None = None) -> ReporterDoors:
    """The real ones: the system clock, this node's files and /proc, `sender`."""
    def say(message: str) -> None:
        print(f"clusterctl reporter: {message}", file=sys.stderr, flush=True)

    holdings: Callable[[], CheckpointHoldings | None] = no_holdings
    if settings is not None and settings.holdings_path is not None:
        holdings = HoldingsReader(settings.holdings_path, settings.identity.node, say)
    peers = None
    if settings is not None and settings.peer_port is not None and settings.peers:
        try:
            peers = PeerLink(settings.key, settings.peer_port, settings.peers)
        except OSError as exc:
            say(f"cannot listen for the neighbours' beats on port {settings.peer_port} ({exc.strerror}); "
                f"{' and '.join(settings.peers)} are watched by their other neighbour and the agent only")
    return ReporterDoors(SYSTEM_CLOCK, read_node_progress, read_process_state, read_node_health, sender.send,
                         stop_requested, say, holdings, GpuModel(), peers)


def run_reporter(settings: ReportSettings, node_dir: Path, watch_pid: int, doors: ReporterDoors) -> int:
    """Report this node until the watched process has been gone WATCHED_GONE_GRACE s, or a stop; 0."""
    memory = ReporterMemory()
    health = NodeHealth()
    health_read_at = -math.inf
    watched_gone_at: float | None = None
    failures = 0
    link = doors.peers
    peers = PeerWatch(link.peers if link is not None else ())
    beat_seq, next_beat = 0, -math.inf
    while True:
        monotonic, now = doors.clock.monotonic(), doors.clock.now()
        if link is not None:
            identity = settings.identity
            for beat in link.received():
                if (beat.job_id, beat.launch) == (identity.job_id, identity.launch):
                    peers = peers.heard(beat.node, monotonic, leaving=beat.leaving)
            if monotonic >= next_beat:
                beat_seq += 1
                link.send(PeerBeat(identity.job_id, identity.launch, identity.node, beat_seq))
                next_beat = monotonic + PEER_BEAT_SECONDS
        watched = doors.process_state(watch_pid)
        if watched == "gone":
            watched_gone_at = monotonic if watched_gone_at is None else watched_gone_at
        else:
            watched_gone_at = None
        last = doors.stop_requested() or (watched_gone_at is not None
                                           and monotonic - watched_gone_at >= WATCHED_GONE_GRACE)
        if last or monotonic - health_read_at >= HEALTHD_EVERY:
            health, health_read_at = doors.read_health(settings.healthd_state_dir, now), monotonic
        records = doors.read_progress(node_dir, now)
        processes = {record.pid: doors.process_state(record.pid) for record in records}
        decision = next_report(settings.identity, records, processes, health, memory, now=now, monotonic=monotonic,
                               heartbeat=settings.heartbeat, force=last, checkpoints=doors.holdings(),
                               gpu=doors.gpu_model(), silent_peers=peers.silent(monotonic))
        memory = decision.memory
        if decision.report is not None:
            delivered = doors.send(decision.report)
            memory = memory.after_send(decision.report, monotonic, delivered=delivered)
            if not delivered:
                failures += 1
                if failures in (1, 10, 100) or failures % 1000 == 0:
                    doors.say(f"a report could not be sent to {settings.address[0]}:{settings.address[1]} "
                              f"({failures} so far); the next one replaces it")
        if last:
            if link is not None:  # the neighbours stop watching a node whose step ended here
                link.send(PeerBeat(settings.identity.job_id, settings.identity.launch, settings.identity.node,
                                   beat_seq + 1, leaving=True))
            return 0
        doors.clock.sleep(TICK)


def main(watch_pid: int, environ: Mapping[str, str]) -> int:
    """`python -m clusterctl.launcher.job reporter --watch-pid N`: settings from `environ`, then the loop."""
    try:
        settings = report_settings(environ)
        node_dir = node_dir_setting(environ)
    except ReporterSettingError as exc:
        print(f"clusterctl reporter: {exc}; not reporting", file=sys.stderr, flush=True)
        return EXIT_SETTINGS
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sender = ReportSender(settings.key, settings.address)
    doors = default_doors(sender, lambda: bool(stopping), settings)
    try:
        return run_reporter(settings, node_dir, watch_pid, doors)
    finally:
        sender.close()
        if doors.peers is not None:
            doors.peers.close()
        remove_node_progress(node_dir)


def remove_node_progress(node_dir: Path) -> None:
    """The step is over on this node: its ranks' progress files go, and the job's folders once empty
    (tmpfs is memory; inside `clusterctl-<uid>`, 0700 and ours, so no other user can plant a path here)."""
    shutil.rmtree(node_dir / "progress", ignore_errors=True)
    log = node_dir / "reporter.log"
    with contextlib.suppress(OSError):
        if log.stat().st_size == 0:  # a log with something in it stays for whoever looks into the node
            log.unlink()
    for folder in (node_dir, node_dir.parent, node_dir.parent.parent):  # <node>, <launch>, <job>: only if empty
        try:
            folder.rmdir()
        except OSError:
            break
