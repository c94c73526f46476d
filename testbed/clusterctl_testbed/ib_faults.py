"""A testbed node's emulated InfiniBand sysfs tree, and the network faults injected into it.

healthd reads `<ib_root>/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,counters/*}` and
`<dev>/device/{current,max}_link_{width,speed}`: the kernel's own layout, so the same reader runs on a
real node (ib_root "/") and on the testbed (ib_root `nvml/<node>/sysroot`).  `build_tree` writes a
healthy node (eight NDR ports, one per GPU, as on a DGX H100); `inject_ib` changes it as a fault would.
Every file is replaced by temp file + rename, so a reader never sees half a value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

IB_FAULT_KINDS = ("ib-port-down", "ib-rate-halved", "ib-symbol-errors", "ib-link-flap", "nic-pcie-degraded",
                  "ib-clear")
"""What `inject_ib` can do (the testbed's `inject` verb takes them like the GPU faults)."""

SYSFS_IB = "sys/class/infiniband"
COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors", "link_error_recovery", "local_link_integrity_errors",
            "excessive_buffer_overrun_errors", "port_xmit_discards", "port_rcv_data", "port_xmit_data")
HEALTHY_RATE = "400 Gb/sec (4X NDR)"
HEALTHY_PORT = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": HEALTHY_RATE, "link_layer": "InfiniBand"}
HEALTHY_LINK = {"current_link_width": "16", "max_link_width": "16", "current_link_speed": "32.0 GT/s PCIe",
                "max_link_speed": "32.0 GT/s PCIe"}
SYMBOL_ERROR_BURST = 1000
"""Symbol errors one `ib-symbol-errors` fault adds (far above a minute's allowance)."""


@dataclass(frozen=True)
class IbFault:
    """One injected network fault on port `port` of device `device` (`mlx5_<nic>`); `value`: a count or width."""

    kind: str
    nic: int = 0
    port: int = 1
    value: int = 0

    @property
    def device(self) -> str:
        return f"mlx5_{self.nic}"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def _port_dir(root: Path, device: str, port: int) -> Path:
    return root / SYSFS_IB / device / "ports" / str(port)


def write_healthy_port(root: Path, device: str, port: int = 1) -> None:
    """One ACTIVE/LinkUp NDR port with every counter at 0, and its device's x16 Gen5 PCIe link."""
    port_dir = _port_dir(root, device, port)
    for name, text in HEALTHY_PORT.items():
        _write(port_dir / name, text)
    for counter in COUNTERS:
        _write(port_dir / "counters" / counter, "0")
    for name, text in HEALTHY_LINK.items():
        _write(root / SYSFS_IB / device / "device" / name, text)


def build_tree(root: Path, nics: int = 8) -> list[str]:
    """A healthy tree of `nics` single-port devices `mlx5_0`..; the device names."""
    devices = [f"mlx5_{i}" for i in range(nics)]
    for device in devices:
        write_healthy_port(root, device)
    return devices


def _add(path: Path, amount: int) -> None:
    current = int(path.read_text().split()[0]) if path.exists() else 0
    _write(path, str(current + amount))


def inject_ib(root: Path, fault: IbFault) -> None:
    """Change the tree under `root` as `fault` would; ValueError for an unknown kind or a device not there."""
    if fault.kind not in IB_FAULT_KINDS:
        raise ValueError(f"unknown network fault {fault.kind!r}; known: {', '.join(IB_FAULT_KINDS)}")
    port_dir = _port_dir(root, fault.device, fault.port)
    if not port_dir.is_dir():
        raise ValueError(f"no port {fault.port} of {fault.device} under {root / SYSFS_IB}")
    match fault.kind:
        case "ib-port-down":
            _write(port_dir / "state", "1: DOWN")
            _write(port_dir / "phys_state", "3: Disabled")
            _add(port_dir / "counters" / "link_downed", 1)
        case "ib-rate-halved":
            _write(port_dir / "rate", "200 Gb/sec (2X NDR)")
        case "ib-symbol-errors":
            _add(port_dir / "counters" / "symbol_error", fault.value or SYMBOL_ERROR_BURST)
        case "ib-link-flap":
            # Down and back up between two reads: only the counters say it happened.
            _add(port_dir / "counters" / "link_downed", fault.value or 1)
            _add(port_dir / "counters" / "link_error_recovery", fault.value or 1)
        case "nic-pcie-degraded":
            _write(root / SYSFS_IB / fault.device / "device" / "current_link_width", str(fault.value or 8))
        case "ib-clear":
            # Healthy again; counters keep their totals (a real port's do, until an admin resets them).
            for name, text in HEALTHY_PORT.items():
                _write(port_dir / name, text)
            for name, text in HEALTHY_LINK.items():
                _write(root / SYSFS_IB / fault.device / "device" / name, text)
