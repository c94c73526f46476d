"""What the Slurm prolog, epilog and HealthCheckProgram do (their entry points are thin).

All three run as root with an empty environment, so PATH is set here, the configuration
is read from its default path, and every step is bounded by `hook_timeout`.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from clusterctl.clock import parse_utc, utc
from clusterctl.errors import ClusterctlError, SlurmCommandError
from clusterctl.files import owner_label
from clusterctl.healthd.breaker import Breaker
from clusterctl.healthd.config import DEFAULT_PATH, ConfigError, HealthdConfig, KeptConfig, load_config_keeping_valid
from clusterctl.healthd.diagnostic_runner import DiagnosticDoor, diagnostics_in_force, run_diagnostic
from clusterctl.healthd.drain_requests import drain_rules
from clusterctl.healthd.engine import EngineSettings, gate_verdict
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.gate import (
    HOOK_PATH, PCI_DEVICES, GateReport, Problem, check_node, from_state, gpus_expected, parse_job_gpus, read_state,
    state_is_fresh,
)
from clusterctl.healthd.kmsg import RecordReader, parse_gpu_event
from clusterctl.healthd.node_tiers import LocalTiers, TierDoor
from clusterctl.healthd.policy import drain_reason, judge
from clusterctl.healthd.stale_tiers import TRASH_PREFIX, MoveAside, ReclaimSettings, size, stale_tiers
from clusterctl.job_metrics_file import claim_textfile, remove_textfile, textfile_name
from clusterctl.records.drain_reason import DrainReason
from clusterctl.records.healthd_job_start import (
    JobStart, job_start_path, read_job_start, read_job_starts, write_job_start,
)
from clusterctl.records.healthd_diagnostic import append_diagnostic
from clusterctl.records.healthd_state import Alert, HealthdState
from clusterctl.records.healthd_node_record import NodeRecordEntry, append_node_record
from clusterctl.records.healthd_tier_reclaim import ReclaimedTree, TierReclaim, append_tier_reclaim
from clusterctl.records.job_health import HealthFinding, JobHealthRecord, write_job_health
from clusterctl.records.versioned import RecordError
from clusterctl.slurm import drains
from clusterctl.slurm.commands import Runner, subprocess_runner, within_deadline
from clusterctl.slurm.nodes import NodeSlurm, SlurmNode
from clusterctl.text import one_line


def _say(hook: str, message: str) -> None:
    # One line each in slurmd's log, whatever a config path, a kernel line or Slurm put in the message.
    print(f"clusterctl-{hook}: {one_line(message)}", file=sys.stderr, flush=True)


def _setup(hook: str, config: HealthdConfig | None = None, config_path: Path | None = None) -> HealthdConfig:
    """The hook's config: `config`, else healthd.toml (`config_path`, else its default path).

    A config the hook cannot read or understand must not fail the hook: Slurm would drain every node
    at once, around the breaker.  A key that is wrong is dropped alone (its default used) and said, file,
    line and key, in slurmd's log: every other key of the admin's file holds (`healthd status` and `healthd
    run` refuse the file, saying what is wrong with it).  A file that cannot be read or parsed at all leaves
    the defaults, loudly.  Either way the prolog reclaims no checkpoint tiers on settings it could not read
    (`tier_bases`, `tier_keep_hours`): it removes users' files, and the defaults name /dev/shm and /tmp."""
    os.environ.setdefault("PATH", HOOK_PATH)
    if config is not None:
        return config
    try:
        kept = _load_config_within(config_path, CONFIG_READ_SECONDS)
    except ConfigError as exc:
        _say(hook, f"CONFIG NOT USED: {exc}; running with the defaults{_NO_RECLAIM}")
        return replace(HealthdConfig(), tier_bases=())
    except Exception as exc:  # noqa: BLE001 - whatever the reader trips on, the hook must not fail for it
        _say(hook, f"CONFIG NOT USED: {config_path or DEFAULT_PATH}: {exc.__class__.__name__}: {exc}; "
                   f"running with the defaults{_NO_RECLAIM}")
        return replace(HealthdConfig(), tier_bases=())
    for dropped in kept.dropped:
        _say(hook, f"CONFIG KEY DROPPED: {dropped}; using its default, every other key as written")
    if kept.dropped_keys & {"tier_bases", "tier_keep_hours"}:
        _say(hook, "stale checkpoint tiers are not reclaimed until healthd.toml's tier settings are fixed")
        return replace(kept.config, tier_bases=())
    return kept.config


_NO_RECLAIM = " (stale checkpoint tiers are not reclaimed on defaults)"


CONFIG_READ_SECONDS = 5.0
"""How long a hook waits for healthd.toml (a FIFO or a hung mount would block it, before its own budget is known)."""


