"""`clusterctl-testbed`: a real multi-host Slurm cluster with emulated GPUs on this machine."""

from __future__ import annotations

import json
import os
import sys

import click

from clusterctl_testbed.cluster import Testbed
from clusterctl_testbed.compose_cli import compose, inject_network_fault, network_fault
from clusterctl_testbed.gpu_faults import FAULT_KINDS, Fault, inject
from clusterctl_testbed.dcgmi_emu import DiagFault, inject_diag
from clusterctl_testbed.ib_faults import IB_FAULT_KINDS
from clusterctl_testbed.layout import Layout
from clusterctl_testbed.rootfs import BUILD_MINUTES_HERE
from clusterctl_testbed.slurm_config import TIMEOUTS, TOPOLOGIES
from clusterctl_testbed.system import TestbedError
from clusterctl_testbed.slurm_source import ENV as SLURM_SOURCE_ENV
from clusterctl_testbed.slurm_source import SCHEDMD_URL
from clusterctl_testbed.versions import DEFAULT, RELEASES

SLURM_HELP = ("Which Slurm: " + "; ".join(r.describe() for r in RELEASES.values()) + ". A root filesystem "
              "is built with mmdebstrap on first use and cached; building Slurm from source takes about "
              f"{BUILD_MINUTES_HERE} min on 2 cores, once.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Run a real Slurm cluster (slurmctld, slurmdbd, 4 slurmd hosts with 8 emulated GPUs each,
    two leaf switches under a spine) in network/UTS/mount namespaces on this machine.

    Needs root. The controller `ctl` doubles as the login node: run Slurm commands there
    with `clusterctl-testbed on ctl sinfo`.  State lives in $CLUSTERCTL_TESTBED_DIR (/tmp/ctb).
    """


@cli.command()
def install() -> None:
    """Install the Debian packages the testbed needs (Slurm, munge, MariaDB, iproute2, gcc)."""
    from clusterctl_testbed.cluster import install_packages

    install_packages()


@cli.command()
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for nodes to be idle.")
@click.option("--slurm", type=click.Choice(list(RELEASES)), default=DEFAULT, show_default=True, help=SLURM_HELP)
@click.option("--slurm-source", metavar="PATH|URL", envvar=SLURM_SOURCE_ENV, show_envvar=True,
              help="SchedMD's source for a release built from it, the first time: a clone (or bare mirror) of "
                   f"{SCHEDMD_URL}, a release tarball, or a git URL. Default: fetch the release's tag from "
                   "that repository (needs a network).")
@click.option("--topology", type=click.Choice(TOPOLOGIES), default="tree", show_default=True,
              help="Slurm's topology plugin: tree (two leaf switches under a spine) or block (each leaf a "
                   "block, for --segment; Slurm 23.11 or newer).")
@click.option("--timeouts", type=click.Choice(list(TIMEOUTS)), default="fast", show_default=True,
              help="Slurm's node and kill timeouts: fast (SlurmdTimeout=5, MessageTimeout=2, KillWait=5: a dead "
                   "node is DOWN in ~10 s, for quick tests) or production (Slurm's defaults 300/10/30, what a real "
                   "cluster runs: a dead node is DOWN only after ~5 minutes).")
@click.option("--nics", type=click.Choice(["infiniband", "roce"]), default="infiniband", show_default=True,
              help="Each node's emulated NICs: InfiniBand ports, or RoCE ports (link_layer Ethernet, with mlx5's "
                   "hw_counters and a netdev's statistics: what the roce-* faults change).")
def up(timeout: float, slurm: str, slurm_source: str | None, topology: str, timeouts: str, nics: str) -> None:
    """Start the cluster (fresh state, job ids from 1); no-op if it is already up."""
    layout = Layout(topology=topology, timeouts=timeouts, nic_link_layer="Ethernet" if nics == "roce" else "InfiniBand")
    Testbed(layout).up(timeout=timeout, slurm=slurm, slurm_source=slurm_source)


@cli.command()
def down() -> None:
    """Stop every process the testbed started and remove its namespaces."""
    Testbed().down()


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Daemons (alive or not) and node states."""
    info = Testbed().status()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"testbed at {info['root']}: {'up' if info['up'] else 'down'}")
    slurm = info["slurm"]
    where = f"root filesystem {slurm['rootfs']}" if slurm["rootfs"] else "this machine's packages"  # type: ignore[index]
    click.echo(f"  Slurm {slurm['release']}: {slurm['version'] or 'version unknown'} ({where}), "  # type: ignore[index]
               f"topology/{slurm.get('topology', 'tree')}, "  # type: ignore[union-attr]
               f"{slurm.get('timeouts', 'fast')} timeouts")  # type: ignore[union-attr]
    for name, d in info["daemons"].items():  # type: ignore[union-attr]
        click.echo(f"  {name:16} pid {d['pid']:<8} {'alive' if d['alive'] else 'dead'}")
    for n in info["nodes"]:  # type: ignore[union-attr]
        click.echo(f"  {n['name']:8} {n['state']:10} {n['gres']:10} {n['reason']}")
    sys.exit(0 if info["up"] else 3)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("host")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def on(host: str, command: tuple[str, ...]) -> None:
    """Run COMMAND on HOST (ctl, node1, ...), in the current directory; exits with its status."""
    tb = Testbed()
    argv = tb.enter(host, cwd=os.getcwd()) + list(command)
    os.execvpe(argv[0], argv, tb.host_env())


