"""A testbed node's emulated InfiniBand sysfs tree, and the network faults injected into it.

healthd reads `<ib_root>/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,counters/*}` and
`<dev>/device/{current,max}_link_{width,speed}`: the kernel's own layout, so the same reader runs on a
real node (ib_root "/") and on the testbed (ib_root `nvml/<node>/sysroot`).  `build_tree` writes a
healthy node (eight NDR ports, one per GPU, as on a DGX H100); `inject_ib` changes it as a fault would.
Every file is replaced by temp file + rename, so a reader never sees half a value.

With `link_layer="Ethernet"` the ports are RoCE ports as an mlx5 NIC shows them: their `counters/` hold
zeros, the transport's counters are in `ports/<n>/hw_counters/` (mlx5's names, congestion and
application counters included) and the link's in the netdev's `sys/class/net/<if>/statistics/`, the
netdev named by the port's `gid_attrs/ndevs/0`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

IB_FAULT_KINDS = ("ib-port-down", "ib-rate-halved", "ib-symbol-errors", "ib-link-flap", "nic-pcie-degraded",
                  "roce-retransmits", "roce-fcs-errors", "roce-congestion", "ib-clear")
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
INFINIBAND, ETHERNET = "InfiniBand", "Ethernet"
SYSFS_NET = "sys/class/net"
HW_COUNTERS = ("duplicate_request", "implied_nak_seq_err", "local_ack_timeout_err", "np_cnp_sent",
               "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
               "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request",
               "req_transport_retries_exceeded", "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
               "resp_remote_access_errors", "rnr_nak_retry_err", "rp_cnp_handled", "rp_cnp_ignored",
               "rx_atomic_requests", "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests")
"""An mlx5 RoCE port's `hw_counters` (Linux drivers/infiniband/hw/mlx5/counters.c), all 0 when healthy."""
NETDEV_COUNTERS = ("rx_crc_errors", "rx_errors", "rx_frame_errors", "rx_bytes", "tx_bytes")
RETRANSMIT_BURST = 10
"""ACK timeouts one `roce-retransmits` fault adds, with 30 times as many NAK-sequence errors."""
CNP_BURST = 100_000
"""Congestion notifications one `roce-congestion` fault adds (a busy, healthy fabric)."""


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


def netdev_of(device: str) -> str:
    """The netdev the testbed gives RoCE device `mlx5_<N>`: `eth<N>`."""
    return "eth" + device.removeprefix("mlx5_")


def write_healthy_port(root: Path, device: str, port: int = 1, link_layer: str = INFINIBAND) -> None:
    """One ACTIVE/LinkUp NDR port with every counter at 0, and its device's x16 Gen5 PCIe link; a RoCE port
    (`link_layer` "Ethernet") also its `hw_counters` and its netdev's statistics."""
    if link_layer not in (INFINIBAND, ETHERNET):
        raise ValueError(f"link layer {link_layer!r}: one of {INFINIBAND}, {ETHERNET}")
    port_dir = _port_dir(root, device, port)
    for name, text in {**HEALTHY_PORT, "link_layer": link_layer}.items():
        _write(port_dir / name, text)
    for counter in COUNTERS:
        _write(port_dir / "counters" / counter, "0")
    if link_layer == ETHERNET:
        for counter in HW_COUNTERS:
            _write(port_dir / "hw_counters" / counter, "0")
        _write(port_dir / "hw_counters" / "lifespan", "10")
        _write(port_dir / "gid_attrs" / "ndevs" / "0", netdev_of(device))
        for counter in NETDEV_COUNTERS:
            _write(root / SYSFS_NET / netdev_of(device) / "statistics" / counter, "0")
    for name, text in HEALTHY_LINK.items():
        _write(root / SYSFS_IB / device / "device" / name, text)


def build_tree(root: Path, nics: int = 8, link_layer: str = INFINIBAND) -> list[str]:
    """A healthy tree of `nics` single-port devices `mlx5_0`.. (RoCE ones with `link_layer` "Ethernet");
    the device names."""
    devices = [f"mlx5_{i}" for i in range(nics)]
    for device in devices:
        write_healthy_port(root, device, link_layer=link_layer)
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
    if fault.kind.startswith("roce-") and not (port_dir / "hw_counters").is_dir():
        raise ValueError(f"{fault.device}/{fault.port} is not a RoCE port: {fault.kind} needs one "
                         "(a tree built with link_layer Ethernet)")
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
        case "roce-retransmits":
            # Packets lost on the path: the requester's ACK timer expires, the responder NAKs the gaps.
            timeouts = fault.value or RETRANSMIT_BURST
            _add(port_dir / "hw_counters" / "local_ack_timeout_err", timeouts)
            _add(port_dir / "hw_counters" / "packet_seq_err", 30 * timeouts)
            _add(port_dir / "hw_counters" / "out_of_sequence", 30 * timeouts)
            _add(port_dir / "hw_counters" / "duplicate_request", timeouts)
        case "roce-fcs-errors":
            statistics = root / SYSFS_NET / netdev_of(fault.device) / "statistics"
            _add(statistics / "rx_crc_errors", fault.value or SYMBOL_ERROR_BURST)
            _add(statistics / "rx_errors", fault.value or SYMBOL_ERROR_BURST)
        case "roce-congestion":
            # DCQCN at work: ECN-marked packets answered with CNPs, the sender slowing down. Not a fault.
            cnps = fault.value or CNP_BURST
            for counter in ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled"):
                _add(port_dir / "hw_counters" / counter, cnps)
        case "nic-pcie-degraded":
            _write(root / SYSFS_IB / fault.device / "device" / "current_link_width", str(fault.value or 8))
        case "ib-clear":
            # Healthy again; counters keep their totals (a real port's do, until an admin resets them).
            for name, text in HEALTHY_PORT.items():
                _write(port_dir / name, text)
            for name, text in HEALTHY_LINK.items():
                _write(root / SYSFS_IB / fault.device / "device" / name, text)