class _ConfigTimeout(Exception):
    pass


def _load_config_within(path: Path | None, seconds: float) -> KeptConfig:
    def expired(*_: object) -> None:
        raise _ConfigTimeout(f"not read within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return load_config_keeping_valid(path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _bounded(hook: str, seconds: float, on_timeout_exit: Callable[[], int]) -> Iterator[None]:
    """Never hang: past `seconds` the hook says so and exits with `on_timeout_exit()` (SIGALRM);
    disarmed on the way out."""
    def expired(*_: object) -> None:
        code = on_timeout_exit()
        _say(hook, f"gave up after {seconds:g} s (a hung driver or Slurm command?); exit {code}")
        os._exit(code)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class DrainOutcome:
    """What a hook's drain attempt came to: one line for slurmd's log, and whether the node is out of service."""

    text: str
    out_of_service: bool


def _drain(config: HealthdConfig, node: str, reason: DrainReason,
           slurm_factory: Callable[[str], NodeSlurm]) -> DrainOutcome:
    """Drain for `reason` through the drain door with the daemon's own rules (clusterctl/slurm/drains.py,
    healthd/drain_requests.py): never over another drain, and never past the breaker's share of the
    partition, so a fault seen on every node at once (a driver update, a forged line) cannot take the
    whole partition out through the hooks either.

    When the running healthd found the breaker open less than breaker_retry ago, that verdict
    stands and Slurm is not asked: in such an event every job start on every node would
    otherwise read the partition again."""
    now = time.time()
    refused = recent_breaker_alert(config, now)
    if refused is not None:
        return DrainOutcome(f"breaker open (healthd, {refused.at}), not draining: {refused.detail}", False)
    slurm = slurm_factory(node)
    breaker = Breaker(slurm, node, config.breaker_dir, config.breaker_max_share)
    request = drains.DrainRequest(node, "drain", reason)
    try:
        done = drains.apply(slurm, drain_rules(EngineSettings.from_config(config, node)), request, breaker)
    except SlurmCommandError as exc:
        return DrainOutcome(f"could not drain ({exc})", False)
    decision, state = done.verdict, done.node
    if decision.result == "drained":
        return DrainOutcome(f"drained: {request.text}", True)
    if decision.result in ("already-drained", "kept-other-drain") and state is not None:
        return DrainOutcome(f"already drained ({state.reason})", True)
    if decision.result == "breaker-open":
        return DrainOutcome(f"breaker open, not draining: {decision.detail}", False)
    if decision.result != "dry-run":
        return DrainOutcome(done.describe(), False)
    return DrainOutcome(f"dry run: would drain: {request.text}", False)


def recent_breaker_alert(config: HealthdConfig, now: float) -> Alert | None:
    """The breaker-open alert a live healthd raised less than breaker_retry ago, if any."""
    state, _ = read_state(config)
    if state is None or not state_is_fresh(state, config, now):
        return None
    for alert in reversed(state.alerts):
        at = parse_utc(alert.at)
        if alert.alert == "breaker-open" and at is not None and 0 <= now - at < config.breaker_retry:
            return alert
    return None


def _problem_reason(problem: Problem) -> DrainReason:
    return drain_reason(problem.finding, problem.verdict, time.time())


_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _job_id(environ: Mapping[str, str]) -> str | None:
    """SLURM_JOB_ID if it is a job id (ASCII digits): it becomes a file name in shared directories."""
    job = environ.get("SLURM_JOB_ID", "")
    return job if job.isascii() and job.isdigit() and len(job) <= 20 else None


def _node_name(environ: Mapping[str, str], config: HealthdConfig) -> str:
    node = environ.get("SLURMD_NODENAME") or config.node_name
    return node if _NODE_NAME.fullmatch(node) else config.node_name


def _job_uid(environ: Mapping[str, str]) -> int | None:
    uid = environ.get("SLURM_JOB_UID", "")
    return int(uid) if uid.isascii() and uid.isdigit() and len(uid) <= 10 else None


HOOK_RESERVE = 0.25
"""Share of a hook's budget (`hook_timeout`) kept back from its Slurm calls, for what comes after them:
the prolog notes the refusal, both say the outcome in slurmd's log."""


def _budgeted(runner: Runner, start: float, seconds: float,
              clock: Callable[[], float]) -> Callable[[str], NodeSlurm]:
    """A hook's `slurm_factory` whose Slurm calls (however many its drain path makes: the release, the
    node, the partition's share, the drain) share what is left of its budget (`seconds`: `hook_timeout`)
    less HOOK_RESERVE, counted from the hook's `start`: each call's timeout is cut to it, and none is
    made once it is spent."""
    budgeted = within_deadline(runner, start + seconds * (1 - HOOK_RESERVE), clock)
    return lambda node: SlurmNode(node, budgeted)


@dataclass
class _Refusal:
    """Whether the prolog's drain door left the node out of service: the one case it may exit 1."""

    node_drained: bool = False

    def exit_code(self) -> int:
        return 1 if self.node_drained else 0


def run_prolog(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm] | None = None,
               config: HealthdConfig | None = None, node_check: Callable[..., GateReport] = check_node, *,
               config_path: Path | None = None, runner: Runner = subprocess_runner,
               clock: Callable[[], float] = time.monotonic, tiers: TierDoor | None = None,
               diagnostic_door: DiagnosticDoor = run_diagnostic) -> int:
    """0 lets the job start; 1 refuses it (Slurm drains the node and requeues the job).

    A job is refused only when the node is (now) drained by the drain door: Slurm drains a node
    whose prolog fails, so refusing while the breaker holds the drain back, while Slurm cannot be
    asked, at the hook's own deadline, on a config it cannot read or on a bug would be a drain
    around the breaker (on every node at once, for a config).  The job then starts and the reason
    is logged.  The Slurm calls of the drain path (up to four: the release, the node, the partition's
    share, the drain) share what is left of `hook_timeout` (`runner`'s timeouts are cut to it), so
    they end before the deadline.

    On a node with a `preflight` diagnostic ([diagnostics], or `dcgmi diag -r 1` where DCGM is installed),
    a node the gate finds clean runs it (through `diagnostic_door`) within PREFLIGHT_SHARE of the budget;
    one that fails refuses the job as any other blocking problem does (`preflight`).

    A job let in then gets the node's memory and disk back from checkpoint tiers nobody resumes from
    (`reclaim_stale_tiers`, through `tiers`: the node's own tier bases unless a test gives its own door).
    """
    start = clock()
    config = _setup("prolog", config, config_path)
    refusal = _Refusal()
    if slurm_factory is None:
        slurm_factory = _budgeted(runner, start, config.hook_timeout, clock)
    with _bounded("prolog", config.hook_timeout, refusal.exit_code):
        try:
            preflight = _Preflight(diagnostic_door, start + config.hook_timeout * PREFLIGHT_SHARE, clock)
            code = _prolog(environ, slurm_factory, config, node_check, refusal, preflight)
        except Exception as exc:  # noqa: BLE001 - a bug must not drain the node around the breaker
            _say("prolog", f"job {environ.get('SLURM_JOB_ID', 'unknown')!r}: gave up: "
                           f"{exc.__class__.__name__}: {exc}; exit {refusal.exit_code()}")
            return refusal.exit_code()
        if code == 0 and config.job_metrics_dir is not None:
            _claim_job_metrics(environ, config.job_metrics_dir)
        if code == 0 and config.tier_bases:
            reclaim_stale_tiers(environ, config, tiers or LocalTiers(config.tier_bases),
                                deadline=start + config.hook_timeout * (1 - HOOK_RESERVE), clock=clock)
        return code


