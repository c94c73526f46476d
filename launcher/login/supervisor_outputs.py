"""What the supervisor tells: its live lines (each decision, each blamed node and its evidence, damaged
journal lines once), the snapshot a terminal shows each poll, the run's end in its journal, and the
notifications (`blame`, `done`, `stopped`) sent through its hooks."""

from __future__ import annotations

from clusterctl.launcher.login.supervisor_doors import Hooks, WatchSnapshot
from clusterctl.launcher.pure.classify import Outcome
from clusterctl.launcher.pure.restart_policy import AttemptState, RunState
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.records.run_journal import Decided, DecisionAction, EventKind, RunEnded, RunJournal
from clusterctl.slurm.jobs import JobReport


class SupervisorOutputs:
    """The supervisor's live output, its notifications and the run's end event."""

    def __init__(self, run: RunDir, spec: JobSpec, hooks: Hooks) -> None:
        self.run, self.spec, self.hooks = run, spec, hooks
        self._damaged_lines_said: set[int] = set()

    def warn_damaged(self, journal: RunJournal) -> None:
        """Say each damaged journal line once (the replay skips it: what it held is not acted on)."""
        for damage in journal.damaged:
            if damage.line not in self._damaged_lines_said:
                self._damaged_lines_said.add(damage.line)
                self.hooks.say(f"warning: {self.run.journal_path}: {damage.warning}")

    def decided(self, decided: Decided, outcome: Outcome) -> None:
        """Say what was decided of an attempt (journaled already) and whom it blames; notify the blame."""
        self.hooks.say(f"attempt {decided.attempt} (job {decided.job_id}) ended "
                       f"{decided.state}: {outcome.kind}: {decided.message}"
                       + (f"; next attempt in {decided.delay:.1f} s" if decided.action == DecisionAction.RESUBMIT
                          else ""))
        for b in outcome.blame:
            self.hooks.say(f"  blamed {b.node} for {self.spec.restart.blame_hours:g} h: {b.reason}")
            for line in b.evidence:
                self.hooks.say(f"    {line}")
        if decided.blame:
            self.hooks.notify("blame", {"run": str(self.run.path), "attempt": decided.attempt,
                                        "blame": [b.to_json() for b in decided.blame]})

    def end(self, kind: EventKind, message: str) -> None:
        """Journal the run's end and notify it."""
        self.run.record(RunEnded(kind=kind, at=self.run.now(), message=message))
        self.hooks.notify(kind.value, {"run": str(self.run.path), "message": message})

    def show(self, attempt: AttemptState, state: RunState, report: JobReport | None) -> None:
        """Show the attempt as this poll saw it (`Hooks.show`)."""
        now = self.hooks.clock()
        self.hooks.show(WatchSnapshot(attempt.number, attempt.job_id, report.state if report else "?",
                                      report.nodes if report else "",
                                      tuple((n, r) for n, (u, r) in state.blamed.items() if u > now),
                                      state.budget.best_step))
