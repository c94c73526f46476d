"""The driver's own GPU recovery action (an NVML field, or event): it overrides the Xid table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from clusterctl.healthd.checks.family import CheckFamily, gpu_finding
from clusterctl.healthd.findings import Action, Finding

if TYPE_CHECKING:
    from clusterctl.healthd.checks.sustained import Sustained
    from clusterctl.healthd.gpu_sample import GpuSample

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvmlDeviceGpuRecoveryAction_t).
RECOVERY_ACTIONS: Mapping[int, tuple[Action, str]] = {
    0: (Action.IGNORE, "driver: no action needed"),
    1: (Action.DRAIN_RESET, "driver asks for a GPU reset"),
    2: (Action.DRAIN_REBOOT, "driver asks for a node reboot"),
    3: (Action.DRAIN_RESET, "driver asks to drain peer-to-peer traffic"),
    4: (Action.DRAIN_RESET, "driver asks to drain P2P and reset"),
    5: (Action.DRAIN_RESET, "driver asks to recover the IMEX domain"),
    6: (Action.DRAIN_REBOOT, "driver asks for a PCIe bus reset"),
    7: (Action.DRAIN_REBOOT, "driver asks for a system reboot"),
}


def check(sample: GpuSample, limits: Any, sustained: Sustained, now: float) -> list[Finding]:
    """A recovery action the driver asks for (0, none, is no finding)."""
    return [gpu_finding(sample, now, "recovery-action", sample.recovery_action)] if sample.recovery_action else []


def recovery_verdict(code: int) -> tuple[Action, str]:
    """What the driver's recovery action `code` calls for, and why."""
    return RECOVERY_ACTIONS.get(code, (Action.WARN, f"driver recovery action {code} (unknown)"))


FAMILY = CheckFamily("recovery", ("recovery-action",), (), check)
