"""Where a release built from source gets SchedMD's tree: a git directory, a tarball, or a clone.

The user names the source (`clusterctl-testbed up --slurm-source PATH`, or CLUSTERCTL_SLURM_SOURCE):
a git clone or bare mirror of https://github.com/SchedMD/slurm (the release's tag is exported with
`git archive`), a release tarball (SchedMD's slurm-24.05.8.tar.bz2, or a `git archive` of the tag),
or a git URL.  Without one, the tag alone is fetched from SchedMD's repository into the cache, which
needs a network; where that fails, the error says what to give instead.

The choice and the checks are pure functions; `export` (git and tar, argv lists with timeouts) is
the only side effect.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from clusterctl_testbed.system import TestbedError, run
from clusterctl_testbed.versions import Release, newest_patch_tag, tag_version

SCHEDMD_URL = "https://github.com/SchedMD/slurm.git"
ENV = "CLUSTERCTL_SLURM_SOURCE"
"""The environment variable that names the source when `--slurm-source` is not given."""
TARBALL_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
# `git archive` of a large tree and a shallow fetch over a slow link both take a while.
GIT_TIMEOUT = 900.0


@dataclass(frozen=True)
class SourceChoice:
    """Where SchedMD's source comes from."""

    kind: Literal["git", "tarball", "url"]
    """A git directory (clone or bare mirror) on this machine, a tarball, or a repository to fetch from."""
    location: str


@dataclass(frozen=True)
class Origin:
    """What a built Slurm was built from, as kept in its root filesystem's stamp."""

    tag: str
    commit: str | None
    """The commit the tag names; None for a tarball (its sha256 is in `source`)."""
    source: str
    """Where the tree came from: a git directory, a URL, or "PATH (sha256 HEX)" for a tarball."""


def choose_source(given: str | None) -> SourceChoice:
    """The source `given` names (a path or a git URL), or SchedMD's repository when nothing is given."""
    if given is None or not given.strip():
        return SourceChoice("url", SCHEDMD_URL)
    given = given.strip()
    if re.match(r"^(https?|git|ssh|file)://", given) or re.match(r"^[\w.-]+@[\w.-]+:", given):
        return SourceChoice("url", given)
    if given.endswith(TARBALL_SUFFIXES):
        return SourceChoice("tarball", given)
    return SourceChoice("git", given)


def top_directory(members: list[str]) -> str | None:
    """The one directory every member of a tarball lies under (SchedMD's tarballs have `slurm-24.05.8/`),
    or None when the tree is at the top (a `git archive` without --prefix)."""
    tops = {m.lstrip("./").split("/", 1)[0] for m in members if m.strip("./")}
    if len(tops) == 1:
        (top,) = tops
        if any(m.lstrip("./").startswith(top + "/") for m in members):
            return top
    return None


def meta_version(meta: str) -> tuple[int, int, int]:
    """(major, minor, micro) from a Slurm tree's META file (`Major: 24`, `Minor: 05`, `Micro: 8`)."""
    fields = {}
    for line in meta.splitlines():
        key, _, value = line.strip().partition(":")
        fields[key.strip()] = value.strip()
    try:
        return int(fields["Major"]), int(fields["Minor"]), int(fields["Micro"])
    except (KeyError, ValueError):
        raise ValueError("META has no Major/Minor/Micro lines") from None


def check_tree_version(meta: str, release: Release, where: str) -> None:
    """A clear error when the tree's META is not the release's tag (a tarball of another release)."""
    assert release.source_tag is not None
    wanted = tag_version(release.source_tag)
    try:
        found = meta_version(meta)
    except ValueError as exc:
        raise TestbedError(f"{where} is not a Slurm source tree ({exc})") from None
    if found != wanted:
        raise TestbedError(
            f"{where} is Slurm {found[0]}.{found[1]:02d}.{found[2]}, but the testbed's {release.name} is "
            f"{wanted[0]}.{wanted[1]:02d}.{wanted[2]} (tag {release.source_tag}): give that release's tarball, "
            f"or a clone of {SCHEDMD_URL}")


