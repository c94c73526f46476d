"""NVML itself: a call that hangs or fails, or NVML that cannot be loaded (healthd/nvml.py reports them)."""

from __future__ import annotations

from clusterctl.healthd.checks.family import CheckFamily, Condition
from clusterctl.healthd.findings import Action

FAMILY = CheckFamily("nvml", ("nvml-hang", "nvml-error", "nvml-unavailable"), (
    Condition("nvml-hang", Action.WARN, "an NVML call hung (driver trouble)"),
    Condition("nvml-error", Action.WARN, "NVML returned an unexpected error"),
    Condition("nvml-unavailable", Action.WARN, "NVML cannot be loaded or initialised: the GPUs cannot be judged",
              shown_before="host-readonly"),
))
