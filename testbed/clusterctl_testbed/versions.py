"""Which Slurm the testbed runs, and where its binaries come from (pure data).

`host` is this machine's own Slurm (Debian bookworm's 22.05, installed with apt); the others
run every daemon, command and the project's own code from a Debian root filesystem: of the suite
that packages that Slurm (see shared/notes/slurm-versions.md), or, for a release Debian does not
ship, of the suite whose compiler and libraries build it, with Slurm built from SchedMD's source
tag (clusterctl_testbed.rootfs, clusterctl_testbed.slurm_source).

Another release built from source is one more line in RELEASES.  Each line's tag is the newest
patch of its release line in SchedMD's repository when it was written (rootfs builds exactly that
tag; `newest_patch_tag` picks it from a list of tags).  23.x and 24.05 build on bookworm, whose
compiler and libraries their configure checks accept; 25.x on trixie, the suite whose packages run
24.11.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

HOST = "host"
"""The release name for this machine's own Slurm packages (no root filesystem)."""


@dataclass(frozen=True)
class Release:
    """A Slurm release the testbed can run."""

    name: str
    """What `clusterctl-testbed up --slurm` takes: "host", "22.05", "24.05", "24.11", "26.05"."""
    suite: str | None
    """Debian suite whose packages give this Slurm (or, with `source_tag`, whose compiler and libraries
    build it and whose packages give everything else); None for this machine's own packages."""
    version: tuple[int, int]
    """(major, minor) of the Slurm it runs; for `host`, what bookworm ships."""
    stale_release_file: bool = False
    """The mirror's Release file for this suite is past its Valid-Until date (sid)."""
    source_tag: str | None = None
    """SchedMD's git tag this release is built from (e.g. "slurm-24-05-8-1"); None when the
    suite's own packages give it."""

    @property
    def uses_rootfs(self) -> bool:
        """True when daemons and commands run from a root filesystem of their own."""
        return self.suite is not None

    @property
    def built_from_source(self) -> bool:
        """True when the testbed builds this Slurm from SchedMD's source instead of installing Debian's."""
        return self.source_tag is not None

    def describe(self) -> str:
        """Where this release comes from, in a user's words (for --help and messages)."""
        if self.suite is None:
            return f"{self.name}: this machine's own packages"
        if self.source_tag is not None:
            return f"{self.name}: built from SchedMD's source (tag {self.source_tag}) on Debian {self.suite}"
        return f"{self.name}: Debian {self.suite}'s packages"


RELEASES: dict[str, Release] = {
    HOST: Release(HOST, None, (22, 5)),
    "22.05": Release("22.05", "bookworm", (22, 5)),
    "23.02": Release("23.02", "bookworm", (23, 2), source_tag="slurm-23-02-8-1"),
    "23.11": Release("23.11", "bookworm", (23, 11), source_tag="slurm-23-11-11-1"),
    "24.05": Release("24.05", "bookworm", (24, 5), source_tag="slurm-24-05-8-1"),
    "24.11": Release("24.11", "trixie", (24, 11)),
    "25.05": Release("25.05", "trixie", (25, 5), source_tag="slurm-25-05-8-1"),
    "25.11": Release("25.11", "trixie", (25, 11), source_tag="slurm-25-11-7-1"),
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


def tag_version(tag: str) -> tuple[int, int, int]:
    """(major, minor, micro) of one of SchedMD's release tags ("slurm-24-05-8-1" is 24.05.8)."""
    match = re.fullmatch(r"slurm-(\d+)-(\d+)-(\d+)-(\d+)", tag)
    if match is None:
        raise ValueError(f"{tag!r} is not a Slurm release tag (slurm-MAJOR-MINOR-MICRO-N)")
    major, minor, micro, _ = (int(g) for g in match.groups())
    return major, minor, micro


def newest_patch_tag(tags: Iterable[str], version: tuple[int, int]) -> str | None:
    """The newest release tag of the (major, minor) line `version` among `tags`; None when it has none.
    Pre-release tags (slurm-24-05-0-0rc1) and everything that is not a release tag are passed over."""
    line = []
    for tag in tags:
        match = re.fullmatch(r"slurm-(\d+)-(\d+)-(\d+)-(\d+)", tag.strip())
        if match is not None and (int(match[1]), int(match[2])) == version:
            line.append(((int(match[3]), int(match[4])), tag.strip()))
    return max(line)[1] if line else None


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, micro) from `sinfo --version` output ("slurm-wlm 24.11.5", "slurm 22.05.8")."""
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"no Slurm version in {text.strip()!r}")
    major, minor, micro = (int(g) for g in match.groups())
    return major, minor, micro