def _missing_source_help(release: Release) -> str:
    return (f"give SchedMD's source: a clone of {SCHEDMD_URL} (`clusterctl-testbed up --slurm {release.name} "
            f"--slurm-source DIR`, or {ENV}=DIR), or the release's tarball (--slurm-source slurm-X.tar.bz2)")


def export(choice: SourceChoice, release: Release, tarball: Path, clone_cache: Path) -> tuple[Path, Origin]:
    """The release's tree as a tar file (written to `tarball` unless the user's own tarball is the tree),
    and what it was made from.  A clear TestbedError, never a traceback, when the source cannot give it."""
    tag = release.source_tag
    if tag is None:
        raise ValueError(f"Slurm {release.name} comes from Debian's packages, not from source")
    if choice.kind == "tarball":
        path = Path(choice.location).expanduser().resolve()
        if not path.is_file():
            raise TestbedError(f"no Slurm tarball at {path}; {_missing_source_help(release)}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return path, Origin(tag, None, f"{path} (sha256 {digest})")
    if choice.kind == "url":
        git_dir = _fetch_tag(choice.location, release, clone_cache)
        source = choice.location
    else:
        git_dir = Path(choice.location).expanduser().resolve()
        if not git_dir.is_dir():
            raise TestbedError(f"no git directory at {git_dir}; {_missing_source_help(release)}")
        source = str(git_dir)
    commit = _commit_of(git_dir, release)
    tarball.parent.mkdir(parents=True, exist_ok=True)
    _git(git_dir, "archive", "--format=tar", "-o", str(tarball), commit)
    return tarball, Origin(tag, commit, source)


def _git(git_dir: Path, *args: str, check: bool = True) -> str:
    # safe.directory: the testbed runs as root, the clone may belong to its user (git then refuses it).
    result = run(["git", "-c", "safe.directory=*", "-C", str(git_dir), *args], timeout=GIT_TIMEOUT, check=check)
    return result.stdout.strip() if result.returncode == 0 else ""


def _commit_of(git_dir: Path, release: Release) -> str:
    tag = str(release.source_tag)
    if not _git(git_dir, "rev-parse", "--git-dir", check=False):
        raise TestbedError(f"{git_dir} is not a git repository; {_missing_source_help(release)}")
    commit = _git(git_dir, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}", check=False)
    if commit:
        return commit
    newest = newest_patch_tag(_git(git_dir, "tag", "--list", "slurm-*", check=False).splitlines(), release.version)
    has = f"its newest {release.name} tag is {newest}" if newest else f"it has no {release.name} tag at all"
    raise TestbedError(f"{git_dir} has no tag {tag} ({has}): `git -C {git_dir} fetch --tags {SCHEDMD_URL}`, "
                       f"or {_missing_source_help(release)}")


def _fetch_tag(url: str, release: Release, clone_cache: Path) -> Path:
    """A bare repository in the cache holding the release's tag, fetched alone (shallow) from `url`."""
    tag = str(release.source_tag)
    if not (clone_cache / "HEAD").is_file():
        clone_cache.mkdir(parents=True, exist_ok=True)
        _git(clone_cache, "init", "--quiet", "--bare")
    if _git(clone_cache, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}", check=False):
        return clone_cache
    print(f"testbed: fetching Slurm's tag {tag} from {url} into {clone_cache}", flush=True)
    try:
        _git(clone_cache, "fetch", "--quiet", "--depth=1", url, f"+refs/tags/{tag}:refs/tags/{tag}")
    except TestbedError as exc:
        raise TestbedError(f"cannot fetch Slurm {release.name}'s source (tag {tag}) from {url}: {exc}. "
                           f"Without a network, {_missing_source_help(release)}") from None
    return clone_cache
