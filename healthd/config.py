"""healthd.toml: every setting, its default and its validation (errors name the file and key)."""

from __future__ import annotations

import math
import os
import re
import socket
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

from clusterctl.errors import ClusterctlError
from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.diagnostics import LEVELS, PARSERS, DiagnosticSpec, Diagnostics
from clusterctl.healthd.proof_verdict import ProofLimits
from clusterctl.healthd.prove import PROOF_PARSERS, ProveSettings
from clusterctl.healthd.findings import Action
from clusterctl.healthd.policy import PolicyConfig
from clusterctl.job_metrics_file import NODE_CONFIG
from clusterctl.slurm.names import is_node_name

DEFAULT_PATH = NODE_CONFIG
"""/etc/clusterctl/healthd.toml (a job's agent reads its `job_metrics_dir` too)."""


class ConfigError(ClusterctlError):
    """A healthd.toml value that is missing or wrong; the message names file and key.

    `healthd` exits with EX_CONFIG (sysexits.h) on it; the hooks say it and go on with the defaults,
    a running daemon keeps its config.
    """

    exit_code = 78  # EX_CONFIG

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key
        """The dotted key it is about ('' for the whole file)."""


@dataclass(frozen=True)
class HealthdConfig:
    node: str = ""
    """This node's Slurm name (default: the host name)."""
    partition: str = ""
    """Partition for the drain breaker (default: the node's first partition)."""
    state_dir: Path = Path("/run/healthd")
    """state.json lives here: read by `healthd status`, the prolog and HealthCheckProgram."""
    journal_dir: Path = Path("/var/lib/healthd")
    """Durable: the action journal, the kernel-log cursor and the app-Xid history."""
    kmsg: Path = Path("/dev/kmsg")
    boot_id: Path = Path("/proc/sys/kernel/random/boot_id")
    dry_run: bool = False
    check_interval: float = 15.0
    nvml_timeout: float = 5.0
    event_wait_ms: int = 1000
    xid_dedup_window: float = 300.0
    metrics: str = "127.0.0.1:9489"
    """host:port for Prometheus metrics; empty disables.  Loopback by default (a Prometheus on another host
    needs "0.0.0.0:9489" or the node's address); not 9400, dcgm-exporter's port on most GPU nodes."""
    breaker_max_share: float = 0.1
    """Refuse to drain (and alert) when healthd would then have drained more than this share of the partition."""
    breaker_retry: float = 600.0
    """After the breaker refused a drain, the next try waits this long (jittered, doubling while it stays open)."""
    breaker_dir: Path | None = None
    """A root-owned directory on storage every node of the partition mounts (not writable by anyone else):
    the breaker's drain slots live there (healthd/breaker_ledger.py), so a drain never reads the whole
    node table.  Unset: each drain counts the partition with one grouped `sinfo` (a whole-table read)."""
    breaker_spread_per_node: float = 0.005
    """Before reading the partition's drained share, wait a random time up to this many seconds per node of
    the partition (12,500 nodes: up to 62 s): a fault seen on every node at once spreads its reads out."""
    node_refresh_interval: float = 1800.0
    """How often healthd reads its node's Slurm state when nothing happens (jittered ±20%); it also reads
    it before every drain or resume.  Periodic checks themselves ask Slurm nothing."""
    drained_refresh_interval: float = 60.0
    """How often it reads it while the node is drained or drain-class events wait for it to be back in
    service: an admin's resume is seen this soon.  Few nodes are drained, so this costs the controller little."""
    resume_when_clean: bool = False
    clean_checks: int = 3
    disk_paths: tuple[str, ...] = ("/", "/tmp")
    """Paths whose free space is watched: a full one is a warning (users fill /tmp in ordinary work)."""
    disk_drain_paths: tuple[str, ...] = ()
    """Paths the site opts in to drain for when full (watched too).  Never list a path users can write
    to: any user could then take the node out of service by filling it."""
    job_records_dir: Path = Path("/var/spool/clusterctl/job-health")
    """Where the epilog writes per-job health records (<job>/<node>.json); shared storage, for the supervisor."""
    job_metrics_dir: Path | None = None
    """node_exporter's textfile directory for the jobs' metrics (clusterctl/job_metrics_file.py): each job's agent
    writes clusterctl_job_<JOB>.prom there (a job's CLUSTERCTL_METRICS_TEXTFILE_DIR overrides it) and the epilog
    removes it when the job ends.  The jobs' users must be able to write it (mode 1777: sticky).  Unset: none."""
    hook_timeout: float = 20.0
    """The prolog/epilog give up after this long (not a refusal: exit 0 unless already drained), their Slurm calls
    within three quarters of it; keep it below Slurm's PrologEpilogTimeout."""
    tier_bases: tuple[str, ...] = ("/dev/shm", "/tmp")
    """Where jobs keep node-local checkpoint tiers (`<base>/clusterctl-<uid>/ckpt-<run key>`): the prolog
    reclaims stale ones here (healthd/stale_tiers.py).  The default holds the node-local base every job uses
    unless told otherwise (/dev/shm, else /tmp); add each `[checkpoint] local_dir` your users' specs name.
    Each must be root's, writable by others only with the sticky bit; [] reclaims nothing."""
    tier_keep_hours: float = 24.0
    """A run's tier of the starting job's own user is reclaimed once unused this long (a resubmission of the
    same user landing here within it resumes from it); keep it above the longest checkpoint interval."""
    gpus_expected: bool | str = "auto"
    """Whether this node has GPUs to judge, for `healthd check` when NVML cannot be used: true, false, or
    "auto" (NVIDIA GPUs on the PCI bus, read from sysfs without NVML).  Where GPUs are expected and NVML
    cannot judge them, the check exits 5 instead of calling the node healthy; a node without any (a CPU
    node) is healthy without NVML.  The prolog never refuses a job for it (healthd/gate.py)."""
    ib_root: Path = Path("/")
    """Where healthd reads sys/class/infiniband from ("/" on a real node; the testbed gives each node its own tree)."""
    ib_devices: tuple[str, ...] = ()
    """The IB/RoCE devices (`mlx5_0`, ...) whose ports and PCIe links are judged; [] judges every one found.
    Name them when a node has a port that is down by design (an unused management port)."""
    storage_paths: tuple[str, ...] = ()
    """Shared directories (Lustre, NFS: where checkpoints go) probed once every `[checks] storage_interval_s`
    (at this node's own time in it) with a small file written, fsynced, read back and unlinked; root must be
    able to write there.  [] probes nothing."""
    diagnostic_retry: float = 3600.0
    """A before_return diagnostic that did not pass is run again after this long (or at once after a reboot)."""
    checks: CheckLimits = field(default_factory=CheckLimits)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    diagnostics: Diagnostics | None = None
    """[diagnostics]: per level (preflight, after_failure, before_return) `{ argv = [...], timeout = s,
    parser = "dcgmi" | "exit-code" }`.  None (no table): DCGM's r1/r2/r3 when dcgmi is on PATH, else none
    (healthd/diagnostic_runner.py `diagnostics_in_force`).  An empty table turns them all off."""
    prove: ProveSettings = field(default_factory=ProveSettings)
    """[prove]: how `healthd prove NODE` proves a node with a neighbour (healthd/prove.py)."""

    @property
    def watched_disk_paths(self) -> tuple[str, ...]:
        """Every path whose free space is sampled: the watched ones and the opted-in drain paths."""
        return tuple(dict.fromkeys((*self.disk_paths, *self.disk_drain_paths)))

    @property
    def node_name(self) -> str:
        return self.node or socket.gethostname().split(".")[0]


