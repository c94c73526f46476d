"""The engine's shell, on healthd's main thread: the only owner of the engine state (engine.py).

It steps the pure engine with each input (a batch of findings, an applier's outcome) and carries
out the effects it returns, in order: an Xid sighting is appended to the history; a drain or
resume is journaled (durable) before it is handed to the applier; an open breaker is alerted.
Opening the journal and the Xid history at start (`open_journal`, `restored_state`) sets aside a
file this healthd cannot read rather than stopping on it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from clusterctl.clock import Clock
from clusterctl.errors import SlurmCommandError
from clusterctl.healthd import engine
from clusterctl.healthd.applier import Applied, Applier
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.diagnostics import DiagnosticSpec, Level
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.journal import Journal
from clusterctl.healthd.metrics import Metrics
from clusterctl.healthd.observed import Observed
from clusterctl.records.healthd_diagnostic import (
    DiagnosticResult, append_diagnostic, diagnostics_path, read_diagnostics,
)
from clusterctl.records.healthd_job_start import read_job_starts
from clusterctl.records.healthd_xid_history import (
    XidSighting, append_xid_sighting, read_xid_history, rewrite_xid_history, xid_history_path,
)
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.nodes import NodeSlurm

log = logging.getLogger("healthd")


def open_journal(config: HealthdConfig, clock: Clock) -> Journal:
    """The action journal in journal_dir (created), read once; an unreadable one is set aside."""
    config.journal_dir.mkdir(parents=True, exist_ok=True)
    journal = Journal(config.journal_dir / "actions.jsonl")
    try:
        journal.read()
    except RecordError as exc:
        _set_aside(journal.path, exc, "its pending Slurm actions, if any, are not applied", clock)
    return journal


def restored_state(config: HealthdConfig, clock: Clock) -> engine.EngineState:
    """The engine state a starting healthd begins with: the Xid history that can still count, and each
    diagnostic level's last result (a pass newer than the drain still lets the node return)."""
    return engine.restore(_xid_history(config, clock), _diagnostics(config, clock))


def _diagnostics(config: HealthdConfig, clock: Clock) -> tuple[DiagnosticResult, ...]:
    try:
        return read_diagnostics(config.journal_dir)
    except RecordError as exc:  # start without them: a drained node waits for a new pass, never less
        _set_aside(diagnostics_path(config.journal_dir), exc, "drained nodes wait for a new diagnostic pass", clock)
        return ()


def _xid_history(config: HealthdConfig, clock: Clock) -> tuple[XidSighting, ...]:
    try:
        sightings = read_xid_history(config.journal_dir)
    except RecordError as exc:  # start without it: fewer repeats recognised, never more
        _set_aside(xid_history_path(config.journal_dir), exc, "earlier Xids do not count as repeats", clock)
        return ()
    kept = engine.history_to_keep(sightings, config.policy, clock.now())
    if len(kept) < len(sightings):  # the file holds only what can still count: it stays small
        rewrite_xid_history(config.journal_dir, kept)
    return kept


def _set_aside(path: Path, error: RecordError, consequence: str, clock: Clock) -> None:
    # A file from another healthd version would stop every later line from being read: keep it
    # for the admin under another name and start a new one.
    aside = path.with_name(f"{path.name}.unreadable-{int(clock.now())}")
    os.replace(path, aside)
    log.error("%s; moved it to %s and started a new one (%s)", error, aside, consequence)


class EngineShell:
    """Steps the engine with each input and carries out its effects (journal first, then hand over)."""

    def __init__(self, config: HealthdConfig, settings: engine.EngineSettings, state: engine.EngineState, *,
                 journal: Journal, applier: Applier, slurm: NodeSlurm, metrics: Metrics, clock: Clock,
                 boot_time: Callable[[], float],
                 run_diagnostic: Callable[[Level, DiagnosticSpec], None] = lambda level, spec: None) -> None:
        self.config, self.settings = config, settings
        """Both replaced whole on reload (`reconfigure`)."""
        self.state = state
        """The engine's state: replaced (never changed in place) by the main thread, read by the others."""
        self.journal, self.applier, self.slurm, self.metrics = journal, applier, slurm, metrics
        self.clock, self.boot_time = clock, boot_time
        self.run_diagnostic = run_diagnostic
        """Hands a diagnostic to the diagnostic thread (its result comes back as an input)."""
        self.gpu_count = 0
        """The GPUs the last periodic check counted."""

    def reconfigure(self, config: HealthdConfig, settings: engine.EngineSettings) -> None:
        """Decide with a reloaded configuration from the next input on."""
        self.config, self.settings = config, settings

    def handle(self, item: Observed | Applied | DiagnosticResult) -> None:
        """Step the engine with one input and carry out its effects (journal first, then hand over)."""
        now = self.clock.now()
        if isinstance(item, DiagnosticResult):
            try:
                append_diagnostic(self.config.journal_dir, item)
            except OSError as exc:
                log.error("diagnostic result not journaled in %s: %s", self.config.journal_dir, exc)
            self.state = engine.diagnosed(self.state, item)
            return
        if isinstance(item, Applied):
            outcome = engine.applied(self.state, item.action, item.decision, now,
                                     retry_after=self.applier.retry_after(item.decision), node=item.node,
                                     after_failure=self.settings.diagnostics.after_failure)
        else:
            if item.gpu_count is not None:
                self.gpu_count = item.gpu_count
            findings = tuple(self._with_jobs(f) if engine.needs_jobs(self.state, self.settings, f) else f
                             for f in item.findings)
            outcome = engine.step(self.state, self.settings, item.source, findings, now, node=item.node,
                                  node_at=item.node_at, boot_time=self.boot_time() if item.source == "periodic" else 0.0)
            for judged in outcome.judged:
                self.metrics.findings.labels(judged.finding.kind, judged.verdict.action.label).inc()
                if judged.finding.kind == "nvml-hang" and item.source != "periodic":
                    log.warning("%s", judged.finding.detail)
                if judged.verdict.action > Action.IGNORE:
                    log.info("finding %s gpu=%s via %s → %s (%s)", judged.finding.what, judged.finding.gpu,
                             item.source, judged.verdict.action.label, judged.verdict.reason)
        self.state = outcome.state
        for effect in outcome.effects:
            if isinstance(effect, engine.Remember):
                append_xid_sighting(self.config.journal_dir, effect.sighting)
            elif isinstance(effect, (engine.Drain, engine.Resume)):
                if isinstance(effect, engine.Resume) and self.state.return_note:
                    log.info("resuming %s: %s", self.settings.node, self.state.return_note)
                self.journal.plan(effect.planned)  # durable before anything is attempted
                self.applier.actions.put(effect.planned)
            elif isinstance(effect, engine.RunDiagnostic):
                self.run_diagnostic(effect.level, effect.spec)
            elif isinstance(effect, engine.RaiseAlert):
                self.metrics.breaker_open.set(1)
                log.error("breaker open: not draining %s: %s", self.settings.node, effect.alert.detail)

    def _with_jobs(self, finding: Finding) -> Finding:
        """Attribute an app-level Xid to the one job that owned its GPU (and that job's user), or "unknown"."""
        starts, problems = read_job_starts(self.config.journal_dir)
        for problem in problems:
            log.warning("job-start note not read: %s", problem)
        try:
            running: tuple[str, ...] | None = self.slurm.jobs_here()
        except SlurmCommandError:
            running = None
        owner = engine.owner_of_gpu(finding.gpu, starts, running)
        if owner is None:
            return replace(finding, job_ids=("unknown",), users=("",))
        return replace(finding, job_ids=(owner[0],), users=(owner[1],))
