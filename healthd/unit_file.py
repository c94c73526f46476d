"""healthd's systemd unit and example config, as `healthd install` writes them out of the package.

The unit shipped in the package (systemd/healthd.service) is a template: the installed healthd, the
config file, the install guide and the directories healthd writes are filled in when it is printed,
so `ProtectSystem=strict` never makes a configured directory (a shared `breaker_dir`) read-only
behind the admin's back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

from clusterctl.errors import ClusterctlError
from clusterctl.files import atomic_write
from clusterctl.healthd.config import HealthdConfig

UNIT_NAME = "healthd.service"
CONFIG_NAME = "healthd.toml"
UNIT_DIR = PurePosixPath("etc/systemd/system")
CONFIG_DIR = PurePosixPath("etc/clusterctl")
SYSTEMD_MANAGED = (PurePosixPath("/run/healthd"), PurePosixPath("/var/lib/healthd"))
"""RuntimeDirectory= and StateDirectory=: systemd creates them before the namespace is set up."""
HIDDEN_BY_PROTECT_HOME = (PurePosixPath("/home"), PurePosixPath("/root"), PurePosixPath("/run/user"))


class InstallError(ClusterctlError):
    """`healthd install` would overwrite a file, or cannot write one; nothing was written."""

    exit_code = 73  # EX_CANTCREAT


def packaged_text(name: str) -> str:
    """A file shipped in the clusterctl.healthd package (`systemd/healthd.service`, `healthd.example.toml`)."""
    return resources.files("clusterctl.healthd").joinpath(name).read_text(encoding="utf-8")


def packaged_guide() -> Path | None:
    """The install guide shipped beside the unit (docs/install.md), when this install has it as a file."""
    guide = resources.files("clusterctl.healthd").joinpath("install.md")
    path = Path(str(guide))
    return path.resolve() if path.is_file() else None


def writable_paths(config: HealthdConfig) -> tuple[PurePosixPath, ...]:
    """Every directory the daemon writes under this config, in the config's order, without repeats.

    state_dir (state.json), journal_dir (action journal, kernel-log cursor, Xid history) and
    breaker_dir (the shared drain slots).  The hooks' directories are not here: slurmd runs the
    prolog and epilog, not this unit.
    """
    chosen = [config.state_dir, config.journal_dir, *([config.breaker_dir] if config.breaker_dir else [])]
    return tuple(dict.fromkeys(PurePosixPath(path) for path in chosen))


def _under(path: PurePosixPath, roots: Iterable[PurePosixPath]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def render_unit(template: str, *, healthd: str, config_path: str, config: HealthdConfig,
                guide: Path | None) -> str:
    """The unit for this node: the template with every @NAME@ filled in.

    `ReadWritePaths` lists systemd's own two directories plus each other directory `config` makes
    healthd write, marked optional ("-"); `ProtectHome` becomes `read-only` when one lies under
    /home, /root or /run/user (`yes` would hide it however ReadWritePaths reads).
    """
    paths = writable_paths(config)
    extra = [f"-{path}" for path in paths if not _under(path, SYSTEMD_MANAGED)]
    hidden = any(_under(path, HIDDEN_BY_PROTECT_HOME) for path in paths)
    docs = f"file:{guide}" if guide is not None else "man:systemd.exec(5)"
    filled = {
        "@HEALTHD@": healthd, "@CONFIG@": config_path, "@DOCS@": docs,
        "@READ_WRITE_PATHS@": " ".join([*(str(p) for p in SYSTEMD_MANAGED), *extra]),
        "@PROTECT_HOME@": "read-only" if hidden else "yes",
    }
    body = template[template.index("[Unit]"):]  # the template's own header says how it is filled: not for the node
    for name, value in filled.items():
        body = body.replace(name, value)
    header = (f"# clusterctl healthd: drains this node in Slurm within a second of a GPU fault.\n"
              f"# Printed by `healthd install` from {config_path}: print it again after changing state_dir,\n"
              f"# journal_dir or breaker_dir there, rather than editing ReadWritePaths by hand.\n")
    return header + body


def unit_read_write_paths(unit_text: str) -> tuple[PurePosixPath, ...]:
    """The directories a unit's ReadWritePaths= lines name ("-" and "+" prefixes dropped)."""
    found: list[PurePosixPath] = []
    for line in unit_text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "ReadWritePaths":
            found += [PurePosixPath(word.lstrip("-+")) for word in value.split() if word.lstrip("-+").startswith("/")]
    return tuple(found)


def paths_outside_unit(config: HealthdConfig, unit_text: str) -> tuple[PurePosixPath, ...]:
    """The directories `config` makes healthd write that the unit leaves read-only (ProtectSystem=strict)."""
    allowed = unit_read_write_paths(unit_text)
    return tuple(path for path in writable_paths(config) if not _under(path, allowed))


INSTALLED_UNIT = Path("/") / UNIT_DIR / UNIT_NAME
"""Where `healthd install --prefix /` puts the unit: healthd reads it at start to check its ReadWritePaths."""


def start_warnings(config: HealthdConfig, unit_text: str | None,
                   can_write: Callable[[Path], bool] = lambda p: os.access(p, os.W_OK)) -> list[str]:
    """What healthd says at start about the directories it must write: each one the installed unit
    (`unit_text`, None when there is none) leaves read-only, then each other one it cannot write now (an
    existing directory, else the nearest existing parent it would be created in)."""
    how = ("add it to the unit's ReadWritePaths (`healthd install --print-unit --config <your healthd.toml>` "
           "derives them)")
    outside = paths_outside_unit(config, unit_text) if unit_text is not None else ()
    warnings = [f"{INSTALLED_UNIT} leaves {path} read-only (ProtectSystem=strict): {how}" for path in outside]
    for path in writable_paths(config):
        if path in outside:
            continue
        existing = Path(path)
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing.is_dir() and not can_write(existing):
            what = "write" if existing == Path(path) else f"create {path} in"
            warnings.append(f"healthd cannot {what} {existing}: under systemd, {how}; else give it to root")
    return warnings


def installed_unit_text(path: Path = INSTALLED_UNIT) -> str | None:
    """The installed unit's text, or None when there is none (or it cannot be read)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


@dataclass(frozen=True)
class InstallFile:
    """One file `healthd install --prefix` writes: where (under the prefix), what, with which mode."""

    relative: PurePosixPath
    text: str
    mode: int = 0o644


def install_files(unit: str, example_config: str) -> tuple[InstallFile, ...]:
    """The unit and the example config, at their paths under a prefix."""
    return (InstallFile(UNIT_DIR / UNIT_NAME, unit), InstallFile(CONFIG_DIR / CONFIG_NAME, example_config))


def write_install(prefix: Path, files: tuple[InstallFile, ...], *, force: bool) -> list[Path]:
    """Write `files` under `prefix` (each atomically); refuse before writing any when one exists and not `force`.

    The directories made are 0755; returns the paths written.
    """
    targets = [(prefix / file.relative, file) for file in files]
    existing = [str(path) for path, _ in targets if path.exists() or path.is_symlink()]
    if existing and not force:
        raise InstallError(f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}: nothing "
                           "written; compare them with `healthd install --print-unit` / `--print-config`, or "
                           "give --force to replace them")
    written = []
    for path, file in targets:
        try:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            written.append(atomic_write(path, file.text, mode=file.mode))
        except OSError as exc:
            raise InstallError(f"cannot write {path}: {exc.strerror}"
                               f"{'; written before it: ' + ', '.join(map(str, written)) if written else ''}") from None
    return written