SAID_TREES = 8
"""Trees named in slurmd's log line at most (the journal keeps them all)."""


def reclaim_stale_tiers(environ: Mapping[str, str], config: HealthdConfig, tiers: TierDoor, *, deadline: float,
                        clock: Callable[[], float] = time.monotonic) -> tuple[ReclaimedTree, ...]:
    """Remove the checkpoint tiers on this node nobody will resume from (healthd/stale_tiers.py says which),
    before the job of `environ` starts; what was removed or tried, also said in slurmd's log and appended to
    `<journal_dir>/tier-reclaims.jsonl`.

    Never fails the prolog: an error is one line in slurmd's log and the job starts.  No removal starts past
    `deadline` (on `clock`): what is left waits for the next job's prolog."""
    job = _job_id(environ) or "unknown"
    try:
        return _reclaim(job, _node_name(environ, config), _job_uid(environ), config, tiers, deadline, clock)
    except Exception as exc:  # noqa: BLE001 - a cleanup must never keep a job from a healthy node
        _say("prolog", f"job {job}: stale checkpoint tiers not reclaimed: {exc.__class__.__name__}: {exc}")
        return ()


def _reclaim(job: str, node: str, uid: int | None, config: HealthdConfig, tiers: TierDoor, deadline: float,
             clock: Callable[[], float]) -> tuple[ReclaimedTree, ...]:
    if uid is None:
        _say("prolog", f"job {job}: SLURM_JOB_UID is not a uid: stale checkpoint tiers not reclaimed")
        return ()
    began = clock()
    held = tiers.look(uid)
    starts, _unreadable = read_job_starts(config.journal_dir)  # the epilog says what it cannot read
    plan = stale_tiers(held, starts, ReclaimSettings(uid, config.tier_keep_hours * 3600, time.time(), job))
    done = _move_planted(job, plan.moves, tiers, deadline, clock)
    moved = len(done)
    notes = [*held.notes, *plan.left_alone]
    for note in notes[:SAID_TREES]:  # a user can plant any number of look-alikes: a few said, the rest counted
        _say("prolog", f"job {job}: {note}")
    if len(notes) > SAID_TREES:
        _say("prolog", f"job {job}: and {len(notes) - SAID_TREES} more names like a checkpoint tier's left alone")
    for reclaim in plan.reclaims:
        if clock() >= deadline:
            _say("prolog", f"job {job}: out of time: {len(plan.reclaims) - len(done) + moved} stale checkpoint tier(s) "
                           "left for the next job's prolog")
            break
        if reclaim.uid != uid and not reclaim.parent and not reclaim.name.startswith(TRASH_PREFIX) \
                and reclaim.uid in tiers.running_uids():
            continue  # a job of theirs started here since the look (a shared node): theirs again
        removed = tiers.remove(reclaim, max(deadline - clock(), 0.0))
        done.append(ReclaimedTree(reclaim.path, reclaim.uid, reclaim.runs, removed.freed_bytes, reclaim.why,
                                  removed.error))
    if not done:
        return ()
    if len(done) > moved:
        _say_reclaimed(job, config, done[moved:], max(clock() - began, 0.0))
    seconds = max(clock() - began, 0.0)
    try:
        append_tier_reclaim(config.journal_dir, TierReclaim(utc(time.time()), job, node, round(seconds, 3),
                                                            tuple(done)))
    except OSError as exc:
        _say("prolog", f"job {job}: reclaim not recorded in {config.journal_dir}: {exc}")
    return tuple(done)


