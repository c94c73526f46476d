"""`clusterctl-testbed compose ...`: the same cluster as docker-compose services on a Docker engine."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

import click

from clusterctl_testbed.compose import DEFAULT_RELEASE, ComposeTestbed, compose_layout
from clusterctl_testbed.gpu_faults import FAULT_KINDS, Fault, inject
from clusterctl_testbed.ib_faults import IB_FAULT_KINDS, IbFault, inject_ib
from clusterctl_testbed.versions import RELEASES

NEEDS_VALUE = {"xid", "kmsg-xid", "gpu-missing", "temp", "nvlink-down", "nvlink-errors", "recovery-action",
               "retired-pages"}


@click.group("compose", context_settings={"help_option_names": ["-h", "--help"]})
def compose() -> None:
    """The testbed cluster as docker-compose services: `ctl` (slurmctld, slurmdbd, munge; the login
    node), `db` (MariaDB) and node1-4 (slurmd, healthd, the hooks, 8 emulated GPUs each), two leaf
    switches under a spine.  Uses your Docker engine (DOCKER_HOST or /var/run/docker.sock); as root on
    a machine without one, starts Debian's dockerd in a network namespace of its own and stops it at
    `down`.  State lives in /tmp/ctd/ctd; every host sees it, the shared directory /tmp/ctd/ctd-shared
    (put run directories there) and the checkout (read-only) at the same paths, and nothing else of
    this machine's /tmp.
    """


@compose.command()
@click.option("--timeout", default=90.0, show_default=True, help="Seconds to wait for nodes to be idle.")
@click.option("--slurm", type=click.Choice([r for r, release in RELEASES.items() if release.suite is not None
                                            and not release.built_from_source]), default=DEFAULT_RELEASE,
              show_default=True, help="Which Slurm: 22.05 / 24.11 / 26.05 (Debian bookworm / trixie / sid).")
@click.option("--nics", type=click.Choice(["infiniband", "roce"]), default="infiniband", show_default=True,
              help="Each node's emulated NICs: InfiniBand ports, or RoCE ports (what the roce-* faults change).")
def up(timeout: float, slurm: str, nics: str) -> None:
    """Build the images if needed, start the services and wait until every node is idle."""
    layout = dataclasses.replace(compose_layout(), nic_link_layer="Ethernet" if nics == "roce" else "InfiniBand")
    ComposeTestbed(layout).up(timeout=timeout, slurm=slurm)


@compose.command()
def down() -> None:
    """Remove the services and network; stop the Docker engine if the testbed started it."""
    ComposeTestbed().down()


@compose.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """The engine, the daemons (alive or not) and the node states."""
    info = ComposeTestbed().status()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        sys.exit(0 if info["up"] else 3)
    engine = cast("dict[str, Any] | None", info["engine"])
    slurm = cast("dict[str, Any]", info["slurm"])
    daemons = cast("dict[str, dict[str, Any]]", info["daemons"])
    nodes = cast("list[dict[str, str]]", info["nodes"])
    click.echo(f"compose testbed at {info['root']}: {'up' if info['up'] else 'down'}")
    if engine:
        click.echo(f"  engine {engine['host']} ({'started by the testbed' if engine['owned'] else 'yours'})")
    click.echo(f"  Slurm {slurm['release']}: {slurm['version'] or 'version unknown'}")
    for name, d in daemons.items():
        click.echo(f"  {name:16} pid {d['pid']:<8} {'alive' if d['alive'] else 'dead'}")
    for n in nodes:
        click.echo(f"  {n['name']:8} {n['state']:10} {n['gres']:10} {n['reason']}")
    sys.exit(0 if info["up"] else 3)


@compose.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("host")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def on(host: str, command: tuple[str, ...]) -> None:
    """Run COMMAND on HOST (ctl, db, node1, ...), in the current directory; exits with its status."""
    tb = ComposeTestbed()
    argv = tb.enter(host, cwd=os.getcwd()) + list(command)
    os.execvpe(argv[0], argv, tb.host_env())


@compose.command()
@click.argument("host", default="ctl")
def shell(host: str) -> None:
    """An interactive shell on HOST (default: the login/controller host)."""
    tb = ComposeTestbed()
    argv = tb.enter(host, cwd=os.getcwd()) + ["bash"]
    os.execvpe(argv[0], argv, tb.host_env())


@compose.command("kill-node")
@click.argument("node")
def kill_node(node: str) -> None:
    """Power NODE off: kill its container."""
    ComposeTestbed().kill_node(node)


@compose.command("boot-node")
@click.argument("node")
def boot_node(node: str) -> None:
    """Power a killed NODE back on (container, slurmd, healthd)."""
    ComposeTestbed().boot_node(node)


@compose.command("cut-link")
@click.argument("node")
def cut_link(node: str) -> None:
    """Disconnect NODE from the cluster network; its processes keep running."""
    ComposeTestbed().cut_link(node)


@compose.command("heal-link")
@click.argument("node")
def heal_link(node: str) -> None:
    """Connect NODE to the cluster network again, with its address."""
    ComposeTestbed().heal_link(node)


@compose.command("restart-slurmd")
@click.argument("node")
def restart_slurmd(node: str) -> None:
    """Restart slurmd on NODE (running job processes survive)."""
    ComposeTestbed().restart_slurmd(node)


@compose.command("stop")
@click.argument("daemon")
def stop(daemon: str) -> None:
    """Stop one DAEMON by name: slurmctld, slurmdbd, healthd:node3, slurmd:node1..."""
    ComposeTestbed().stop_daemon(daemon)


@compose.command("start")
@click.argument("daemon")
def start(daemon: str) -> None:
    """Start DAEMON again: slurmctld or healthd:NODE."""
    tb = ComposeTestbed()
    if daemon == "slurmctld":
        tb.start_controller()
    elif daemon.startswith("healthd:"):
        tb.start_healthd(daemon.split(":", 1)[1])
    else:
        raise click.BadParameter("one of slurmctld, healthd:NODE", param_hint="DAEMON")


def network_fault(kind: str, args: tuple[str, ...], nic: int, port: int) -> IbFault:
    """`inject`'s network fault from its command line (the compose testbed's too): a bad argument is a usage error."""
    if len(args) > 1 or (args and not args[0].isdigit()):
        raise click.BadParameter(f"{kind} takes at most one whole number, found {' '.join(args)!r}", param_hint="ARGS")
    return IbFault(kind, nic, port, int(args[0]) if args else 0)


def inject_network_fault(root: Path, fault: IbFault) -> None:
    """Inject `fault` into the node's emulated sysfs tree at `root`; a port not there is a clear error."""
    try:
        inject_ib(root, fault)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@compose.command("inject")
