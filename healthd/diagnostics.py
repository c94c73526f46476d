"""Active diagnostics (pure): the levels a site configures, and the verdict read from a command's output.

Three levels, each run where it belongs:
  preflight       in the prolog, within its budget (`dcgmi diag -r 1`: seconds)
  after_failure   once after healthd drained the node (`dcgmi diag -r 2`: ~2 min), for the admin
  before_return   before healthd returns a node it drained to service (`dcgmi diag -r 3`: ~15 min);
                  the node stays drained until this level has passed after the drain

Each level is an argv list (never a shell string), a timeout and a parser: `dcgmi` reads DCGM's
`dcgmi diag -r N -j` JSON (per-test results Pass/Fail/Warn/Skip, and the exit code), `exit-code` reads a
site's own command (0 passes, anything else fails; the tail of its output is the evidence).

The output is text from a program healthd does not control: it is parsed as data, never interpreted as
markup, and only a bounded excerpt (one line, at most EXCERPT_CHARS) is kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from clusterctl.records.healthd_diagnostic import LEVELS, DiagnosticResult, Level, Outcome
from clusterctl.text import one_line

__all__ = ["LEVELS", "DiagnosticResult", "DiagnosticSpec", "Diagnostics", "Level", "Outcome", "default_diagnostics",
           "excerpt", "judge_run", "read_dcgmi", "read_exit_code"]

Parser = Literal["dcgmi", "exit-code"]
PARSERS: tuple[Parser, ...] = ("dcgmi", "exit-code")

EXCERPT_CHARS = 400
"""Evidence kept per result (the journal, the state file, a drain reason's source)."""
OUTPUT_LIMIT = 1 << 20
"""Bytes of a diagnostic's output read at most (DCGM's r3 JSON is tens of KB): the rest is discarded."""
DCGMI_LEVEL_TIMEOUTS: Mapping[Level, tuple[int, float]] = {
    "preflight": (1, 60.0), "after_failure": (2, 600.0), "before_return": (3, 3600.0)}
"""The default level per place when dcgmi is installed: (DCGM run level, timeout in seconds).  r1 takes
seconds, r2 about two minutes, r3 about fifteen: the timeouts leave room for a slow node, not a hung one."""


@dataclass(frozen=True)
class DiagnosticSpec:
    """One configured diagnostic: what runs (argv), for how long at most, and how its verdict is read."""

    argv: tuple[str, ...]
    timeout: float
    parser: Parser = "exit-code"

    @property
    def name(self) -> str:
        """How the journal and the status name it: its argv (`dcgmi diag -r 3 -j`)."""
        return one_line(" ".join(self.argv))[:120]


@dataclass(frozen=True)
class Diagnostics:
    """The diagnostics configured per level ([diagnostics] in healthd.toml, or DCGM's defaults)."""

    preflight: DiagnosticSpec | None = None
    after_failure: DiagnosticSpec | None = None
    before_return: DiagnosticSpec | None = None
    source: str = "none configured"
    """Where they come from, for `healthd check` and status: "[diagnostics] in healthd.toml", "dcgmi on PATH"..."""

    def at(self, level: Level) -> DiagnosticSpec | None:
        """The diagnostic of `level` (None: not configured)."""
        spec: DiagnosticSpec | None = getattr(self, level)
        return spec

    @property
    def any(self) -> bool:
        return any(self.at(level) is not None for level in LEVELS)

    def describe(self) -> list[str]:
        """One line per level, for `healthd check` and `healthd status`."""
        if not self.any:
            return [f"diagnostics: none configured ({self.source}): drained nodes return on clean checks alone"]
        return [f"diagnostic {level}: " + (f"{spec.name} (timeout {spec.timeout:g} s, parser {spec.parser})"
                                           if (spec := self.at(level)) is not None else "none")
                for level in LEVELS]


def default_diagnostics(configured: Diagnostics | None, which: Callable[[str], str | None]) -> Diagnostics:
    """The diagnostics in force: the configured ones when [diagnostics] is written, else DCGM's levels
    r1/r2/r3 when `dcgmi` is found by `which`, else none (said so)."""
    if configured is not None:
        return configured
    dcgmi = which("dcgmi")
    if dcgmi is None:
        return Diagnostics(source="no [diagnostics] in healthd.toml and no dcgmi on PATH")
    specs = {level: DiagnosticSpec((dcgmi, "diag", "-r", str(run), "-j"), timeout, "dcgmi")
             for level, (run, timeout) in DCGMI_LEVEL_TIMEOUTS.items()}
    return Diagnostics(**specs, source=f"DCGM defaults ({dcgmi} on PATH)")


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """The tail of `text` as one line of at most `limit` characters (controls shown as escapes)."""
    tail = one_line(text.strip()[-limit * 2:])
    return tail if len(tail) <= limit else "..." + tail[-(limit - 3):]


@dataclass(frozen=True)
class Verdict:
    """A parser's reading of one run: the outcome and the line that says why."""

    outcome: Outcome
    summary: str


def read_exit_code(exit_code: int, stdout: str) -> Verdict:
    """A site's own command: 0 passes, anything else fails (its output's tail is the evidence)."""
    if exit_code == 0:
        return Verdict("pass", "")
    return Verdict("fail", f"exit code {exit_code}" + (f": {excerpt(stdout, 160)}" if stdout.strip() else ""))


def _json_object(stdout: str) -> dict[str, Any] | None:
    # dcgmi may print a warning line before its JSON: read from the first brace.
    start = stdout.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(stdout[start:])
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _texts(value: object) -> list[str]:
    """Warnings or info as DCGM writes them: strings (3.x) or objects with a "warning"/"message" (4.x)."""
    items = value if isinstance(value, list) else [value] if value else []
    out = []
    for item in items:
        if isinstance(item, dict):
            item = item.get("warning") or item.get("message") or item.get("error") or ""
        if isinstance(item, str) and item:
            out.append(item)
    return out


STATUSES = {"pass": "pass", "passed": "pass", "fail": "fail", "failed": "fail", "warn": "warn", "warning": "warn",
            "skip": "skip", "skipped": "skip", "not run": "skip", "notrun": "skip"}
"""DCGM's per-test statuses (3.x prints Pass/Fail/Warn/Skip; older NVVS PASS/FAIL/WARN/SKIPPED)."""


def read_dcgmi(exit_code: int, stdout: str) -> Verdict:
    """`dcgmi diag -r N -j`: fail when any test's result is Fail, or dcgmi exited non-zero (a runtime
    error, a GPU it could not test); pass when it exited 0 and no test failed (Warn and Skip pass, said).

    The JSON is {"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results":
    [{"gpu_ids", "status", "warnings", "info"}]}]}], "version"}}; DCGM 4 may also put "tests" at its top.
    Output that is not that JSON is an error, never a pass."""
    data = _json_object(stdout)
    if data is None:
        why = f"exit code {exit_code}, " if exit_code else ""
        return Verdict("error", f"{why}no dcgmi JSON in its output: {excerpt(stdout, 160) or '(nothing)'}")
    root = data.get("DCGM GPU Diagnostic", data.get("DCGM Diagnostic", data))
    root = root if isinstance(root, dict) else {}
    categories = root.get("test_categories")
    tests: list[tuple[str, object]] = []
    for category in categories if isinstance(categories, list) else []:
        if isinstance(category, dict) and isinstance(category.get("tests"), list):
            tests += [(str(category.get("category", "")), test) for test in category["tests"]]
    if isinstance(root.get("tests"), list):
        tests += [("", test) for test in root["tests"]]
    failed, warned, ran = [], [], 0
    for _, test in tests:
        if not isinstance(test, dict):
            continue  # DCGM writes nulls between tests
        name = str(test.get("name", "?"))
        results = test.get("results")
        for result in results if isinstance(results, list) else []:
            if not isinstance(result, dict):
                continue
            status = STATUSES.get(str(result.get("status", "")).strip().lower(), "fail")
            ran += 1
            gpus = result.get("gpu_ids", result.get("entity_id", ""))
            where = f" gpu{gpus}" if isinstance(gpus, (str, int)) and str(gpus) and "," not in str(gpus) else ""
            said = "; ".join(_texts(result.get("warnings")) or _texts(result.get("info")))
            line = f"{name}{where}" + (f": {said}" if said else "")
            if status == "fail":
                failed.append(line)
            elif status == "warn":
                warned.append(line)
    runtime = "; ".join(_texts(data.get("runtime_error")) + _texts(root.get("runtime_error")))
    if failed:
        return Verdict("fail", excerpt("failed: " + " | ".join(failed), 300))
    if exit_code != 0 or runtime:
        return Verdict("fail", excerpt(f"exit code {exit_code}" + (f": {runtime}" if runtime else ""), 300))
    if ran == 0:
        return Verdict("error", "dcgmi ran no test")
    return Verdict("pass", excerpt("warnings: " + " | ".join(warned), 300) if warned else f"{ran} results passed")


def judge_run(spec: DiagnosticSpec, exit_code: int, stdout: str) -> Verdict:
    """The verdict of a run that finished, by the spec's parser."""
    if spec.parser == "dcgmi":
        return read_dcgmi(exit_code, stdout)
    return read_exit_code(exit_code, stdout)