def _move_planted(job: str, moves: tuple[MoveAside, ...], tiers: TierDoor, deadline: float,
                  clock: Callable[[], float]) -> list[ReclaimedTree]:
    """Move each planted `clusterctl-<uid>` aside (a rename each; the first few said in slurmd's log, every one
    in the journal) until `deadline`; what the journal keeps of them."""
    done: list[ReclaimedTree] = []
    for move in moves:
        if clock() >= deadline:
            break
        error = tiers.move_aside(move)
        base, owner = move.base.rstrip("/"), owner_label(move.owner)
        if len(done) < SAID_TREES:
            _say("prolog", f"job {job}: {move.path} was made by {owner}, not by uid {move.uid} (planted: it locks "
                           f"uid {move.uid}'s jobs out of their node-local directory here): "
                           + (f"moved aside to {base}/{move.new_name}" if error is None else f"NOT moved aside: {error}"))
        done.append(ReclaimedTree(move.path, move.owner, 0, 0, f"planted by {owner} for uid {move.uid}: moved aside "
                                                               f"to {base}/{move.new_name}", error))
    if len(done) > SAID_TREES:
        _say("prolog", f"job {job}: and {len(done) - SAID_TREES} more planted directories moved aside")
    return done


def _say_reclaimed(job: str, config: HealthdConfig, done: list[ReclaimedTree], seconds: float) -> None:
    said = [f"{tree.path} (uid {tree.uid}, {tree.runs} run(s), {size(tree.freed_bytes)}: {tree.why})"
            + (f" NOT removed: {tree.error}" if tree.error is not None else "") for tree in done[:SAID_TREES]]
    if len(done) > SAID_TREES:
        said.append(f"{len(done) - SAID_TREES} more in {config.journal_dir}")
    _say("prolog", f"job {job}: reclaimed {size(sum(t.freed_bytes for t in done))} of stale checkpoint tiers in "
                   f"{seconds:.2f} s: " + "; ".join(said))


PREFLIGHT_SHARE = 0.5
"""The prolog's pre-flight diagnostic ends by this share of `hook_timeout` (counted from the prolog's start):
what is left is room for the drain door's Slurm calls (they end by 1 - HOOK_RESERVE) and the notes."""
MIN_PREFLIGHT_S = 1.0
"""Less time than this left for the pre-flight: it is skipped (said), not started to be cut short."""


@dataclass(frozen=True)
class _Preflight:
    """How the prolog runs its pre-flight diagnostic: the door, the deadline (on `clock`) it must end by."""

    door: DiagnosticDoor
    deadline: float
    clock: Callable[[], float]


