"""Active diagnostics' verdicts as findings: the prolog's pre-flight (healthd/diagnostics.py reads the
output, healthd/diagnostic_runner.py runs it).

Only a diagnostic that ran and said "fail" is a finding: one that could not be run, whose output could
not be read, or that was cut short by the prolog's budget says nothing about this node (a missing DCGM
host engine looks the same on every node at once) and lets the job in, said in slurmd's log.
"""

from __future__ import annotations

from clusterctl.healthd.checks.family import CheckFamily, Condition
from clusterctl.healthd.findings import Action

FAMILY = CheckFamily("diagnostic", ("diagnostic-failed",), (
    Condition("diagnostic-failed", Action.DRAIN_RESET, "an active diagnostic (dcgmi diag, or the site's own "
                                                       "command) failed: the GPU fails under load",
              evidence_in_reason=True),
))
