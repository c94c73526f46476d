"""Which Slurm the testbed runs, and where its binaries come from (pure data).

`host` is this machine's own Slurm (Debian bookworm's 22.05, installed with apt); the others
run every daemon, command and the project's own code from a Debian root filesystem of the
suite that packages that Slurm (see shared/notes/slurm-versions.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HOST = "host"
"""The release name for this machine's own Slurm packages (no root filesystem)."""


@dataclass(frozen=True)
class Release:
    """A Slurm release the testbed can run."""

    name: str
    """What `clusterctl-testbed up --slurm` takes: "host", "22.05", "24.11", "26.05"."""
    suite: str | None
    """Debian suite whose packages give this Slurm; None for this machine's own packages."""
    version: tuple[int, int]
    """(major, minor) of the Slurm it runs; for `host`, what bookworm ships."""
    stale_release_file: bool = False
    """The mirror's Release file for this suite is past its Valid-Until date (sid)."""

    @property
    def uses_rootfs(self) -> bool:
        """True when daemons and commands run from a root filesystem of their own."""
        return self.suite is not None


RELEASES: dict[str, Release] = {
    HOST: Release(HOST, None, (22, 5)),
    "22.05": Release("22.05", "bookworm", (22, 5)),
    "24.11": Release("24.11", "trixie", (24, 11)),
    "26.05": Release("26.05", "sid", (26, 5), stale_release_file=True),
}

NEWEST = "26.05"
"""The newest release the testbed runs."""

DEFAULT = NEWEST
"""What `up` runs without --slurm: the newest release, what a site installing today would run.
End-to-end sessions pick theirs with CLUSTERCTL_TEST_SLURM (default: `host`, the fastest to start)."""


def release(name: str) -> Release:
    """The release called `name`; a clear error naming the choices otherwise."""
    try:
        return RELEASES[name]
    except KeyError:
        raise ValueError(f"unknown Slurm release {name!r}; one of: {', '.join(RELEASES)}") from None


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, micro) from `sinfo --version` output ("slurm-wlm 24.11.5", "slurm 22.05.8")."""
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"no Slurm version in {text.strip()!r}")
    major, minor, micro = (int(g) for g in match.groups())
    return major, minor, micro