@cli.command()
@click.argument("host", default="ctl")
def shell(host: str) -> None:
    """An interactive shell on HOST (default: the login/controller host)."""
    tb = Testbed()
    argv = tb.enter(host, cwd=os.getcwd()) + [os.environ.get("SHELL", "/bin/bash")]
    os.execvpe(argv[0], argv, tb.host_env())


@cli.command("kill-node")
@click.argument("node")
def kill_node(node: str) -> None:
    """Power NODE off: kill every process in its namespaces."""
    Testbed().kill_node(node)


@cli.command("boot-node")
@click.argument("node")
def boot_node(node: str) -> None:
    """Power a killed NODE back on (new host, new slurmd)."""
    Testbed().boot_node(node)


@cli.command("cut-link")
@click.argument("node")
def cut_link(node: str) -> None:
    """Cut NODE's network link; its processes keep running."""
    Testbed().cut_link(node)


@cli.command("heal-link")
@click.argument("node")
def heal_link(node: str) -> None:
    """Restore NODE's network link."""
    Testbed().heal_link(node)


@cli.command("restart-slurmd")
@click.argument("node")
def restart_slurmd(node: str) -> None:
    """Restart slurmd on NODE (running job processes survive, as with a real daemon restart)."""
    Testbed().restart_slurmd(node)


@cli.command("stop")
@click.argument("daemon")
def stop(daemon: str) -> None:
    """Stop one DAEMON by name: slurmctld, slurmdbd, healthd:node3, slurmd:node1..."""
    Testbed().stop_daemon(daemon)


@cli.command("start")
@click.argument("daemon")
def start(daemon: str) -> None:
    """Start DAEMON again: slurmctld or healthd:NODE."""
    tb = Testbed()
    if daemon == "slurmctld":
        tb.start_controller()
    elif daemon.startswith("healthd:"):
        tb.start_healthd(daemon.split(":", 1)[1])
    else:
        raise click.BadParameter("one of slurmctld, healthd:NODE", param_hint="DAEMON")


FAULT_HELP = """Inject a GPU fault on NODE, seen through NVML by everything running there.

\b
KIND and ARGS:
  xid N            an Xid event (79 also makes the GPU lost, as on real hardware)
  kmsg-xid N       only the kernel log line of an Xid (no NVML event)
  ecc-dbe          a volatile double-bit ECC error (+ its event)
  ecc-sbe [N]      N corrected single-bit errors
  remap-pending    a row remap pending (reset needed)
  remap-failure    a row remapping failure
  retired-pages N  N pages retired for double-bit errors, retirement pending
  gpu-lost         the GPU answers GPU_IS_LOST from now on (no event)
  gpu-missing N    only N GPUs are enumerated
  temp CELSIUS     the GPU temperature
  throttle [PCT]   a thermal slowdown: the GPU keeps PCT% of its SM clock (default 50; 100 ends it),
                   with NVML's thermal clock-event reasons; the example trainer computes slower on it
  nvlink-down L    NVLink L goes inactive
  nvlink-errors L  NVLink L counts 1000 more CRC flit errors and replays (a marginal link)
  pcie-degraded [W]   the GPU's PCIe link runs at xW (default 8) of its x16; 16 ends it
  recovery-action A   the driver's GPU recovery action (0 none, 1 reset, 2 reboot, 3 drain P2P)
  nvml-hang FUNCTION SECONDS   calls of FUNCTION (e.g. nvmlDeviceGetTemperature) block
  clear            every GPU healthy again (events already delivered stay delivered)

\b
Network faults (the node's emulated /sys/class/infiniband; --nic picks mlx5_<N>, --port its port):
  ib-port-down         the port goes DOWN/Disabled (link_downed counts one)
  ib-rate-halved       the port runs at 200 of its 400 Gb/s
  ib-symbol-errors [N] N more symbol errors (default 1000)
  ib-link-flap [N]     the link went down and back N times (link_downed, link_error_recovery)
  nic-pcie-degraded [W]  the NIC's PCIe link runs at xW (default 8) of its x16
  roce-retransmits [N] a RoCE port loses packets: N ACK timeouts (default 10), 30N NAK-sequence errors
  roce-fcs-errors [N]  N frames with a bad FCS on a RoCE port's netdev (rx_crc_errors, default 1000)
  roce-congestion [N]  N ECN marks and CNPs (default 100000): a busy fabric, never a finding
  ib-clear             the port and link healthy again (counters keep their totals)

\b
Diagnostic faults (the node's emulated `dcgmi diag`, dcgmi_emu.py; --gpu picks the GPU):
  dcgm-fail LEVEL [TEST]   TEST (default Diagnostic; words joined by _) fails from run level LEVEL up
  dcgm-hang SECONDS        every run sleeps SECONDS first (a hung host engine)
  dcgm-clear               the diagnostic passes again
"""


