"""What a step's processes are told about multi-level checkpoints: `CLUSTERCTL_CHECKPOINT`, one JSON record.

Written by the job's agent into the step's environment (launcher/job/checkpoint_plan.py), read by the
training program's `clusterctl.checkpoint.Checkpointer` on every rank.  Everything a rank needs to find
its node's fast tier, the shared tier, the step's tier index and its buddy's copy server; nothing a rank
could use to reach another user's files (the paths are the agent's, checked where they are used).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.records.versioned import (
    RecordError, check_header, field, header, parse_json_record, refuse_unknown, whole_field,
)

KIND = "checkpoint-settings"
VERSION = 1
SETTINGS_ENV = "CLUSTERCTL_CHECKPOINT"
SETTINGS_LIMIT = 16 << 10
"""The longest value of SETTINGS_ENV read (bytes): paths and a few numbers."""
_RUN_KEY = re.compile(r"[0-9a-f]{16}")
_FIELDS = frozenset({"kind", "version", "run_key", "local_base", "shared_dir", "tier_index", "port", "keep",
                     "flush_every_steps", "flush_at_end", "local_budget_bytes", "shared_bytes_per_second",
                     "resume_step"})


@dataclass(frozen=True)
class CheckpointSettings:
    """One step's multi-level checkpoint settings (see docs/checkpoint-tiers.md).

    `local_base` holds the node's tier (`tier_root`); `shared_dir` is the run's checkpoint directory;
    `tier_index` the step's `tiers.idx` ('' when there is none: a fresh start); `port` the TCP port of
    every node's copy server in this step; `resume_step` the checkpoint the index says to resume from.
    """

    run_key: str
    local_base: str
    shared_dir: str
    tier_index: str
    port: int
    keep: int = 2
    flush_every_steps: int = 0
    flush_at_end: bool = True
    local_budget_bytes: int = 0
    shared_bytes_per_second: float = 0.0
    resume_step: int | None = None

    def __post_init__(self) -> None:
        if (problem := _settings_problem(self)):
            raise ValueError(problem)

    def tier_root(self, uid: int | None = None) -> Path:
        """The node's fast tier of this run: `<local_base>/clusterctl-<uid>/ckpt-<run_key>`."""
        return Path(self.local_base) / f"clusterctl-{os.getuid() if uid is None else uid}" / f"ckpt-{self.run_key}"

    def to_json(self) -> dict[str, Any]:
        """The record as sent."""
        return {**header(KIND, VERSION), "run_key": self.run_key, "local_base": self.local_base,
                "shared_dir": self.shared_dir, "tier_index": self.tier_index, "port": self.port, "keep": self.keep,
                "flush_every_steps": self.flush_every_steps, "flush_at_end": self.flush_at_end,
                "local_budget_bytes": self.local_budget_bytes,
                "shared_bytes_per_second": self.shared_bytes_per_second, "resume_step": self.resume_step}

    def to_env(self) -> dict[str, str]:
        """The step's environment entry."""
        return {SETTINGS_ENV: json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))}

    @classmethod
    def from_json(cls, data: object, where: str) -> CheckpointSettings:
        """Parse the record; RecordError naming `where` and the key for anything not exactly understood."""
        body = check_header(data, KIND, VERSION, where)
        refuse_unknown(body, _FIELDS, where)
        run_key = field(body, "run_key", str, where)
        paths = {key: field(body, key, str, where) for key in ("local_base", "shared_dir", "tier_index")}
        flush_at_end = field(body, "flush_at_end", bool, where)
        rate = field(body, "shared_bytes_per_second", (int, float), where)
        resume_step = field(body, "resume_step", (int, type(None)), where)
        if resume_step is not None:
            resume_step = whole_field(body, "resume_step", where)
        try:
            return cls(run_key=run_key, **paths, port=whole_field(body, "port", where, maximum=65535),
                       keep=whole_field(body, "keep", where, maximum=1000),
                       flush_every_steps=whole_field(body, "flush_every_steps", where), flush_at_end=flush_at_end,
                       local_budget_bytes=whole_field(body, "local_budget_bytes", where),
                       shared_bytes_per_second=float(rate), resume_step=resume_step)
        except ValueError as exc:
            raise RecordError(where, str(exc)) from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> CheckpointSettings | None:
        """The step's settings; None when the variable is unset (multi-level checkpoints are off); RecordError
        naming the variable when it is set but not understood."""
        text = environ.get(SETTINGS_ENV)
        if text is None or text == "":
            return None
        raw = text.encode("utf-8", errors="replace")
        if len(raw) > SETTINGS_LIMIT:
            raise RecordError(SETTINGS_ENV, f"{len(raw)} bytes: at most {SETTINGS_LIMIT}")
        return cls.from_json(parse_json_record(raw, SETTINGS_ENV), SETTINGS_ENV)


def _settings_problem(s: CheckpointSettings) -> str | None:
    if not isinstance(s.run_key, str) or not _RUN_KEY.fullmatch(s.run_key):
        return f"run_key {s.run_key!r} must be 16 lowercase hex digits"
    for key, value in (("local_base", s.local_base), ("shared_dir", s.shared_dir), ("tier_index", s.tier_index)):
        if not isinstance(value, str) or "\0" in value or (value and not value.startswith("/")):
            return f"{key} {value!r} must be an absolute path" + (" or ''" if key == "tier_index" else "")
    if not s.local_base or not s.shared_dir:
        return "local_base and shared_dir must not be empty"
    if isinstance(s.port, bool) or not isinstance(s.port, int) or not 1 <= s.port <= 65535:
        return f"port {s.port!r} is not a TCP port (1 to 65535)"
    if isinstance(s.keep, bool) or not isinstance(s.keep, int) or not s.keep >= 1:
        return f"keep {s.keep!r} must be a whole number of at least 1"
    if not isinstance(s.shared_bytes_per_second, (int, float)) or isinstance(s.shared_bytes_per_second, bool) \
            or not math.isfinite(s.shared_bytes_per_second) or s.shared_bytes_per_second < 0:
        return f"shared_bytes_per_second {s.shared_bytes_per_second!r} must be a finite number, not negative"
    for name, number in (("flush_every_steps", s.flush_every_steps), ("local_budget_bytes", s.local_budget_bytes)):
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            return f"{name} {number!r} must be a whole number, not negative"
    if s.resume_step is not None and (isinstance(s.resume_step, bool) or not isinstance(s.resume_step, int)
                                      or s.resume_step < 0):
        return f"resume_step {s.resume_step!r} must be a whole number or null"
    return None
