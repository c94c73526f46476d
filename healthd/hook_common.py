"""What the Slurm prolog, epilog and HealthCheckProgram share (their own logic: prolog/run.py,
epilog/run.py, healthd/healthcheck.py).

All three run as root with an empty environment, so PATH is set here (`hook_config`), the configuration
is read from its default path, and every step is bounded by `hook_timeout` (`bounded`); their Slurm calls
share what is left of it (`budgeted_slurm`) and drain only through the drain door (`drain_node`).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from clusterctl.clock import parse_utc
from clusterctl.errors import SlurmCommandError
from clusterctl.healthd.breaker import Breaker
from clusterctl.healthd.config import DEFAULT_PATH, ConfigError, HealthdConfig, KeptConfig, load_config_keeping_valid
from clusterctl.healthd.drain_requests import drain_rules
from clusterctl.healthd.engine import EngineSettings
from clusterctl.healthd.gate import HOOK_PATH, Problem, read_state, state_is_fresh
from clusterctl.healthd.policy import drain_reason
from clusterctl.records.drain_reason import DrainReason
from clusterctl.records.healthd_state import Alert
from clusterctl.slurm import drains
from clusterctl.slurm.commands import Runner, within_deadline
from clusterctl.slurm.nodes import NodeSlurm, SlurmNode
from clusterctl.text import one_line


def say(hook: str, message: str) -> None:
    # One line each in slurmd's log, whatever a config path, a kernel line or Slurm put in the message.
    print(f"clusterctl-{hook}: {one_line(message)}", file=sys.stderr, flush=True)


def hook_config(hook: str, config: HealthdConfig | None = None, config_path: Path | None = None) -> HealthdConfig:
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
        say(hook, f"CONFIG NOT USED: {exc}; running with the defaults{_NO_RECLAIM}")
        return replace(HealthdConfig(), tier_bases=())
    except Exception as exc:  # noqa: BLE001 - whatever the reader trips on, the hook must not fail for it
        say(hook, f"CONFIG NOT USED: {config_path or DEFAULT_PATH}: {exc.__class__.__name__}: {exc}; "
                   f"running with the defaults{_NO_RECLAIM}")
        return replace(HealthdConfig(), tier_bases=())
    for dropped in kept.dropped:
        say(hook, f"CONFIG KEY DROPPED: {dropped}; using its default, every other key as written")
    if kept.dropped_keys & {"tier_bases", "tier_keep_hours"}:
        say(hook, "stale checkpoint tiers are not reclaimed until healthd.toml's tier settings are fixed")
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
def bounded(hook: str, seconds: float, on_timeout_exit: Callable[[], int]) -> Iterator[None]:
    """Never hang: past `seconds` the hook says so and exits with `on_timeout_exit()` (SIGALRM);
    disarmed on the way out."""
    def expired(*_: object) -> None:
        code = on_timeout_exit()
        say(hook, f"gave up after {seconds:g} s (a hung driver or Slurm command?); exit {code}")
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


def drain_node(config: HealthdConfig, node: str, reason: DrainReason,
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


def problem_reason(problem: Problem) -> DrainReason:
    return drain_reason(problem.finding, problem.verdict, time.time())


_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def job_id(environ: Mapping[str, str]) -> str | None:
    """SLURM_JOB_ID if it is a job id (ASCII digits): it becomes a file name in shared directories."""
    job = environ.get("SLURM_JOB_ID", "")
    return job if job.isascii() and job.isdigit() and len(job) <= 20 else None


def node_name(environ: Mapping[str, str], config: HealthdConfig) -> str:
    node = environ.get("SLURMD_NODENAME") or config.node_name
    return node if _NODE_NAME.fullmatch(node) else config.node_name


def job_uid(environ: Mapping[str, str]) -> int | None:
    uid = environ.get("SLURM_JOB_UID", "")
    return int(uid) if uid.isascii() and uid.isdigit() and len(uid) <= 10 else None


HOOK_RESERVE = 0.25
"""Share of a hook's budget (`hook_timeout`) kept back from its Slurm calls, for what comes after them:
the prolog notes the refusal, both say the outcome in slurmd's log."""


def budgeted_slurm(runner: Runner, start: float, seconds: float,
              clock: Callable[[], float]) -> Callable[[str], NodeSlurm]:
    """A hook's `slurm_factory` whose Slurm calls (however many its drain path makes: the release, the
    node, the partition's share, the drain) share what is left of its budget (`seconds`: `hook_timeout`)
    less HOOK_RESERVE, counted from the hook's `start`: each call's timeout is cut to it, and none is
    made once it is spent."""
    budgeted = within_deadline(runner, start + seconds * (1 - HOOK_RESERVE), clock)
    return lambda node: SlurmNode(node, budgeted)
