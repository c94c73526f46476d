"""The code version of a launch workdir, asked of git: the commit checked out and whether tracked files changed.

Two git calls per attempt, each under a timeout: `rev-parse --verify HEAD` and `status --porcelain
--untracked-files=no` (untracked files are not looked at: listing them walks every data folder a workdir
may hold).  Whatever goes wrong (not a git tree, git missing, a slow filesystem, a tree owned by another
user that git refuses to read) makes the version unknown with the reason, never a failed submission.
clusterctl never changes git's configuration (no `safe.directory` added) and git writes nothing
(`GIT_OPTIONAL_LOCKS=0`: status does not refresh the index).

Running git is the door (`GitDoor`; `run_git` is the real one, tests pass a fake); reading its answers is
`code_version` (pure).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from clusterctl.records.experiment_record import CodeVersion
from clusterctl.text import one_line

GIT_SECONDS = 5.0
"""The longest each git call may take (a cold cache over NFS in a very large repository can take seconds)."""
# Variables that would point git at another repository or index than the workdir's own.
_REPOSITORY_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                         "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_PREFIX")
_COMMIT = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


@dataclass(frozen=True)
class GitAnswer:
    """What one git call returned; `returncode` None when git gave no answer (`stderr` says why)."""

    returncode: int | None
    stdout: str
    stderr: str


class GitDoor(Protocol):
    """Runs git with `argv` (git's own arguments, without `git`) under a timeout in seconds."""

    def __call__(self, argv: Sequence[str], timeout: float) -> GitAnswer: ...


def git_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a git call that reads the workdir's own repository, writes nothing and answers in English."""
    env = {name: value for name, value in environ.items() if name not in _REPOSITORY_VARIABLES}
    env.update(GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C", LANGUAGE="C")
    return env


def run_git(argv: Sequence[str], timeout: float) -> GitAnswer:
    """The real door: `git` + argv, no shell, output captured, a hard timeout; never raises for git's sake."""
    command = ["git", *argv]
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout,
                              stdin=subprocess.DEVNULL, env=git_environment(os.environ))
    except subprocess.TimeoutExpired:
        return GitAnswer(None, "", f"git gave no answer within {timeout:g} s (a very large or slow repository?)")
    except FileNotFoundError:
        return GitAnswer(None, "", "git is not installed here (not on PATH)")
    except OSError as exc:
        return GitAnswer(None, "", f"cannot run git: {exc.strerror}")
    return GitAnswer(done.returncode, done.stdout, done.stderr)


def probe_code_version(workdir: str, git: GitDoor, timeout: float = GIT_SECONDS) -> CodeVersion:
    """The code version of `workdir`: two git calls through `git`; unknown, with the reason, when git cannot say."""
    head = git(["-C", workdir, "rev-parse", "--verify", "HEAD"], timeout)
    if head.returncode != 0 or not _COMMIT.fullmatch(head.stdout.strip()):
        return code_version(workdir, head, None)
    return code_version(workdir, head, git(["-C", workdir, "status", "--porcelain", "--untracked-files=no"], timeout))


def code_version(workdir: str, head: GitAnswer, status: GitAnswer | None) -> CodeVersion:
    """Read git's answers to `rev-parse --verify HEAD` and (when that gave a commit) `status --porcelain`."""
    if head.returncode != 0:
        return CodeVersion(workdir, unknown=why_unknown(head))
    commit = head.stdout.strip()
    if not _COMMIT.fullmatch(commit):
        return CodeVersion(workdir, unknown=f"git named no commit ({one_line(commit[:80])!r})")
    if status is None or status.returncode != 0:
        why = why_unknown(status) if status is not None else "not asked"
        return CodeVersion(workdir, commit, unknown=f"whether tracked files changed is unknown: {why}")
    return CodeVersion(workdir, commit, dirty=bool(status.stdout.strip()))


def why_unknown(answer: GitAnswer) -> str:
    """Why a git call gave no version, in a user's words (git's own first line when it is none of the known cases)."""
    said = answer.stderr
    if answer.returncode is None:
        return said
    if "not a git repository" in said:
        return "not a git tree"
    if "dubious ownership" in said:
        return ("a git tree owned by another user, which git refuses to read (its safe.directory check; "
                "clusterctl does not change git's configuration)")
    if "cannot change to" in said:
        return "the workdir cannot be entered here (missing, or not a directory this user may enter)"
    if "Needed a single revision" in said or "unknown revision" in said:
        return "a git tree with no commit yet"
    first = next((line.strip() for line in said.splitlines() if line.strip()), f"exit {answer.returncode}")
    return f"git said: {one_line(first)[:200]}"
