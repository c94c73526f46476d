"""`clusterctl`: the command ML engineers run on a login node."""

from __future__ import annotations

import json
import os
import sys
import tomllib
import traceback
from pathlib import Path

import click
from rich.console import Console

from launcher import __version__, hostlist
from launcher.cost import DEFAULT_WEIGHTS
from launcher.errors import ClusterctlError, LayoutError, SpecError
from launcher.parallel import DIMS, layout_from_mapping
from launcher.placement import plan as make_plan
from launcher.plan_view import plan_json, plan_renderables, plan_svg
from launcher.slurm import Slurm
from launcher.topology import load_nvlink_domains, load_topology, parse_scontrol_topology

EXIT_NOT_AVAILABLE = 69  # EX_UNAVAILABLE: the feature is not built yet


def _not_yet(feature: str) -> None:
    click.echo(f"clusterctl: `{feature}` is not available in clusterctl {__version__} yet.", err=True)
    sys.exit(EXIT_NOT_AVAILABLE)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clusterctl")
@click.option("--debug", is_flag=True, help="Show a traceback with errors.")
def cli(debug: bool) -> None:
    """Keep large GPU training jobs running on Slurm.

    \b
    Working: `plan` (topology-aware rank maps) and `hostlist`.  Not yet built, and
    saying so plainly: submit, status, supervise.

    \b
    Exit codes: 0 ok, 2 usage, 3 hostlist, 4 topology, 5 layout, 6 placement,
    7 spec, 8 Slurm command, 69 not available yet.
    """
    if debug:
        os.environ["CLUSTERCTL_DEBUG"] = "1"


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def submit(args: tuple[str, ...]) -> None:
    """Submit a job spec (not available yet)."""
    _not_yet("submit")


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def status(args: tuple[str, ...]) -> None:
    """Show a run's state (not available yet)."""
    _not_yet("status")


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def supervise(args: tuple[str, ...]) -> None:
    """Supervise a run across node failures (not available yet)."""
    _not_yet("supervise")


@cli.group("hostlist")
def hostlist_group() -> None:
    """Expand or compress Slurm hostlists, exactly as `scontrol show hostnames/hostlist`."""


@hostlist_group.command("expand")
@click.argument("expression")
def hostlist_expand(expression: str) -> None:
    """Print every host of EXPRESSION (e.g. 'node[01-04],gpu7'), one a line."""
    click.echo("\n".join(hostlist.expand(expression)))


@hostlist_group.command("compress")
@click.argument("names", nargs=-1, required=True)
def hostlist_compress(names: tuple[str, ...]) -> None:
    """Print NAMES as one hostlist expression (order and duplicates kept, as Slurm does)."""
    click.echo(hostlist.compress(names))


def _parallel_from_spec(path: Path) -> dict:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror}", path=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"not valid TOML: {exc}", path=str(path)) from None
    section = data.get("parallel", {})
    if not isinstance(section, dict):
        raise SpecError("must be a table ([parallel])", path=str(path), key="parallel")
    return dict(section)


def _weights(items: tuple[str, ...]) -> dict[str, float]:
    weights = dict(DEFAULT_WEIGHTS)
    for item in items:
        kind, sep, value = item.partition("=")
        try:
            if not sep or kind not in DIMS:
                raise ValueError
            weights[kind] = float(value)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected KIND=NUMBER with KIND one of {', '.join(DIMS)}",
                                     param_hint="--weight") from None
    return weights


@cli.command()
@click.option("--spec", type=click.Path(path_type=Path, dir_okay=False), help="Read [parallel] from a job spec.")
@click.option("--tp", type=int, help="Tensor-parallel size.")
@click.option("--pp", type=int, help="Pipeline-parallel size.")
@click.option("--dp", type=int, help="Data-parallel size (default: whatever fills the nodes).")
@click.option("--cp", type=int, help="Context-parallel size.")
@click.option("--ep", type=int, help="Expert-parallel size.")
@click.option("--order", help="Framework (megatron, megatron-tp-pp-dp, torchtitan) or an order like tp-pp-dp.")
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--topology", "topology_file", type=click.Path(path_type=Path, dir_okay=False),
              help="topology.conf, saved `scontrol show topology` output, or SLURM_TOPOLOGY_ADDR lines.")