@click.argument("node")
@click.argument("kind")
@click.argument("args", nargs=-1)
@click.option("--gpu", default=0, show_default=True, help="GPU index on the node.")
@click.option("--nic", default=0, show_default=True, help="NIC (mlx5_<N>) of a network fault.")
@click.option("--port", default=1, show_default=True, help="Port of that NIC.")
def inject_fault(node: str, kind: str, args: tuple[str, ...], gpu: int, nic: int, port: int) -> None:
    """Inject a GPU or network fault on NODE (the kinds of `clusterctl-testbed inject --help`; the roce-* ones
    need RoCE ports: `up --nics roce`)."""
    if kind in IB_FAULT_KINDS:
        inject_network_fault(ComposeTestbed().nvml_dir(node) / "sysroot", network_fault(kind, args, nic, port))
        click.echo(f"injected {kind} {' '.join(args)} on {node} mlx5_{nic}/{port}".rstrip())
        return
    if kind not in FAULT_KINDS:
        raise click.BadParameter(f"unknown fault {kind!r}; one of: {', '.join(FAULT_KINDS)}", param_hint="KIND")
    try:
        if kind == "nvml-hang":
            if len(args) != 2:
                raise click.BadParameter("nvml-hang takes FUNCTION SECONDS", param_hint="ARGS")
            fault = Fault(kind, gpu, function=args[0], seconds=float(args[1]))
        else:
            if kind in NEEDS_VALUE and len(args) != 1:
                raise click.BadParameter(f"{kind} takes one number", param_hint="ARGS")
            fault = Fault(kind, gpu, value=int(args[0]) if args else 0)
            if kind == "throttle" and not 0 <= fault.value <= 100:
                raise click.BadParameter(f"throttle {fault.value}: give the percentage of the SM clock the GPU "
                                         "keeps (1-100)", param_hint="ARGS")
    except ValueError as exc:
        raise click.BadParameter(f"{' '.join(args)!r} is not a number ({exc})", param_hint="ARGS") from exc
    directory = ComposeTestbed().nvml_dir(node)
    if not directory.is_dir():
        raise click.ClickException(f"{node} has no emulated GPUs at {directory}: is the compose testbed up?")
    inject(directory, fault)
    click.echo(f"injected {kind} {' '.join(args)} on {node} gpu{gpu}".rstrip())