def load_config(path: Path | None) -> HealthdConfig:
    """Read healthd.toml (a missing default file means all defaults).

    Every caller (run, status, check, evidence, breaker, the prolog and the epilog) comes here, so
    a value is checked the same way for each: its type, its range, never NaN or infinity."""
    found = _read_toml(path)
    if found is None:
        return HealthdConfig()
    return config_from_mapping(*found)


def _read_toml(path: Path | None) -> tuple[dict[str, Any], str, str] | None:
    """healthd.toml parsed, its path and its text; None when `path` is None and the default file is missing."""
    if path is None:
        if not DEFAULT_PATH.exists():
            return None
        path = DEFAULT_PATH
    try:
        text = path.read_bytes().decode("utf-8")
        data = tomllib.loads(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a healthd.toml") from None
    return data, str(path), text


@dataclass(frozen=True)
class _Rule:
    """What one key holds: its kind and, for numbers, the sensible range (inclusive)."""

    kind: str  # bool, auto-bool, int, float, path, optional-path, paths, names, node, partition, address
    low: float = 0
    high: float = 0


# Every key has a rule (a unit test checks): a value outside it is an error naming file, line and key.
# The ranges keep each knob where it means something: check_interval = 0 would ask Slurm many times a
# second, a breaker share above 1 is no breaker, expected_gpus = inf would make every node miss a GPU.
_RULES: dict[str, _Rule] = {
    "node": _Rule("node"), "partition": _Rule("partition"),
    "state_dir": _Rule("path"), "journal_dir": _Rule("path"), "kmsg": _Rule("path"), "boot_id": _Rule("path"),
    "job_records_dir": _Rule("path"), "breaker_dir": _Rule("optional-path"), "job_metrics_dir": _Rule("optional-path"),
    "disk_paths": _Rule("paths"), "disk_drain_paths": _Rule("paths"),
    "dry_run": _Rule("bool"), "resume_when_clean": _Rule("bool"),
    "metrics": _Rule("address"),
    "check_interval": _Rule("float", 1.0, 3600.0), "nvml_timeout": _Rule("float", 0.1, 60.0),
    "event_wait_ms": _Rule("int", 10, 60_000), "xid_dedup_window": _Rule("float", 0.0, 7 * 86400.0),
    "breaker_max_share": _Rule("float", 0.0, 1.0), "breaker_retry": _Rule("float", 1.0, 86400.0),
    "breaker_spread_per_node": _Rule("float", 0.0, 1.0), "node_refresh_interval": _Rule("float", 1.0, 86400.0),
    "drained_refresh_interval": _Rule("float", 1.0, 86400.0), "clean_checks": _Rule("int", 1, 1000),
    "hook_timeout": _Rule("float", 1.0, 3600.0),
    "tier_bases": _Rule("paths"), "tier_keep_hours": _Rule("float", 1.0, 24 * 366.0),
    "gpus_expected": _Rule("auto-bool"), "storage_paths": _Rule("paths"), "ib_root": _Rule("path"),
    "ib_devices": _Rule("names"), "diagnostic_retry": _Rule("float", 60.0, 7 * 86400.0),
    # Each check family declares its own [checks] limits with their ranges (healthd/checks/).
    **{f"checks.{limit.name}": _Rule(str(limit.type), *limit.metadata["range"]) for limit in fields(CheckLimits)},
    "policy.app_xid_repeat": _Rule("int", 1, 1000), "policy.app_xid_window_h": _Rule("float", 0.0, 24 * 366.0),
    "prove.tasks_per_node": _Rule("int", 1, 64), "prove.partition": _Rule("partition"),
    "prove.reservation": _Rule("partition"), "prove.timeout": _Rule("float", 5.0, 4 * 3600.0),
    "prove.start_within": _Rule("float", 1.0, 3600.0), "prove.link_bytes": _Rule("int", 1 << 20, 16 << 30),
    "prove.link_pings": _Rule("int", 1, 100_000), "prove.port": _Rule("int", 0, 65535),
    "prove.bandwidth_share": _Rule("float", 0.0, 1.0), "prove.latency_factor": _Rule("float", 1.0, 100.0),
    "prove.min_history": _Rule("int", 1, 1000), "prove.history_kept": _Rule("int", 1, 10_000),
    "prove.floor_bandwidth_gbs": _Rule("float", 0.0, 10_000.0), "prove.ceiling_latency_us": _Rule("float", 1.0, 1e7),
}
MAX_XID = 9999
MAX_PATHS = 64
_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


class _Where:
    """Names a key's place for an error: the file, the line when it can be found, the dotted key."""

    def __init__(self, path: str, text: str) -> None:
        self.path, self.lines = path, text.splitlines()

    def line(self, dotted: str) -> int | None:
        """The line that sets `dotted` (`checks.expected_gpus` under [checks], or written dotted)."""
        table, _, key = dotted.rpartition(".")
        current = ""
        for number, raw in enumerate(self.lines, 1):
            line = raw.strip()
            header = re.match(r"^\[\s*([A-Za-z0-9_.\"' -]+?)\s*\]", line)
            if header:
                current = header.group(1).replace('"', "").replace("'", "").replace(" ", "")
                continue
            written = re.match(r"^([A-Za-z0-9_.\"' -]+?)\s*=", line)
            if written is None:
                continue
            name = written.group(1).replace('"', "").replace("'", "").replace(" ", "")
            full = f"{current}.{name}" if current else name
            if full == dotted or (table and full == table):  # a key inside an inline table: its table's line
                return number
        return None

    def error(self, dotted: str, message: str, *, unknown: bool = False) -> ConfigError:
        number = self.line(dotted)
        what = f"unknown key `{dotted}`" if unknown else f"key `{dotted}`"
        return ConfigError(f"{self.path}{f':{number}' if number else ''}: {what}{message}", key=dotted)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(where: _Where, dotted: str, value: Any, rule: _Rule) -> int | float:
    whole = rule.kind == "int"
    expected = f"a {'whole ' if whole else ''}number between {rule.low:g} and {rule.high:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise where.error(dotted, f" must be {expected}, found {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise where.error(dotted, f" must be {expected} (not NaN or infinity), found {_shown(value)}")
    if not rule.low <= value <= rule.high:  # exact for huge ints too: nothing is converted before this
        raise where.error(dotted, f" must be {expected}, found {_shown(value)}")
    if whole:
        if isinstance(value, float) and not value.is_integer():
            raise where.error(dotted, f" must be {expected}, found {_shown(value)}")
        return int(value)
    return float(value)


def _path(where: _Where, dotted: str, value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise where.error(dotted, f" must be an absolute path (a string like \"/var/lib/healthd\"), found {_shown(value)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise where.error(dotted, f" must be a path without control characters, found {_shown(value)}")
    if not value.startswith("/"):
        raise where.error(dotted, f" must be an absolute path (healthd and the hooks run from any directory), "
                                  f"found {_shown(value)}")
    return Path(value)


def _checked(where: _Where, dotted: str, value: Any) -> Any:  # noqa: C901 - one branch per kind
    """`value` of key `dotted` as the config holds it, or ConfigError saying what to write."""
    rule = _RULES[dotted]
    if rule.kind in ("int", "float"):
        return _number(where, dotted, value, rule)
    if rule.kind == "auto-bool":
        if not isinstance(value, bool) and value != "auto":
            raise where.error(dotted, f" must be true, false or \"auto\", found {_shown(value)}")
        return value
    if rule.kind == "bool":
        if not isinstance(value, bool):
            raise where.error(dotted, f" must be true or false, found {_shown(value)}")
        return value
    if rule.kind in ("path", "optional-path"):
        path = _path(where, dotted, value)
        if dotted == "kmsg" and os.path.isdir(path):
            raise where.error(dotted, f" must be the kernel log, /dev/kmsg (or a file of its records), not the "
                                      f"directory {value}")
        return path
    if rule.kind == "paths":
        if not isinstance(value, list) or len(value) > MAX_PATHS:
            raise where.error(dotted, f" must be a list of at most {MAX_PATHS} absolute paths, found {_shown(value)}")
        return tuple(str(_path(where, dotted, item)) for item in value)
    if rule.kind == "names":
        if not isinstance(value, list) or len(value) > MAX_PATHS or not all(
                isinstance(item, str) and _DEVICE.fullmatch(item) for item in value):
            raise where.error(dotted, f" must be a list of at most {MAX_PATHS} device names like \"mlx5_0\", "
                                      f"found {_shown(value)}")
        return tuple(value)
    if not isinstance(value, str):
        raise where.error(dotted, f" must be a string, found {_shown(value)}")
    if rule.kind == "node" and value and not is_node_name(value):
        raise where.error(dotted, f" must be this node's Slurm name (letters, digits, '.', '_', '-'), or \"\" for "
                                  f"the host name, found {_shown(value)}")
    if rule.kind == "partition" and value and not _PARTITION.fullmatch(value):
        raise where.error(dotted, f" must be a Slurm partition name (letters, digits, '.', '_', '-'), or \"\" for "
                                  f"the node's first partition, found {_shown(value)}")
    if rule.kind == "address" and value:
        address = _ADDRESS.fullmatch(value)
        if address is None or not 1 <= int(address.group("port")) <= 65535:
            raise where.error(dotted, " must be host:port (like \"127.0.0.1:9489\" or \"[::1]:9489\", port 1-65535), "
                                      f"or \"\" to serve no metrics, found {_shown(value)}")
    return value


def config_from_mapping(data: dict[str, Any], where: str = "healthd.toml", text: str = "") -> HealthdConfig:
    """The config `data` (parsed TOML) sets; ConfigError naming file, line (from `text`) and key otherwise."""
    return _build(data, _Keys(_Where(where, text), strict=True))


@dataclass(frozen=True)
class KeptConfig:
    """A healthd.toml read for a hook: every valid key of the admin's file kept, each bad one dropped (its
    default used instead), `dropped` saying which and why (file, line, key: one ConfigError each)."""

    config: HealthdConfig
    dropped: tuple[ConfigError, ...] = ()

    @property
    def dropped_keys(self) -> frozenset[str]:
        """The dotted keys dropped (`tier_bases`, `checks.expected_gpus`, ...)."""
        return frozenset(error.key for error in self.dropped)


def config_keeping_valid(data: dict[str, Any], where: str = "healthd.toml", text: str = "") -> KeptConfig:
    """The config `data` sets with each key that is wrong dropped (as if not written), not the whole file:
    a hook must not go back to every default (re-enabling what the admin turned off) for one typo."""
    keys = _Keys(_Where(where, text), strict=False)
    return KeptConfig(_build(data, keys), tuple(keys.dropped))


def load_config_keeping_valid(path: Path | None) -> KeptConfig:
    """`load_config` for the hooks: a file that cannot be read or parsed at all is ConfigError as there; one
    that parses keeps every valid key (`config_keeping_valid`)."""
    found = _read_toml(path)
    if found is None:
        return KeptConfig(HealthdConfig())
    data, where, text = found
    return config_keeping_valid(data, where, text)


class _Keys:
    """Checks each key; strict: the first wrong one is raised; else it is dropped and kept in `dropped`."""

    def __init__(self, where: _Where, *, strict: bool) -> None:
        self.where, self.strict = where, strict
        self.dropped: list[ConfigError] = []

    def take(self, into: dict[str, Any], key: str, check: Callable[[], Any]) -> None:
        """`into[key] = check()`, unless it raises ConfigError (then raised, or dropped)."""
        try:
            into[key] = check()
        except ConfigError as exc:
            if self.strict:
                raise
            self.dropped.append(exc)


def _build(data: dict[str, Any], keys: _Keys) -> HealthdConfig:
    place = keys.where
    tables = {"checks", "policy", "diagnostics", "prove"}
    top = {f.name for f in fields(HealthdConfig)} - tables
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in tables:
            continue
        if key not in top:
            keys.take(values, key, partial(_raise, place.error(
                key, f"; known: {', '.join(sorted(top | tables))}", unknown=True)))
            continue
        keys.take(values, key, partial(_checked, place, key, value))
    limits: dict[str, Any] = {}
    known = {f.name for f in fields(CheckLimits)}
    for key, value in _table(keys, data, "checks", known).items():
        keys.take(limits, key, partial(_checked, place, f"checks.{key}", value))
    return HealthdConfig(**values, checks=CheckLimits(**limits), policy=_policy(keys, data),
                         diagnostics=_diagnostics(keys, data), prove=_prove(keys, data))


_PROVE_LISTS = {"argv", "srun_options"}


def _prove(keys: _Keys, data: dict[str, Any]) -> ProveSettings:
    """[prove]: the test's argv and parser, where it runs, and the thresholds' settings."""
    place = keys.where
    limit_keys = {f.name for f in fields(ProofLimits)}
    known = {f.name for f in fields(ProveSettings)} - {"limits"} | limit_keys
    values: dict[str, Any] = {}
    for key, value in _table(keys, data, "prove", known).items():
        dotted = f"prove.{key}"
        if key in _PROVE_LISTS:
            keys.take(values, key, partial(_argv_list, place, dotted, value, key == "argv"))
        elif key == "parser":
            keys.take(values, key, partial(_one_of, place, dotted, value, PROOF_PARSERS))
        elif key == "python":
            keys.take(values, key, partial(_optional_path, place, dotted, value))
        else:
            keys.take(values, key, partial(_checked, place, dotted, value))
    limits = ProofLimits(**{k: values.pop(k) for k in list(values) if k in limit_keys})
    return ProveSettings(**values, limits=limits)


def _argv_list(place: _Where, dotted: str, value: Any, command: bool) -> tuple[str, ...]:
    example = " like [\"/opt/nccl-tests/build/all_reduce_perf\", \"-b\", \"8\", \"-e\", \"1G\", \"-f\", \"2\"]"
    if not (isinstance(value, list) and len(value) <= MAX_ARGV and all(isinstance(a, str) for a in value)) \
            or any("\0" in a for a in value):
        raise place.error(dotted, f" must be a list of at most {MAX_ARGV} strings (never a shell command line)"
                                  f"{example if command else ''}, found {_shown(value)}")
    if command and value and not value[0].startswith("/"):
        raise place.error(dotted, f"[0] must be an absolute path (it runs on the compute nodes), found {_shown(value[0])}")
    return tuple(value)


def _optional_path(place: _Where, dotted: str, value: Any) -> str:
    return "" if value == "" else str(_path(place, dotted, value))


def _one_of(place: _Where, dotted: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise place.error(dotted, f" must be one of {', '.join(choices)}, found {_shown(value)}")
    return str(value)


MAX_ARGV = 64
MAX_DIAGNOSTIC_TIMEOUT = 4 * 3600.0


def _diagnostics(keys: _Keys, data: dict[str, Any]) -> Diagnostics | None:
    """[diagnostics] (None when not written: the defaults then depend on dcgmi being installed)."""
    if "diagnostics" not in data:
        return None
    table = _table(keys, data, "diagnostics", set(LEVELS))
    specs: dict[str, Any] = {}
    for level, value in table.items():
        keys.take(specs, level, partial(_diagnostic_spec, keys.where, f"diagnostics.{level}", value))
    return Diagnostics(**specs, source=f"[diagnostics] in {keys.where.path}")


def _diagnostic_spec(place: _Where, dotted: str, value: Any) -> DiagnosticSpec:
    example = " like { argv = [\"/usr/bin/dcgmi\", \"diag\", \"-r\", \"1\", \"-j\"], timeout = 60, parser = \"dcgmi\" }"
    if not isinstance(value, dict):
        raise place.error(dotted, f" must be a table{example}, found {_shown(value)}")
    unknown = set(value) - {"argv", "timeout", "parser"}
    if unknown:
        raise place.error(dotted, f": unknown key {sorted(unknown)[0]!r} (known: argv, timeout, parser)")
    argv = value.get("argv")
    if isinstance(argv, str):
        raise place.error(dotted, f".argv must be a list of strings (never a shell command line){example}, "
                                  f"found {_shown(argv)}")
    if not (isinstance(argv, list) and 0 < len(argv) <= MAX_ARGV and all(isinstance(a, str) for a in argv)) \
            or any("\0" in a for a in argv):
        raise place.error(dotted, f".argv must be a list of 1 to {MAX_ARGV} strings{example}, found {_shown(argv)}")
    if not argv[0].startswith("/"):
        raise place.error(dotted, f".argv[0] must be an absolute path (healthd and the prolog run with no PATH), "
                                  f"found {_shown(argv[0])}")
    timeout = _number(place, f"{dotted}.timeout", value.get("timeout", 600.0),
                      _Rule("float", 1.0, MAX_DIAGNOSTIC_TIMEOUT))
    parser = value.get("parser", "exit-code")
    if parser not in PARSERS:
        raise place.error(dotted, f".parser must be one of {', '.join(PARSERS)}, found {_shown(parser)}")
    return DiagnosticSpec(tuple(argv), float(timeout), parser)


def _raise(error: ConfigError) -> Any:
    raise error


def _table(keys: _Keys, data: dict[str, Any], name: str, known: set[str]) -> dict[str, Any]:
    """Table `name` of `data` with its unknown keys (raised, or dropped)."""
    place = keys.where
    found: dict[str, Any] = {}
    keys.take(found, name, lambda: _is_table(place, name, data.get(name, {})))
    table = found.get(name, {})
    kept: dict[str, Any] = {}
    for key, value in table.items():
        if key in known:
            kept[key] = value
        else:
            keys.take(kept, key, partial(_raise, place.error(
                f"{name}.{key}", f"; known: {', '.join(sorted(known))}", unknown=True)))
    return kept


def _is_table(place: _Where, name: str, table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise place.error(name, f" must be a table ([{name}]), found {_shown(table)}")
    return table


def _policy(keys: _Keys, data: dict[str, Any]) -> PolicyConfig:
    place = keys.where
    policy = _table(keys, data, "policy", {"promote_xids", "app_xid_repeat", "app_xid_window_h", "app_xid_count"})
    found: dict[str, Any] = {}
    keys.take(found, "promote_xids", lambda: _is_promote_table(place, policy.get("promote_xids", {})))
    promote: dict[str, Any] = {}
    for xid, action in found.get("promote_xids", {}).items():
        keys.take(promote, xid, partial(_promotion, place, xid, action))
    keys.take(found, "app_xid_count", lambda: _xid_count(place, policy.get("app_xid_count", "users")))
    for key, default in (("app_xid_repeat", 2), ("app_xid_window_h", 24.0)):
        keys.take(found, key, partial(_checked, place, f"policy.{key}", policy.get(key, default)))
    return PolicyConfig({int(xid): action for xid, action in promote.items()}, found.get("app_xid_repeat", 2),
                        found.get("app_xid_window_h", 24.0) * 3600, found.get("app_xid_count", "users"))


def _is_promote_table(place: _Where, table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise place.error("policy.promote_xids", f" must be a table like {{ \"999\" = \"drain-reset\" }}, "
                                                 f"found {_shown(table)}")
    return table


def _promotion(place: _Where, xid: str, action: Any) -> Action:
    labels = ", ".join(a.label for a in Action)
    if not re.fullmatch(r"[0-9]{1,4}", xid) or not 1 <= int(xid) <= MAX_XID:
        raise place.error(f"policy.promote_xids.{xid}", f" must be an Xid number from 1 to {MAX_XID} with one of "
                                                        f"{labels}")
    try:
        if not isinstance(action, str):
            raise KeyError(action)
        return Action.from_label(action.lower().replace("_", "-"))
    except (ValueError, KeyError):
        raise place.error(f"policy.promote_xids.{xid}", f" must name one of {labels}, "
                                                        f"found {_shown(action)}") from None


def _xid_count(place: _Where, count: Any) -> str:
    if count not in ("users", "jobs"):
        raise place.error("policy.app_xid_count", f" must be \"users\" or \"jobs\", found {_shown(count)}")
    return str(count)