@cli.command("inject", help=FAULT_HELP)
@click.argument("node")
@click.argument("kind")
@click.argument("args", nargs=-1)
@click.option("--gpu", default=0, show_default=True, help="GPU index on the node.")
@click.option("--nic", default=0, show_default=True, help="NIC (mlx5_<N>) of a network fault.")
@click.option("--port", default=1, show_default=True, help="Port of that NIC.")
def inject_fault(node: str, kind: str, args: tuple[str, ...], gpu: int, nic: int, port: int) -> None:
    tb = Testbed()
    network = network_fault(kind, args, nic, port) if kind in IB_FAULT_KINDS else None
    fault = None if network or kind in DIAG_FAULT_KINDS else _parse_fault(kind, args, gpu)
    directory = tb.nvml_dir(node)
    if not directory.is_dir():
        raise click.ClickException(f"{node} has no emulated GPUs at {directory}: is the testbed up? "
                                   "(`clusterctl-testbed up`)")
    if kind in DIAG_FAULT_KINDS:
        inject_diag(directory, _diag_fault(kind, args, gpu))
        click.echo(f"injected {kind} {' '.join(args)} on {node} gpu{gpu}".rstrip())
        return
    if network is not None:
        inject_network_fault(directory / "sysroot", network)
        click.echo(f"injected {kind} {' '.join(args)} on {node} mlx5_{nic}/{port}".rstrip())
        return
    assert fault is not None
    inject(directory, fault)
    click.echo(f"injected {kind} {' '.join(args)} on {node} gpu{gpu}".rstrip())



DIAG_FAULT_KINDS = ("dcgm-fail", "dcgm-hang", "dcgm-clear")


def _diag_fault(kind: str, args: tuple[str, ...], gpu: int) -> DiagFault:
    try:
        if kind == "dcgm-fail" and 1 <= len(args) <= 2:
            return DiagFault("fail", int(args[0]), args[1].replace("_", " ") if len(args) == 2 else "Diagnostic", gpu)
        if kind == "dcgm-hang" and len(args) == 1:
            return DiagFault("hang", seconds=float(args[0]))
        if kind == "dcgm-clear" and not args:
            return DiagFault("clear")
    except ValueError:
        pass
    raise click.BadParameter(f"{kind}: see the diagnostic faults in --help", param_hint="ARGS")


def _parse_fault(kind: str, args: tuple[str, ...], gpu: int) -> Fault:
    try:
        if kind == "nvml-hang":
            if len(args) != 2:
                raise click.BadParameter("nvml-hang takes FUNCTION SECONDS", param_hint="ARGS")
            return Fault(kind, gpu, function=args[0], seconds=float(args[1]))
        needs_value = {"xid", "kmsg-xid", "gpu-missing", "temp", "nvlink-down", "nvlink-errors", "recovery-action",
                       "retired-pages"}
        if kind in needs_value and len(args) != 1:
            raise click.BadParameter(f"{kind} takes one number", param_hint="ARGS")
        if kind not in FAULT_KINDS:
            raise click.BadParameter(f"unknown fault {kind!r}; one of: {', '.join(FAULT_KINDS)}",
                                     param_hint="KIND")
        value = int(args[0]) if args else 0
        if kind == "throttle" and not 0 <= value <= 100:
            raise click.BadParameter(f"throttle {value}: give the percentage of the SM clock the GPU keeps (1-100)",
                                     param_hint="ARGS")
        return Fault(kind, gpu, value=value)
    except ValueError as exc:
        raise click.BadParameter(f"{' '.join(args)!r} is not a number ({exc})", param_hint="ARGS") from exc


cli.add_command(compose)  # `clusterctl-testbed compose ...`: the same cluster as docker-compose services


def main() -> None:
    try:
        cli(standalone_mode=True)
    except TestbedError as exc:
        click.echo(f"clusterctl-testbed: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
