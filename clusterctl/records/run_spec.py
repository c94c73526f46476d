"""A run's effective spec: `<run>/spec.json`, kind `run-spec`.

Written once by `clusterctl submit` when it makes the run directory (overrides applied, defaults
filled: what the job reads); read back by the supervisor, the job's agent, `status`, `report` and
`cancel`.  Its fields are the spec's own, as the launcher's `JobSpec.to_dict` gives them, under the
kind and version header.  This record knows the header and the file; what the spec's fields mean is
the launcher's spec reader's to check (records/ does not import the launcher).

A spec.json from before the header (no `kind`, no `version`) holds the same fields and is read as
version 1.  The spec may hold secrets (`[launch] env` values, a webhook URL): the file is its owner's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.files import atomic_write
from clusterctl.records.versioned import check_header, header, read_json_record

KIND = "run-spec"
VERSION = 1
FILE_NAME = "spec.json"
SPEC_LIMIT = 4 << 20
"""The largest spec.json read (bytes): a spec is a few KB; a bigger file is not one clusterctl wrote."""


@dataclass(frozen=True)
class RunSpecRecord:
    """spec.json: `spec` is the spec's own fields (without the header), as `JobSpec.to_dict` gives them."""

    spec: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The record as stored: the header, then the spec's fields."""
        return {**header(KIND, VERSION), **self.spec}

    @classmethod
    def from_json(cls, data: object, where: str) -> RunSpecRecord:
        """Parse the record; RecordError naming `where` for another kind, a newer version or no JSON object
        (the spec's fields are checked by whoever turns them back into a spec)."""
        if isinstance(data, Mapping) and "kind" not in data and "version" not in data:
            body: Mapping[str, Any] = data  # written before spec.json had a header: the same fields
        else:
            body = check_header(data, KIND, VERSION, where)
        return cls({key: value for key, value in body.items() if key not in ("kind", "version")})


def run_spec_path(run_dir: Path) -> Path:
    """Where the run at `run_dir` keeps its effective spec."""
    return run_dir / FILE_NAME


def write_run_spec(run_dir: Path, record: RunSpecRecord) -> Path:
    """Write the run's spec atomically, readable by its owner only; its path."""
    text = json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n"
    return atomic_write(run_spec_path(run_dir), text, mode=0o600)


def read_run_spec(run_dir: Path) -> RunSpecRecord:
    """The run's spec record: FileNotFoundError when the run has none; RecordError when it is not a regular
    file, is larger than SPEC_LIMIT, is not JSON, or is another kind or a newer version."""
    path = run_spec_path(run_dir)
    return RunSpecRecord.from_json(read_json_record(path, limit=SPEC_LIMIT), str(path))