@click.option("--nvlink-domains", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML with [[domain]] name/nodes for NVLink domains larger than a node.")
@click.option("--nodelist", help="The allocated nodes as a hostlist (e.g. 'node[1-3,7]').")
@click.option("--nodes", "node_count", type=int,
              help="Plan for N nodes: N of --nodelist, or of the live cluster's idle nodes without it.")
@click.option("--partition", help="With --nodes: only this partition's idle nodes.")
@click.option("--weight", multiple=True, metavar="KIND=W", help="Traffic weight of a group kind (default "
              + ", ".join(f"{k}={v:g}" for k, v in DEFAULT_WEIGHTS.items()) + ").")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--svg", type=click.Path(path_type=Path, dir_okay=False), help="Also draw the placement to FILE.")
@click.option("--explain", is_flag=True, help="Say why each leaf got what it got.")
def plan(spec: Path | None, tp: int | None, pp: int | None, dp: int | None, cp: int | None, ep: int | None,
         order: str | None, gpus_per_node: int, topology_file: Path | None, nvlink_domains: Path | None,
         nodelist: str | None, node_count: int | None, partition: str | None, weight: tuple[str, ...],
         as_json: bool, svg: Path | None, explain: bool) -> None:
    """Plan a topology-aware rank map and report its network cost against Slurm's and a
    depth-first order.

    \b
    Examples:
      clusterctl plan --tp 8 --pp 2 --topology topology.conf --nodelist 'node[1-4]'
      clusterctl plan --spec job.toml --nodes 16 --explain      # live cluster
    """
    values = _parallel_from_spec(spec) if spec else {}
    for key, value in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp), ("ep", ep), ("order", order)):
        if value is not None:
            values[key] = value
    if gpus_per_node < 1:
        raise click.BadParameter("must be at least 1", param_hint="--gpus-per-node")
    slurm = Slurm()
    if topology_file is not None:
        topology = load_topology(topology_file)
    elif node_count is not None:
        topology = parse_scontrol_topology(slurm.show_topology())
    else:
        raise click.UsageError("say where the topology comes from: --topology FILE (or --nodes N on a live cluster)")
    if nvlink_domains is not None:
        topology = topology.with_nvlink_domains(load_nvlink_domains(nvlink_domains))
    if nodelist is not None:
        allocated = hostlist.expand(nodelist)
        wanted = node_count or len(allocated)  # with --nodes: use N of the listed nodes
    elif node_count is not None:
        allocated = slurm.idle_nodes(partition)
        wanted = node_count
        if len(allocated) < node_count:
            raise LayoutError(f"--nodes {node_count}: only {len(allocated)} idle nodes now; ask for fewer nodes")
    else:
        raise click.UsageError("say which nodes: --nodelist EXPR or --nodes N")
    if "dp" not in values:
        rest = 1
        for key in ("tp", "cp", "pp"):
            rest *= values.get(key, 1) if isinstance(values.get(key, 1), int) else 1
        gpus = wanted * gpus_per_node
        if rest < 1 or gpus % rest:
            raise LayoutError(f"tp×cp×pp = {rest} does not divide {gpus} GPUs ({wanted} nodes × {gpus_per_node}); "
                              "change tp, cp or pp, or the node count")
        values["dp"] = gpus // rest
    layout = layout_from_mapping(values, where=str(spec) if spec else "options")
    result = make_plan(layout, gpus_per_node, topology, allocated, _weights(weight))
    if svg is not None:
        tmp = svg.with_name(f".{svg.name}.tmp")
        tmp.write_text(plan_svg(result, topology))
        tmp.replace(svg)
    if as_json:
        click.echo(json.dumps(plan_json(result, topology), indent=2, sort_keys=True))
    else:
        Console().print(plan_renderables(result, topology, explain=explain))


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except ClusterctlError as exc:
        if os.environ.get("CLUSTERCTL_DEBUG"):
            traceback.print_exc()
        click.echo(f"clusterctl: error: {exc}", err=True)
        sys.exit(exc.exit_code)