def preflight(config: HealthdConfig, job: str, door: DiagnosticDoor, seconds_left: float) -> Problem | None:
    """Run the `preflight` diagnostic if one is in force and `seconds_left` allows; a Problem when it failed.

    Only a run that said "fail" refuses: one that could not start, whose output could not be read, or that
    ran out of time (its own timeout, or the prolog's budget) lets the job in, said in slurmd's log: a
    missing DCGM host engine, or a budget too small for the level, is the same on every node at once.
    A result other than a pass is journaled (diagnostics.jsonl; passes are not: one per job start)."""
    spec = diagnostics_in_force(config).preflight
    if spec is None:
        return None
    if seconds_left < MIN_PREFLIGHT_S:
        _say("prolog", f"job {job}: pre-flight {spec.name} skipped: {max(seconds_left, 0):.1f} s left of the "
                       f"prolog's budget (hook_timeout {config.hook_timeout:g} s)")
        return None
    result = door(spec, "preflight", seconds_left)
    if result.outcome != "pass":
        try:
            append_diagnostic(config.journal_dir, result)
        except OSError as exc:
            _say("prolog", f"job {job}: pre-flight result not journaled in {config.journal_dir}: {exc}")
    if result.outcome == "fail":
        finding = Finding("diagnostic-failed", "prolog", result.at, value=spec.name,
                          detail=f"{result.describe()}; output: {result.excerpt}" if result.excerpt
                          else result.describe())
        return Problem(finding, gate_verdict(finding, config.policy))
    if result.outcome != "pass":
        _say("prolog", f"job {job}: pre-flight {result.describe()}: let in (says nothing about this node)")
    return None


def _prolog(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm], config: HealthdConfig,
            node_check: Callable[..., GateReport], refusal: _Refusal, preflight_run: _Preflight | None = None) -> int:
    job = _job_id(environ) or "unknown"
    node = _node_name(environ, config)
    gpus = parse_job_gpus(environ.get("SLURM_JOB_GPUS"))
    report = node_check(config, gpus)
    # GPUs NVML cannot judge here cannot pass a diagnostic either: that is the same on every node at once.
    if report.ok and preflight_run is not None and report.gpus_unchecked is None:
        failed = preflight(config, job, preflight_run.door, preflight_run.deadline - preflight_run.clock())
        if failed is not None:
            report.problems.append(failed)
    for note in report.notes:
        _say("prolog", f"job {job}: {note}")
    if report.gpus_unchecked is not None:
        # NVML that cannot be used is the same on every node at once (a driver update, a missing library):
        # refusing for it would drain them all, so the job starts, said, and `healthd check` exits 5.
        _say("prolog", f"job {job}: GPUs not checked ({report.gpus_unchecked}): let in")
    if job != "unknown":
        # The epilog judges findings within the job's window, which starts now; healthd attributes
        # an Xid on one of these GPUs to this job (and its user).
        try:
            write_job_start(config.journal_dir, JobStart(job, time.time(), tuple(gpus) if gpus is not None else None,
                                                         _job_uid(environ)))
        except OSError as exc:
            _say("prolog", f"job {job}: start not noted in {config.journal_dir}: {exc}")
    if report.ok:
        return 0
    for problem in report.problems:
        _say("prolog", f"job {job} refused on {node}: {problem.describe()}")
    outcome = _drain(config, node, _problem_reason(report.problems[0]), slurm_factory)
    refusal.node_drained = outcome.out_of_service
    _say("prolog", outcome.text)
    try:
        append_node_record(config.journal_dir, NodeRecordEntry(utc(time.time()), "prolog", job, node,
                                                               tuple(p.describe() for p in report.problems),
                                                               outcome.text))
    except OSError as exc:
        _say("prolog", f"refusal not recorded in {config.journal_dir}: {exc}")
    if not outcome.out_of_service:
        _say("prolog", f"job {job} let in after all: refusing it would drain {node} ({outcome.text})")
        return 0
    return 1


def _gpu_addresses(config: HealthdConfig, state: HealthdState | None) -> dict[str, int]:
    """This node's GPUs by PCI address (healthd's state, else NVML directly): whose kernel lines count."""
    if state is not None and any(gpu.pci_bus for gpu in state.gpus):
        return {gpu.pci_bus: gpu.index for gpu in state.gpus if gpu.pci_bus}
    try:
        from clusterctl.healthd.nvml import Nvml, NvmlError, NvmlHang, TimedCalls

        nvml = Nvml(TimedCalls(2.0, max_abandoned=1))
        try:
            nvml.init()
            return {identity.pci_bus: identity.index for identity in nvml.discover()}
        except (NvmlError, NvmlHang):
            return {}
    except ImportError:  # pragma: no cover - a broken install
        return {}


