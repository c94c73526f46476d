"""Real Slurm outputs recorded per release (tests/data/slurm/<release>/, written by
scripts/record-slurm-outputs.py), found by listing the directories: a new release's recording is
tested with no test edit.

Each directory's index.json says which command printed each file (argv, exit status, stderr), which
job is which (`jobs`: role → id) and what was done to each node (`nodes`: name → description), and
`slurm`: the release as the testbed reported it.  What a test expects of a release is asked of the
SlurmVersion that release parses to (`recording.version.squeue_json_filters`), never of its name.
The `recording` fixture (tests/conftest.py) gives each recording in turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path

import pytest

from clusterctl.errors import SlurmCommandError
from clusterctl.slurm.commands import Completed
from clusterctl.slurm.jobs import LINE_SOURCE, JobReport
from clusterctl.slurm.nodes import NodeState
from clusterctl.slurm.version import SlurmVersion, parse_version

REPO = Path(__file__).resolve().parent.parent
RECORDINGS = REPO / "tests" / "data" / "slurm"


def recording_dirs() -> list[Path]:
    """Every recorded release's directory (one with an index.json), oldest name first."""
    return sorted(index.parent for index in RECORDINGS.glob("*/index.json"))


@dataclass(frozen=True)
class RecordedFile:
    """One recorded command: its argv, what it printed and how it exited."""

    name: str
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    about: str

    @property
    def completed(self) -> Completed:
        """What a runner returns for this command."""
        return Completed(self.returncode, self.stdout, self.stderr)


@dataclass(frozen=True)
class Recording:
    """One release's recorded outputs, as index.json describes them."""

    directory: Path
    slurm: str
    """The release as the testbed reported it, e.g. `slurm-wlm 24.11.5`."""
    version: SlurmVersion
    jobs: Mapping[str, str] = field(repr=False)
    """Job role (`completed`, `failed`, `running`, ...) → job id."""
    nodes: Mapping[str, str] = field(repr=False)
    """Node → what the recording script did to it (`drained by an admin`, ...)."""
    files: Mapping[str, RecordedFile] = field(repr=False)

    @property
    def name(self) -> str:
        """The directory's name (`24.11`)."""
        return self.directory.name

    @property
    def where(self) -> str:
        """The directory relative to the repository, for messages."""
        return str(self.directory.relative_to(REPO))

    def text(self, name: str) -> str:
        """What the command recorded as `name` printed."""
        return self.files[name].stdout

    def recorded(self, argv: Sequence[str]) -> RecordedFile | None:
        """The file recording exactly `argv`, if there is one."""
        return self._by_argv.get(tuple(argv))

    def require(self, argv: Sequence[str]) -> RecordedFile:
        """The file recording `argv`; fails the test (saying where and how to fix it) when this
        recording lacks the command: every release's recording holds every command clusterctl runs."""
        found = self.recorded(argv)
        if found is None:
            pytest.fail(f"{self.where}: `{' '.join(argv)}` is not recorded (the recording predates it): "
                        f"record again with scripts/record-slurm-outputs.py --slurm {self.name}", pytrace=False)
        return found

    @cached_property
    def _by_argv(self) -> dict[tuple[str, ...], RecordedFile]:
        return {file.argv: file for file in self.files.values()}

    def replay(self, extra: Mapping[str, Completed] | None = None) -> Replay:
        """A Slurm runner answering what this release's commands printed."""
        return Replay(self, dict(extra or {}))

    def role_of(self, job_id: str) -> str | None:
        """Which recorded job `job_id` is (None: not one the recording script made on purpose)."""
        return next((role for role, known in self.jobs.items() if known == job_id), None)


@dataclass(eq=False)  # hashed by identity: the Slurm door caches the release per runner, weakly keyed
class Replay:
    """A runner replaying a recording: each recorded argv gets what Slurm printed, `extra` (keyed by
    argv joined with spaces) is answered first, and an argv nobody recorded fails the test, naming it."""

    recording: Recording
    extra: dict[str, Completed] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], timeout: float) -> Completed:
        self.calls.append(list(argv))
        key = " ".join(argv)
        if key in self.extra:
            return self.extra[key]
        found = self.recording.recorded(argv)
        assert found is not None, f"{self.recording.where}: no recorded output of `{key}`"
        return found.completed


def _fail(directory: Path, problem: str) -> BaseException:
    """A test failure (shown without a traceback) naming the recording's directory."""
    return pytest.fail.Exception(f"{directory.relative_to(REPO)}: {problem}", pytrace=False)


@cache
def load_recording(directory: Path) -> Recording:
    """The recording in `directory`; a clean test failure naming the directory when its index.json
    cannot be read, a file it lists is missing, or its `slurm` is a release clusterctl does not support."""
    try:
        index = json.loads((directory / "index.json").read_text())
        slurm, jobs, nodes, entries = index["slurm"], index["jobs"], index["nodes"], index["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _fail(directory, f"index.json cannot be read ({type(exc).__name__}: {exc}); "
                               "it needs `slurm`, `jobs`, `nodes` and `files`, as scripts/record-slurm-outputs.py "
                               "writes it") from None
    try:
        version = parse_version(str(slurm), ["index.json", "slurm"])
    except SlurmCommandError as exc:
        raise _fail(directory, f"index.json's \"slurm\" is {slurm!r}, a release this clusterctl does not support "
                               f"({exc}); support it in clusterctl/slurm/version.py or remove the directory") from None
    files = {}
    for name, entry in entries.items():
        path = directory / name
        if not path.is_file():
            raise _fail(directory, f"index.json lists {name}, which is not there; record the release again")
        files[name] = RecordedFile(name, tuple(entry["argv"]), int(entry["returncode"]), path.read_text(),
                                   str(entry.get("stderr", "")), str(entry.get("about", "")))
    return Recording(directory, str(slurm), version, dict(jobs), dict(nodes), files)


