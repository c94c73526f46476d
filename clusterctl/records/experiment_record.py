"""What one attempt of a run ran: `<run>/attempts/<n>/experiment.json`.

Written once per attempt by whoever submits it (`clusterctl submit`, or the supervisor before each
resubmission), next to the attempt's job script and before sbatch; read by `clusterctl report`.  It
holds the resolved spec (the spec as clusterctl understood it, defaults filled, in the form of the run's
spec.json and `clusterctl spec SPEC`), the command every rank runs, the code version of the launch
workdir (git commit and whether tracked files had uncommitted changes, or why that is unknown), the
spec's data version label and clusterctl's own version.  One small file per attempt: nothing per node
or rank.  The spec may hold secrets (`[launch] env` values, a webhook URL), so the file is its owner's
alone, as spec.json is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import (
    RecordError, check_header, field, header, read_json_record, refuse_unknown, seconds_field, strings_field,
    text_field, text_or_none_field, whole_field,
)
from clusterctl.text import one_line

KIND = "experiment-record"
VERSION = 1
FILE_NAME = "experiment.json"
MAX_DATA_VERSION = 256
"""The longest data version label (characters); the spec refuses a longer one (`job.data_version`)."""
MAX_TEXT = 512
"""The longest reason or version text kept (characters)."""
MAX_PATH = 4096
RECORD_LIMIT = 16 << 20
"""The largest record read (bytes): a spec (spec.json reads up to 4 MB) and a command line (the kernel
takes ~2 MB of argv) fit; a bigger file is not one clusterctl wrote."""
_COMMIT = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")  # SHA-1 or SHA-256 object names
_FIELDS = frozenset({"kind", "version", "attempt", "recorded_at", "clusterctl_version", "command", "data_version",
                     "code", "spec"})
_CODE_FIELDS = frozenset({"workdir", "commit", "dirty", "unknown"})


@dataclass(frozen=True)
class CodeVersion:
    """The code in the launch workdir when the attempt was submitted.

    `commit`: the git commit checked out (None: not known); `dirty`: whether tracked files differed
    from it (untracked files are not looked at; None: not known); `unknown`: why either is not known
    (not a git tree, git missing, too slow, a tree owned by another user...), None when both are.
    """

    workdir: str
    commit: str | None = None
    dirty: bool | None = None
    unknown: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The code version's entry."""
        return {"workdir": self.workdir, "commit": self.commit, "dirty": self.dirty, "unknown": self.unknown}

    @classmethod
    def from_json(cls, data: object, where: str) -> CodeVersion:
        """Parse the entry; RecordError naming `where` and the field for anything not understood."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "must be an object")
        refuse_unknown(data, _CODE_FIELDS, where)
        commit = field(data, "commit", (str, type(None)), where)
        if commit is not None and not _COMMIT.fullmatch(commit):
            raise RecordError(where, "field `commit` is not a git object name (40 or 64 hexadecimal digits)")
        dirty = field(data, "dirty", (bool, type(None)), where)
        return cls(workdir=text_field(data, "workdir", where, limit=MAX_PATH), commit=commit, dirty=dirty,
                   unknown=text_or_none_field(data, "unknown", where, limit=MAX_TEXT))

    @property
    def known(self) -> bool:
        """Both the commit and whether it was dirty are known."""
        return self.commit is not None and self.dirty is not None


@dataclass(frozen=True)
class ExperimentRecord:
    """What attempt `attempt` ran, recorded at `recorded_at` (epoch seconds) by clusterctl `clusterctl_version`.

    `spec` is the run-spec document (its own kind and version header: the run's spec.json form), kept
    as JSON: the launcher reads it, this record only carries it.
    """

    attempt: int
    recorded_at: float
    clusterctl_version: str
    command: tuple[str, ...]
    data_version: str | None
    code: CodeVersion
    spec: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        return {**header(KIND, VERSION), "attempt": self.attempt, "recorded_at": self.recorded_at,
                "clusterctl_version": self.clusterctl_version, "command": list(self.command),
                "data_version": self.data_version, "code": self.code.to_json(), "spec": dict(self.spec)}

    @classmethod
    def from_json(cls, data: object, where: str) -> ExperimentRecord:
        """Parse the record; RecordError naming `where` and the field for anything not exactly understood
        (a newer version is refused: upgrade clusterctl to read it)."""
        body = check_header(data, KIND, VERSION, where)
        refuse_unknown(body, _FIELDS, where)
        return cls(attempt=whole_field(body, "attempt", where), recorded_at=seconds_field(body, "recorded_at", where),
                   clusterctl_version=text_field(body, "clusterctl_version", where, limit=MAX_TEXT),
                   command=strings_field(body, "command", where),
                   data_version=text_or_none_field(body, "data_version", where, limit=MAX_DATA_VERSION),
                   code=CodeVersion.from_json(field(body, "code", dict, where), f"{where}: code"),
                   spec=field(body, "spec", dict, where))


def experiment_record_path(attempt_dir: Path) -> Path:
    """Where the record of the attempt whose folder is `attempt_dir` (`<run>/attempts/<n>`) lives."""
    return attempt_dir / FILE_NAME


def write_experiment_record(attempt_dir: Path, record: ExperimentRecord) -> Path:
    """Write the attempt's record atomically, readable by its owner alone; its path.  Reasons and
    versions are cut to MAX_TEXT on one line (they come from git's and the installation's answers)."""
    code = record.code
    unknown = one_line(code.unknown)[:MAX_TEXT] if code.unknown is not None else None
    kept = ExperimentRecord(record.attempt, record.recorded_at, one_line(record.clusterctl_version)[:MAX_TEXT],
                            record.command, record.data_version, CodeVersion(code.workdir, code.commit, code.dirty,
                                                                             unknown), record.spec)
    return atomic_write(experiment_record_path(attempt_dir), json.dumps(kept.to_json(), indent=2, sort_keys=True)
                        + "\n", mode=0o600)


def read_experiment_record(attempt_dir: Path) -> ExperimentRecord | None:
    """The attempt's record; None when it has none (an attempt submitted by a clusterctl before records, or
    not submitted yet); RecordError when it is damaged, foreign or from a newer clusterctl."""
    path = experiment_record_path(attempt_dir)
    data = read_json_record(path, missing_ok=True, limit=RECORD_LIMIT, follow_symlinks=False)
    return None if data is None else ExperimentRecord.from_json(data, str(path))
