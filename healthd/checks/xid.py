"""Xids (from an NVML event or the kernel log): NVIDIA's catalog as data.

Derived from NVIDIA's Xid catalog and what DCGM, NVSentinel, gcm and Azure's checks converge on
(shared/notes/xid-policy.md).  Sympathetic Xids (8, 45) never count; app-level Xids drain only when
the same GPU repeats them across different jobs (healthd/policy.py judges the repeats); unknown Xids
warn unless promoted by configuration.
"""

from __future__ import annotations

from clusterctl.healthd.checks.family import CheckFamily
from clusterctl.healthd.findings import Action

# (xids, action, meaning) — the catalog rows, as data.
XID_TABLE: tuple[tuple[tuple[int, ...], Action, str], ...] = (
    ((8, 45), Action.IGNORE, "sympathetic / teardown after another error; never counted"),
    ((13, 31, 43, 68, 69, 137), Action.APP_FAULT, "application fault (bad kernel, page fault)"),
    ((63,), Action.RESET_AT_IDLE, "row remap recorded; reset when idle if a remap is pending"),
    ((92, 121), Action.WARN, "high corrected ECC / C2C rate; track the rate"),
    ((94,), Action.APP_FAULT, "contained ECC error, one application killed; reset when convenient"),
    ((48, 95, 140), Action.DRAIN_RESET, "uncontained / double-bit ECC error"),
    ((46, 62, 109, 110, 119, 120, 136, 143, 155, 158), Action.DRAIN_RESET, "GPU stopped / GSP / timeout"),
    ((64,), Action.DRAIN_RMA, "row remapping failed: memory can no longer be repaired"),
    ((74, 144, 145, 146, 147, 148, 149, 150), Action.DRAIN_RESET, "NVLink error"),
    ((79,), Action.DRAIN_REBOOT, "GPU has fallen off the bus"),
    ((154,), Action.DRAIN_RESET, "driver's recovery action pending (see recovery-action)"),
)

FAMILY = CheckFamily("xid", ("xid",))
