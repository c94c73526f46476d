"""Faults injected into a testbed node's emulated GPUs.

The emulated libnvidia-ml.so.1 reads `nvml/<node>/state` (key=value) and the
append-only `nvml/<node>/events`; the node's kernel log stand-in is
`nvml/<node>/kmsg` in /dev/kmsg record format.  `apply_fault` is pure: it turns a
fault into the new state and the lines to append.  `inject` writes them: state by
temp file + rename (in-place rewrites gave torn reads), events with one write()
per line.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

FAULT_KINDS = (
    "xid", "kmsg-xid", "ecc-dbe", "ecc-sbe", "remap-pending", "remap-failure", "retired-pages",
    "gpu-lost", "gpu-missing", "temp", "throttle", "nvlink-down", "nvlink-errors", "pcie-degraded",
    "recovery-action", "nvml-hang", "clear",
)
NVLINK_ERROR_BURST = 1000
"""CRC flit errors and replays one `nvlink-errors` fault adds to its link (far above a minute's allowance)."""
THERMAL_SLOWDOWN = 0x40 | 0x20  # nvmlClocksEventReasonHwThermalSlowdown | ...SwThermalSlowdown
DEFAULT_SM_CLOCK_MAX = 1980  # MHz, the emulated library's default (an H100 SXM)

# Bus numbers of the emulated GPUs (the same table as nvml_emu.c: a DGX H100's eight GPUs).
PCI_BUS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass(frozen=True)
class Fault:
    """One injected fault. `value` is the Xid number, a count, a temperature, an action..."""

    kind: str
    gpu: int = 0
    value: int = 0
    function: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class FaultEffect:
    state: dict[str, str]
    events: list[str] = field(default_factory=list)
    kernel_messages: list[str] = field(default_factory=list)


def pci_bus_id(gpu: int) -> str:
    """The GPU's PCI address as the kernel log prints it (`0000:5d:00`)."""
    bus = PCI_BUS[gpu] if gpu < len(PCI_BUS) else 0xE0 + gpu
    return f"0000:{bus:02x}:00"


def _add(state: dict[str, str], key: str, amount: int) -> None:
    state[key] = str(int(state.get(key, "0")) + amount)


def apply_fault(state: dict[str, str], fault: Fault, *, now: float) -> FaultEffect:
    """The node's GPU state after `fault`, plus the events and kernel messages it produces (`now`: the
    machine's monotonic clock, from which an injected hang's deadline is counted)."""
    if fault.kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault {fault.kind!r}; known: {', '.join(FAULT_KINDS)}")
    new = dict(state)
    gpu = f"gpu.{fault.gpu}"
    events: list[str] = []
    kmsg: list[str] = []
    match fault.kind:
        case "xid":
            events.append(f"{fault.gpu} xid {fault.value}")
            text = "GPU has fallen off the bus." if fault.value == 79 else "injected by clusterctl-testbed"
            kmsg.append(f"NVRM: Xid (PCI:{pci_bus_id(fault.gpu)}): {fault.value}, pid=1, {text}")
            if fault.value == 79:
                # Xid 79 means the GPU fell off the bus: every later NVML call on it fails.
                new[f"{gpu}.lost"] = "1"
        case "kmsg-xid":
            # Only the kernel log line: the path a daemon must catch when NVML delivers no event.
            kmsg.append(f"NVRM: Xid (PCI:{pci_bus_id(fault.gpu)}): {fault.value}, pid=1, injected by clusterctl-testbed")
        case "ecc-dbe":
            _add(new, f"{gpu}.ecc.volatile.dbe", max(fault.value, 1))
            _add(new, f"{gpu}.ecc.aggregate.dbe", max(fault.value, 1))
            events.append(f"{fault.gpu} dbe")
            kmsg.append(f"NVRM: Xid (PCI:{pci_bus_id(fault.gpu)}): 48, pid=1, An uncorrectable double bit error")
        case "ecc-sbe":
            _add(new, f"{gpu}.ecc.volatile.sbe", max(fault.value, 1))
            _add(new, f"{gpu}.ecc.aggregate.sbe", max(fault.value, 1))
            events.append(f"{fault.gpu} sbe")
        case "remap-pending":
            new[f"{gpu}.remap.pending"] = "1"
            _add(new, f"{gpu}.remap.unc", 1)
            kmsg.append(f"NVRM: Xid (PCI:{pci_bus_id(fault.gpu)}): 63, pid=1, Row Remapper: New row marked")
        case "remap-failure":
            new[f"{gpu}.remap.failure"] = "1"
            kmsg.append(f"NVRM: Xid (PCI:{pci_bus_id(fault.gpu)}): 64, pid=1, Row Remapper: Failed")
        case "retired-pages":
            _add(new, f"{gpu}.retired.dbe", max(fault.value, 1))
            new[f"{gpu}.retired.pending"] = "1"
        case "gpu-lost":
            new[f"{gpu}.lost"] = "1"
        case "gpu-missing":
            new["gpus"] = str(fault.value)
        case "temp":
            new[f"{gpu}.temp"] = str(fault.value)
        case "throttle":
            # A thermal slowdown: the GPU keeps `value` percent of its maximum SM clock (0: half);
            # 100 ends it.  The example trainer computes that much slower on it.
            percent = fault.value or 50
            if not 1 <= percent <= 100:
                raise ValueError(f"throttle: value {fault.value} is not a percentage of the SM clock (1-100)")
            if percent == 100:
                new.pop(f"{gpu}.clocks_event_reasons", None)
                new.pop(f"{gpu}.clocks.sm", None)
            else:
                top = int(new.get(f"{gpu}.clocks.sm.max", DEFAULT_SM_CLOCK_MAX))
                new[f"{gpu}.clocks_event_reasons"] = hex(THERMAL_SLOWDOWN)
                new[f"{gpu}.clocks.sm"] = str(max(1, top * percent // 100))
        case "nvlink-down":
            mask = int(new.get(f"{gpu}.nvlink.down", "0"), 0) | (1 << fault.value)
            new[f"{gpu}.nvlink.down"] = hex(mask)
        case "nvlink-errors":
            # A marginal link: CRC flit errors and the replays they cause (value: the link).
            _add(new, f"{gpu}.nvlink.{fault.value}.crc", NVLINK_ERROR_BURST)
            _add(new, f"{gpu}.nvlink.{fault.value}.replay", NVLINK_ERROR_BURST)
        case "pcie-degraded":
            # The GPU's PCIe link trained at `value` lanes (0: x8) of its x16; 16 ends it.
            width = fault.value or 8
            if not 1 <= width <= 16:
                raise ValueError(f"pcie-degraded: width {fault.value} is not a PCIe link width (1-16)")
            new[f"{gpu}.pcie.width"] = str(width)
        case "recovery-action":
            new[f"{gpu}.recovery_action"] = str(fault.value)
            events.append(f"{fault.gpu} recovery {fault.value}")
        case "nvml-hang":
            new[f"hang.{fault.function}"] = f"{now + fault.seconds:.3f}"
        case "clear":
            new = {}
    return FaultEffect(new, events, kmsg)


def parse_state(text: str) -> dict[str, str]:
    """Read a state file's key=value lines (comments and blank lines ignored)."""
    state = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            state[key.strip()] = value.strip()
    return state


def render_state(state: dict[str, str]) -> str:
    """Write a state dict as the emulated library's key=value file (sorted, deterministic)."""
    return "".join(f"{key}={state[key]}\n" for key in sorted(state))


def inject(node_dir: Path, fault: Fault) -> FaultEffect:
    """Apply `fault` to the node whose emulated-GPU files live in `node_dir`."""
    state_file = node_dir / "state"
    current = parse_state(state_file.read_text()) if state_file.exists() else {}
    # The machine's monotonic clock, as the emulated driver reads a hang's deadline (see nvml_emu.c).
    effect = apply_fault(current, fault, now=time.monotonic())
    # Events first: an injected Xid 79 is delivered as an event before the GPU reads as lost
    # (the `gpu-lost` fault covers the other order, GpuIsLost with no event).
    _append_lines(node_dir / "events", effect.events)
    if effect.kernel_messages:
        _append_kmsg(node_dir / "kmsg", effect.kernel_messages)
    tmp = node_dir / f".state.{os.getpid()}"
    tmp.write_text(render_state(effect.state))
    os.replace(tmp, state_file)
    return effect


def _append_lines(path: Path, lines: list[str]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for line in lines:
            os.write(fd, (line + "\n").encode())  # one write() per line: readers never see half a line
    finally:
        os.close(fd)


def _append_kmsg(path: Path, messages: list[str]) -> None:
    # /dev/kmsg records: "<priority>,<sequence>,<microseconds>,<flags>;<text>"
    sequence = sum(1 for _ in path.open()) if path.exists() else 0
    usec = int(time.monotonic() * 1_000_000)
    _append_lines(path, [f"3,{sequence + i},{usec},-;{m}" for i, m in enumerate(messages)])
