"""healthd.toml: every setting, its default and its validation (errors name the file and key)."""

from __future__ import annotations

import socket
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from clusterctl.errors import ClusterctlError
from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.findings import Action
from clusterctl.healthd.policy import PolicyConfig

DEFAULT_PATH = Path("/etc/clusterctl/healthd.toml")


class ConfigError(ClusterctlError):
    """A healthd.toml value that is missing or wrong; the message names file and key.

    `healthd` exits with EX_CONFIG (sysexits.h) on it; the hooks say it and go on with the defaults,
    a running daemon keeps its config.
    """

    exit_code = 78  # EX_CONFIG


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
    metrics: str = "127.0.0.1:9400"
    """host:port for Prometheus metrics; empty disables."""
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
    hook_timeout: float = 20.0
    """The prolog/epilog give up (and fail) after this long; keep it below Slurm's PrologEpilogTimeout."""
    checks: CheckLimits = field(default_factory=CheckLimits)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    @property
    def watched_disk_paths(self) -> tuple[str, ...]:
        """Every path whose free space is sampled: the watched ones and the opted-in drain paths."""
        return tuple(dict.fromkeys((*self.disk_paths, *self.disk_drain_paths)))

    @property
    def node_name(self) -> str:
        return self.node or socket.gethostname().split(".")[0]


def load_config(path: Path | None) -> HealthdConfig:
    """Read healthd.toml (a missing default file means all defaults)."""
    if path is None:
        if not DEFAULT_PATH.exists():
            return HealthdConfig()
        path = DEFAULT_PATH
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a healthd.toml") from None
    return config_from_mapping(data, str(path))


# Values that make no sense below (or above) these bounds: check_interval = 0 would ask Slurm
# many times a second; a breaker share above 1 is no breaker.
_BOUNDS: dict[str, tuple[float, float]] = {
    "check_interval": (1.0, 3600.0), "nvml_timeout": (0.1, 60.0), "event_wait_ms": (10, 60_000),
    "xid_dedup_window": (0.0, 7 * 86400.0), "breaker_max_share": (0.0, 1.0), "clean_checks": (1, 1000),
    "hook_timeout": (1.0, 3600.0), "breaker_retry": (1.0, 86400.0), "breaker_spread_per_node": (0.0, 1.0),
    "node_refresh_interval": (1.0, 86400.0), "drained_refresh_interval": (1.0, 86400.0),
}


_OPTIONAL_PATHS = {"breaker_dir"}
"""Path keys whose default is unset (None)."""


def _bounded(where: str, key: str, value: Any) -> Any:
    if key not in _BOUNDS:
        return value
    low, high = _BOUNDS[key]
    if not low <= value <= high:
        raise ConfigError(f"{where}: key `{key}` must be between {low:g} and {high:g}, found {value!r}")
    return value


def _typed(where: str, key: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: key `{key}` must be true or false, found {value!r}")
        return value
    if isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"{where}: key `{key}` must be a number ≥ 0, found {value!r}")
        return type(default)(value) if isinstance(default, float) or float(value).is_integer() else value
    if isinstance(default, Path):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: key `{key}` must be a path, found {value!r}")
        return Path(value)
    if isinstance(default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: key `{key}` must be a list of strings, found {value!r}")
        return tuple(value)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: key `{key}` must be a string, found {value!r}")
    return value


def config_from_mapping(data: dict[str, Any], where: str = "healthd.toml") -> HealthdConfig:
    base = HealthdConfig()
    top = {f.name for f in fields(HealthdConfig)} - {"checks", "policy"}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("checks", "policy"):
            continue
        if key not in top:
            raise ConfigError(f"{where}: unknown key `{key}`; known: {', '.join(sorted(top | {'checks', 'policy'}))}")
        default = Path("/") if key in _OPTIONAL_PATHS else getattr(base, key)
        values[key] = _bounded(where, key, _typed(where, key, value, default))
        if key in _OPTIONAL_PATHS and not values[key].is_absolute():
            raise ConfigError(f"{where}: key `{key}` must be an absolute path, found {value!r}")
    checks = data.get("checks", {})
    if not isinstance(checks, dict):
        raise ConfigError(f"{where}: `checks` must be a table")
    limits = CheckLimits()
    known = {f.name for f in fields(CheckLimits)}
    for key in checks:
        if key not in known:
            raise ConfigError(f"{where}: unknown key `checks.{key}`; known: {', '.join(sorted(known))}")
    limits = CheckLimits(**{k: _typed(where, f"checks.{k}", v, getattr(limits, k)) for k, v in checks.items()})
    policy = data.get("policy", {})
    if not isinstance(policy, dict):
        raise ConfigError(f"{where}: `policy` must be a table")
    promote: dict[int, Action] = {}
    for xid, action in (policy.get("promote_xids") or {}).items():
        try:
            promote[int(xid)] = Action.from_label(str(action).lower().replace("_", "-"))
        except (ValueError, KeyError):
            raise ConfigError(f"{where}: key `policy.promote_xids.{xid}`: expected an Xid number and one of "
                              f"{', '.join(a.label for a in Action)}, found {action!r}") from None
    unknown = set(policy) - {"promote_xids", "app_xid_repeat", "app_xid_window_h", "app_xid_count"}
    if unknown:
        raise ConfigError(f"{where}: unknown key `policy.{sorted(unknown)[0]}`")
    count = _typed(where, "policy.app_xid_count", policy.get("app_xid_count", "users"), "users")
    if count not in ("users", "jobs"):
        raise ConfigError(f"{where}: key `policy.app_xid_count` must be \"users\" or \"jobs\", found {count!r}")
    repeat = int(_typed(where, "policy.app_xid_repeat", policy.get("app_xid_repeat", 2), 2))
    if repeat < 1:
        raise ConfigError(f"{where}: key `policy.app_xid_repeat` must be at least 1, found {repeat}")
    policy_config = PolicyConfig(promote, repeat,
                                 float(_typed(where, "policy.app_xid_window_h", policy.get("app_xid_window_h", 24.0),
                                              24.0)) * 3600, count)
    return HealthdConfig(**values, checks=limits, policy=policy_config)
