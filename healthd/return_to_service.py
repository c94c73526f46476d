"""May a node healthd drained go back to service? (pure: the one place that decides it)

healthd's engine asks once its periodic checks have been clean `clean_checks` times in a row and the
drain's evidence rule allows it (engine.resume_allowed).  With a `before_return` diagnostic configured,
clean counters are not enough: a GPU that fails under load passes every counter and fails the next job.
The node returns only on a pass of that diagnostic that finished after the drain; until then it stays
drained and says why.  Without one configured the clean checks decide alone (as before).
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.clock import utc
from clusterctl.healthd.diagnostics import DiagnosticResult, DiagnosticSpec

DIAGNOSTIC_RETRY_S = 3600.0
"""A before_return diagnostic that did not pass is run again after this long, or at once after a reboot
(a repair): an admin's fix is noticed without running a quarter-hour r3 back to back on a broken GPU."""


@dataclass(frozen=True)
class ReturnFacts:
    """What the decision looks at."""

    drained_at: float
    """When healthd's drain was set (its reason's timestamp)."""
    diagnostic: DiagnosticSpec | None
    """The before_return diagnostic configured (None: none)."""
    last: DiagnosticResult | None = None
    """The last before_return result on record (any age)."""
    running: bool = False
    """A before_return run is under way."""
    now: float = 0.0
    boot_time: float = 0.0
    retry_after: float = DIAGNOSTIC_RETRY_S


@dataclass(frozen=True)
class ReturnDecision:
    """Resume now, or not; whether to start the diagnostic now; what the status says."""

    resume: bool
    run_diagnostic: bool = False
    why: str = ""


def return_decision(facts: ReturnFacts) -> ReturnDecision:
    """The decision for a drained node whose checks are clean.

    Resumed only with no diagnostic configured, or with a pass finished after the drain.  A failed,
    timed-out or unrunnable one newer than the drain keeps the node drained ("diagnostic X failed: ...")
    and is tried again after `retry_after` or once the node rebooted since; none yet asks for a run
    ("waiting for diagnostic X")."""
    spec = facts.diagnostic
    if spec is None:
        return ReturnDecision(True)
    last = facts.last if facts.last is not None and facts.last.at > facts.drained_at else None
    if last is not None and last.passed:
        return ReturnDecision(True, why=f"diagnostic {last.name} passed at {utc(last.at)}")
    if facts.running:
        return ReturnDecision(False, why=f"waiting for diagnostic {spec.name} (running)")
    if last is None:
        return ReturnDecision(False, True, f"waiting for diagnostic {spec.name}")
    again = facts.boot_time > last.at or facts.now - last.at >= facts.retry_after
    said = f"diagnostic {last.name} {'failed' if last.outcome == 'fail' else last.outcome}: {last.summary or '-'}"
    if again:
        return ReturnDecision(False, True, f"{said}; running it again")
    return ReturnDecision(False, why=f"{said}; next try after {utc(last.at + facts.retry_after)} or a reboot")
