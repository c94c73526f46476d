"""What healthd can observe (a finding's `kind`): one closed vocabulary for healthd's findings, its state
file and the epilog's job-health records.

The strings are what the records hold and what drain reasons and `healthd evidence` print; they
never change (a kind is only ever added).  Which action each calls for is healthd's policy
(healthd/policy.py).
"""

from __future__ import annotations

from typing import Literal, get_args

from clusterctl.records.versioned import RecordError

FindingKind = Literal[
    "xid",  # an Xid, from an NVML event or the kernel log
    "gpu-lost",  # NVML: GPU is lost (event, or every call on it)
    "gpu-missing",  # fewer GPUs enumerated than expected, or a job's GPU not enumerated
    "ecc-dbe",  # volatile uncorrectable ECC errors
    "remap-failure",
    "remap-uncorrectable",
    "remap-pending",
    "retired-pages",
    "retired-pending",
    "nvlink-down",
    "thermal",
    "thermal-sustained",
    "clock-events",
    "recovery-action",  # the driver's GPU recovery action (NVML field or event)
    "nvml-hang",
    "nvml-error",
    "nvml-unavailable",
    "host-memory",
    "host-disk",
    "host-disk-full",
    "host-readonly",
    "ib-port-down",  # an InfiniBand/RoCE port not ACTIVE/LinkUp (sysfs)
    "ib-port-slow",  # a port running below its expected rate
    "ib-errors",  # a port's error counters (symbol, receive, integrity) climbing faster than allowed
    "ib-link-flap",  # a port's link went down/retrained (link_downed, link_error_recovery) too often
    "pcie-degraded",  # a GPU's or NIC's PCIe link below its maximum width or generation
    "nvlink-errors",  # NVLink CRC/replay/recovery error counters climbing faster than allowed
    "storage-hung",  # a shared path's write/fsync/read/unlink probe did not finish by its deadline
    "storage-error",  # that probe failed
    "diagnostic-failed",  # an active diagnostic (dcgmi diag, the site's own command) said the node is bad
    "roce-retransmits",  # a RoCE port's hw_counters: packets lost on the path (ACK timeouts, NAK-sequence, ICRC)
]
FINDING_KINDS: tuple[FindingKind, ...] = get_args(FindingKind)
"""Every kind, in the order above."""


def finding_kind(value: str, where: str) -> FindingKind:
    """`value` as a kind of this vocabulary; RecordError naming `where` when it is not one."""
    for kind in FINDING_KINDS:
        if kind == value:
            return kind
    raise RecordError(where, f"unknown finding kind {value!r} (written by a newer healthd?)")