# ---- what a user must see of each recorded job and node -------------------------------------------
JOB_STATES = {"completed": "COMPLETED", "failed": "FAILED", "cancelled": "CANCELLED", "node_fail": "NODE_FAIL",
              "running": "RUNNING", "pending": "PENDING"}
"""Each job role the recording script makes → the state Slurm must report for it."""

FAILED_EXIT_CODE = 3
"""The recording script's `failed` job runs `exit 3` (index.json's job_notes)."""

UNFINISHED_ROLES = frozenset({"running", "pending"})


def check_job(recording: Recording, role: str, report: JobReport | None, *, accounting: bool = False) -> None:
    """`report` is what a user must see of the recorded job `role`: its state, and the failed job's exit 3.

    From accounting (`accounting=True`) a job not ended yet may be missing or still read as an earlier
    unfinished state (slurmdbd lags the controller: the real 24.05.8 recording lacks the pending job and
    has the running one PENDING with its steps RUNNING) but never as ended, and the failed job's exit
    code is unknown (None, never 0) where the release's sacct cannot be trusted with it."""
    where = f"{recording.where}: job {recording.jobs[role]} ({role})"
    assert role in JOB_STATES, f"{where}: no expected state for role {role!r}: add it to tests/recordings.py"
    unfinished = role in UNFINISHED_ROLES
    if report is None and accounting and unfinished:
        return
    assert report is not None, f"{where} is missing"
    expected = {JOB_STATES[r] for r in UNFINISHED_ROLES} if accounting and unfinished else {JOB_STATES[role]}
    assert report.state in expected, f"{where} read as {report.state}, expected {' or '.join(sorted(expected))}"
    assert report.terminal == (not unfinished), f"{where}: terminal is {report.terminal}"
    if role == "failed" and report.source != LINE_SOURCE:
        code = FAILED_EXIT_CODE if not accounting or recording.version.sacct_exit_code_trustworthy else None
        assert report.exit_code == code, f"{where}: exit code {report.exit_code}, expected {code}"


NodeCheck = Callable[[NodeState], bool]
NODE_KINDS: tuple[tuple[str, str, NodeCheck], ...] = (
    ("running a job", "allocated or mixed, not drained", lambda n: not n.draining and n.state in ("allocated", "mixed")),
    ("drained by an admin", "drained by someone other than healthd", lambda n: n.drained_by_someone_else),
    ("dead", "down and not responding", lambda n: n.state == "down" and "NOT_RESPONDING" in n.flags),
    ("drained by healthd", "drained by healthd", lambda n: n.drained_by_us),
    ("drained with healthd's reason", "drained by healthd", lambda n: n.drained_by_us),
)
"""index.json's node descriptions (how each starts) → what a reader must make of that node."""


def check_node(recording: Recording, node: NodeState) -> None:
    """`node` reads as what the recording script did to it (index.json's `nodes`)."""
    description = recording.nodes.get(node.name)
    where = f"{recording.where}: {node.name} ({description})"
    assert description is not None, f"{recording.where}: {node.name} is not one of the recorded nodes"
    for start, expected, holds in NODE_KINDS:
        if description.startswith(start):
            assert holds(node), f"{where} read as {node}, expected {expected}"
            return
    raise AssertionError(f"{where}: no expectation for this description; add one to NODE_KINDS in tests/recordings.py")


def asked_ids(argv: Sequence[str]) -> list[str]:
    """The job ids `-j` names in argv (none: every job)."""
    return argv[list(argv).index("-j") + 1].split(",") if "-j" in argv else []


def option(argv: Sequence[str], flag: str) -> str | None:
    """The value after `flag` in argv (`-p gpu` → gpu), None when absent."""
    return argv[list(argv).index(flag) + 1] if flag in argv else None



UNREACHABLE = RECORDINGS / "unreachable.json"
"""What real Slurm clients printed when Slurm could not be reached (scripts/record-unreachable-slurm.py):
case `no-config` (no slurm.conf, no DNS SRV record) and `controller-down` (slurmctld not answering)."""


def unreachable_runner(case: str, calls: list[list[str]] | None = None) -> Callable[[Sequence[str], float], Completed]:
    """A runner answering each command as the real client did in `case` of UNREACHABLE, by its command
    (`squeue --json`, `scontrol show topology`...: the recorded job ids may differ from the asked ones);
    a command not recorded fails the test.  `calls` collects what was asked."""
    recorded = json.loads(UNREACHABLE.read_text())["cases"][case]

    def run(argv: Sequence[str], timeout: float) -> Completed:
        if calls is not None:
            calls.append(list(argv))
        for entry in recorded.values():
            if list(argv[:2]) == entry["argv"][:2] and (argv[0] != "scontrol" or list(argv[:3]) == entry["argv"][:3]):
                return Completed(entry["returncode"], entry["stdout"], entry["stderr"])
        raise AssertionError(f"`{' '.join(argv)}` was not recorded with Slurm unreachable ({case})")
    return run