def _kernel_findings(config: HealthdConfig, start: float, end: float, identities: dict[str, int]) -> list[Finding]:
    """Xids the driver logged about this node's GPUs (`identities`: PCI address → index) during [start, end]
    (its records carry microseconds since boot)."""
    import psutil

    boot = psutil.boot_time()
    try:
        reader = RecordReader(config.kmsg)
    except OSError:
        return []
    try:
        records = reader.available()
    finally:
        reader.close()
    found = []
    for record in records:
        at = boot + record.usec / 1e6
        event = parse_gpu_event(record, identities)
        if event is not None and start <= at <= end:
            found.append(Finding("xid", "kmsg", at, gpu=identities.get(event.pci_bus), xid=event.xid,
                                 value=event.pci_bus, detail=event.message[:200]))
    return found


def run_epilog(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm] | None = None,
               config: HealthdConfig | None = None, node_check: Callable[..., GateReport] = check_node, *,
               config_path: Path | None = None, runner: Runner = subprocess_runner,
               clock: Callable[[], float] = time.monotonic,
               kill_leftovers: Callable[[str, int | None], list[int]] | None = None) -> int:
    """Kill the job's leftover tasks; record what broke on this node during the job; drain for
    hardware faults. Always 0.

    A failing epilog drains the node in Slurm with a reason nobody can act on, so nothing
    escapes: a record that cannot be written (unwritable, planted) is logged and skipped.  The
    Slurm calls of the drain path share what is left of `hook_timeout` as the prolog's do, and come
    last.  `kill_leftovers` (job id, job's uid → pids killed) is `kill_strays` unless a test gives its own.
    """
    start = clock()
    config = _setup("epilog", config, config_path)
    if slurm_factory is None:
        slurm_factory = _budgeted(runner, start, config.hook_timeout, clock)
    with _bounded("epilog", config.hook_timeout, lambda: 0):  # a stuck epilog must not drain the node by itself
        try:
            _epilog(environ, slurm_factory, config, node_check, kill_leftovers or kill_strays)
        except Exception as exc:  # noqa: BLE001 - the last line of defence of "always 0"
            _say("epilog", f"job {environ.get('SLURM_JOB_ID', 'unknown')!r}: gave up: {exc.__class__.__name__}: {exc}")
    return 0


def _job_start(config: HealthdConfig, job: str, end: float) -> float:
    try:
        record = read_job_start(config.journal_dir, job)
    except RecordError as exc:
        _say("epilog", f"job {job}: {exc}; looking back a day")
        record = None
    return record.start if record is not None else end - 24 * 3600  # no prolog record: look back a day


def _epilog(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm], config: HealthdConfig,
            node_check: Callable[..., GateReport], kill_leftovers: Callable[[str, int | None], list[int]]) -> None:
    job = _job_id(environ)
    if job is None:
        _say("epilog", f"SLURM_JOB_ID {environ.get('SLURM_JOB_ID')!r} is not a job id: nothing recorded")
        return
    # The local work first, Slurm last.  At hook_timeout the epilog ends wherever it is (_bounded), and
    # a Slurm call may outlast its own timeout (a client stuck on a hung controller or mount): a time
    # reserve alone would then not save what comes after it.  Killing the leftovers is a /proc scan that
    # needs neither Slurm nor the GPUs, and a leftover may hold a GPU the next job is given: it comes
    # first.  The record comes before the drain because the supervisor reads it (a hardware verdict is
    # the evidence even when the drain cannot be made), and the job-start note is forgotten with it.
    killed = kill_leftovers(job, _job_uid(environ))
    if killed:
        _say("epilog", f"job {job}: killed {len(killed)} leftover task(s): {', '.join(map(str, killed))}")
    if config.job_metrics_dir is not None:
        _remove_job_metrics(config.job_metrics_dir, job)
    node = _node_name(environ, config)
    gpus = parse_job_gpus(environ.get("SLURM_JOB_GPUS"))
    end = time.time()
    start = _job_start(config, job, end)
    findings: dict[tuple[int | None, str, int | None], HealthFinding] = {}

    def add(finding: Finding, action: Action, reason: str, source: str) -> None:
        if gpus is not None and finding.gpu is not None and finding.gpu not in gpus:
            return
        key = (finding.gpu, finding.kind, finding.xid)
        if key not in findings or findings[key].action < action:
            findings[key] = HealthFinding(kind=finding.kind, action=action, reason=reason, source=source,
                                          at=utc(finding.at), xid=finding.xid, gpu=finding.gpu, uuid=finding.uuid,
                                          detail=finding.detail)

    state, unusable = read_state(config)
    if unusable:
        _say("epilog", f"job {job}: {unusable}")
    if state is not None:
        for gpu in state.gpus:
            for f in gpu.findings:
                # What the last check still sees holds now; an event counts if it happened during the job.
                if (f.current or start - 1 <= f.at_ts <= end) and f.action > Action.IGNORE:
                    finding = Finding(f.kind, f.source, f.at_ts if not f.current else end, gpu=gpu.index,
                                      uuid=gpu.uuid, xid=f.xid, detail=f.detail)
                    add(finding, f.action, f.reason, "healthd")
    identities = _gpu_addresses(config, state)
    if not identities:
        _say("epilog", f"job {job}: this node's GPU addresses are unknown: the kernel log is not consulted")
    for finding in _kernel_findings(config, start - 1, end, identities):
        verdict = judge(finding, (), config.policy)
        if verdict.action > Action.IGNORE:
            add(finding, verdict.action, verdict.reason, "kernel log")
    # What is still wrong now: from healthd when it is alive (cheap), else NVML directly.
    for problem in node_check(config, gpus, direct=not state_is_fresh(state, config, end)).problems:
        add(Finding(problem.finding.kind, "epilog", end, gpu=problem.finding.gpu, uuid=problem.finding.uuid,
                    xid=problem.finding.xid, detail=problem.finding.detail),
            problem.verdict.action, problem.verdict.reason, "epilog check")
    ordered = tuple(sorted(findings.values(), key=lambda f: (f.at or "", f.gpu if f.gpu is not None else -1)))
    record = JobHealthRecord(job_id=job, node=node, window_start=utc(start), window_end=utc(end),
                             written_at=utc(time.time()), gpus=tuple(gpus) if gpus is not None else None,
                             findings=ordered, exit_code=environ.get("SLURM_JOB_EXIT_CODE"))
    try:
        path = write_job_health(config.job_records_dir, record)
        _say("epilog", f"job {job}: {record.verdict.label}, {len(ordered)} finding(s) → {path}")
    except (OSError, ClusterctlError) as exc:  # the drain below still happens
        _say("epilog", f"job {job}: {record.verdict.label}, {len(ordered)} finding(s); record NOT written: {exc}")
    job_start_path(config.journal_dir, job).unlink(missing_ok=True)
    hardware = record.worst_finding()
    if record.hardware_fault and hardware is not None:
        reason = DrainReason(kind=hardware.kind, action=hardware.action, at=utc(end), xid=hardware.xid,
                             gpu=hardware.gpu, uuid=hardware.uuid)
        _say("epilog", _drain(config, node, reason, slurm_factory).text)


def _claim_job_metrics(environ: Mapping[str, str], directory: Path) -> None:
    """Give the job's metrics file name in `job_metrics_dir` to the job's user before the job starts
    (clusterctl/job_metrics_file.py, `claim_textfile`): a file another user created there first would
    otherwise export forged figures under the job's id.  Said when something was replaced; never fails
    the prolog."""
    job, uid = _job_id(environ), _job_uid(environ)
    gid = environ.get("SLURM_JOB_GID", "")
    if job is None or uid is None:
        return
    try:
        replaced = claim_textfile(directory, job, uid, int(gid) if gid.isascii() and gid.isdigit() else uid)
    except (OSError, ClusterctlError) as exc:
        _say("prolog", f"job {job}: its metrics file in job_metrics_dir {directory} not made ready: "
                       f"{getattr(exc, 'strerror', None) or exc}")
        return
    if replaced is not None:
        _say("prolog", f"job {job}: {directory}/{textfile_name(job)} was {replaced}, not of the job's uid {uid} "
                       "(made first by another user): replaced with the job's own, empty")


def _remove_job_metrics(directory: Path, job: str) -> None:
    """Remove the job's metrics file from node_exporter's textfile directory (`job_metrics_dir`), which
    its agent left if it was killed hard (clusterctl/job_metrics_file.py); said only when there was one.

    Root removes by a name built from slurmd's job id, relative to the admin's directory opened without
    following a symlink there, and unlink never follows one: a link a user planted at that name is itself
    removed, nothing it points to.  A directory others may write (the jobs write there) is no hazard
    for that, so it is not refused."""
    try:
        removed = remove_textfile(directory, job, follow_symlinks=False)
    except OSError as exc:
        hint = ": name the real directory, not a symlink to it" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else ""
        _say("epilog", f"job {job}: cannot remove its metrics file from job_metrics_dir {directory} "
                       f"({exc.strerror}){hint}")
        return
    if removed:
        _say("epilog", f"job {job}: removed {', '.join(removed)} from {directory} (its agent did not)")


def _ancestors(pid: int, proc: Path) -> set[int]:
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            stat = (proc / str(pid) / "stat").read_text()
            pid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def in_job_cgroup(cgroup_text: str, job: str) -> bool:
    """`/proc/<pid>/cgroup` places the process under Slurm's `job_<id>` cgroup (v1 or v2 layout).

    Only slurmstepd puts processes there, and users cannot move theirs into it: unlike an
    environment variable, a process cannot claim it.
    """
    wanted = f"job_{job}"
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if wanted in path.split("/"):
            return True
    return False


def _real_uid(status_text: str) -> int | None:
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def kill_strays(job: str, uid: int | None, *, proc: Path = Path("/proc"),
                kill: Callable[[int, int], None] = os.kill) -> list[int]:
    """Best effort: SIGKILL tasks of the job still alive after it ended (Slurm normally kills them); their pids.

    A task is one in the job's cgroup (`in_job_cgroup`) that runs as the job's user (`uid`,
    from SLURM_JOB_UID): never a process that merely sets SLURM_JOB_ID in its environment,
    never another user's, never this hook's own ancestry (slurmd's hook runner).  Without a
    uid, or on a node whose Slurm puts jobs in no cgroup, nothing is killed.
    """
    if uid is None or not (job.isascii() and job.isdigit()):
        return []
    spared = _ancestors(os.getpid(), proc)
    killed = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            if not in_job_cgroup((entry / "cgroup").read_text(), job) or _real_uid((entry / "status").read_text()) != uid:
                continue
            kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue
        killed.append(int(entry.name))
    return killed


EXIT_GPUS_NOT_CHECKED = 5
"""`healthd check`: this node should have GPUs (healthd.toml `gpus_expected`) and NVML cannot judge them."""

HEALTHCHECK_LIMIT = 50.0
"""Seconds HealthCheckProgram may take at most, whatever `hook_timeout` says: slurmd kills it at 60 s."""


def run_health_check(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm] | None = None,
                     config: HealthdConfig | None = None, *, config_path: Path | None = None,
                     runner: Runner = subprocess_runner, clock: Callable[[], float] = time.monotonic,
                     pci_devices: Path = PCI_DEVICES) -> int:
    """Slurm's HealthCheckProgram: healthd's cached verdicts (milliseconds), else a quick direct check.
    Its drain path's Slurm calls share its budget as the prolog's and the epilog's do.

    0: healthy, or a problem handed to the drain door (which says what it did); EXIT_GPUS_NOT_CHECKED when
    nothing blocks but the GPUs this node should have (`gpus_expected`; "auto" reads `pci_devices`) could not
    be judged (no NVML).  Slurm only logs a non-zero exit of a HealthCheckProgram: it drains nothing."""
    start = clock()
    config = _setup("healthcheck", config, config_path)
    seconds = min(config.hook_timeout, HEALTHCHECK_LIMIT)
    if slurm_factory is None:
        slurm_factory = _budgeted(runner, start, seconds, clock)
    with _bounded("healthcheck", seconds, lambda: 0):
        return _health_check(environ, slurm_factory, config, pci_devices)


def _health_check(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm], config: HealthdConfig,
                  pci_devices: Path) -> int:
    node = _node_name(environ, config)
    state, unusable = read_state(config)
    if unusable:
        _say("healthcheck", unusable)
    if state is not None and state_is_fresh(state, config, time.time()):
        problems = from_state(state, None)
        source = "healthd state"
        unchecked = None if state.nvml_ok else "healthd cannot use NVML (see `healthd status`)"
    else:
        _say("healthcheck", "healthd is not running or its state is stale: checking NVML directly")
        report = check_node(config, None)
        for note in report.notes:
            _say("healthcheck", note)
        problems = report.problems
        source = "direct check"
        unchecked = report.gpus_unchecked
    if not problems:
        return _said_healthy(node, source, unchecked, config, pci_devices)
    for problem in problems:
        _say("healthcheck", f"{node}: {problem.describe()} ({source})")
    # At slurmd start the node may not be registered yet: the Slurm command then fails or times out
    # (bounded), and the next run drains.
    _say("healthcheck", _drain(config, node, _problem_reason(problems[0]), slurm_factory).text)
    return 0


def _said_healthy(node: str, source: str, unchecked: str | None, config: HealthdConfig, pci_devices: Path) -> int:
    """The line of a node with no blocking problem, and its exit: a node whose GPUs could not be judged is
    not called healthy when it should have GPUs."""
    for line in diagnostics_in_force(config).describe():
        _say("healthcheck", f"{node} {line}")
    if unchecked is None:
        print(f"clusterctl-healthcheck: {node} healthy ({source})")
        return 0
    expected, why = gpus_expected(config, pci_devices)
    if not expected:
        print(f"clusterctl-healthcheck: {node} healthy ({source}; GPUs not checked: {unchecked}; none expected "
              f"here: {why})")
        return 0
    print(f"clusterctl-healthcheck: {node} GPUs NOT CHECKED ({source}): {unchecked}; expected here: {why} "
          f"(exit {EXIT_GPUS_NOT_CHECKED})")
    return EXIT_GPUS_NOT_CHECKED
