"""Ways to show a plan: a JSON document, rich renderables for the terminal, and an SVG picture."""

from __future__ import annotations

from html import escape

from rich.console import Group, RenderableType
from rich.text import Text
from rich.tree import Tree

from clusterctl.table_view import Column, TextTable
from clusterctl.terminal_view import plain
from clusterctl.launcher.pure.placement import Plan
from clusterctl.slurm.topology import Topology

COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")
RICH_COLOURS = ("blue", "dark_orange", "green", "red", "cyan", "yellow", "magenta", "pink1", "tan", "grey62")


def _improvement(ours: float, theirs: float) -> str:
    if theirs == 0:
        return "—" if ours == 0 else "worse"
    return f"{(1 - ours / theirs) * 100:.0f}% lower"


def plan_renderables(plan: Plan, topology: Topology, *, explain: bool) -> Group:
    """Terminal view: switch tree with slots coloured by pipeline stage, cost table, explanation."""
    rm = plan.rank_map
    layout = plan.layout
    title = (f"Rank map: TP={layout.tp} CP={layout.cp} EP={layout.ep} DP={layout.dp} PP={layout.pp} "
             f"(order {layout.order}), {len(rm.slots)} nodes × {rm.gpus_per_node} GPUs")
    slot_of = {node: s for s, node in enumerate(rm.slots)}
    tree = Tree(plain(title, "bold"))
    children: dict[str | None, list[str]] = {}
    for switch, up in topology.parent.items():
        children.setdefault(up, []).append(switch)
    under: dict[str, list[str]] = {}
    for node in rm.slots:
        under.setdefault(topology.leaf_of[node], []).append(node)

    def used(switch: str) -> bool:
        return bool(under.get(switch)) or any(used(c) for c in children.get(switch, []))

    def add(branch: Tree, switch: str) -> None:
        sub = branch.add(plain(switch, "bold"))
        for node in sorted(under.get(switch, []), key=lambda n: slot_of[n]):
            s = slot_of[node]
            coords = plan.slot_coordinates(s)
            colour = RICH_COLOURS[coords.get("pp", 0) % len(RICH_COLOURS)]
            label = " ".join(f"{k}{v}" for k, v in coords.items())
            sub.add(plain(f"{node}  slot {s}  ranks {s * rm.gpus_per_node}-{(s + 1) * rm.gpus_per_node - 1}  {label}",
                          colour))
        for child in children.get(switch, []):
            if used(child):
                add(sub, child)

    for root in children.get(None, []):
        if used(root):
            add(tree, root)

    rows = []
    for kind, levels in plan.cost.table.items():
        for level in levels:
            row = [kind.upper(), level]
            for report in (plan.cost, *plan.baselines.values()):
                c = report.table[kind][level]
                row.append(f"{c.spanning}/{c.groups} · {c.span_excess} · {c.max_span} · {c.crossing_edges}")
            rows.append(tuple(row))
    table = TextTable((Column("kind", bare=True), Column("level", bare=True),
                       *(Column(name, justify="right") for name in ("plan", *plan.baselines))),
                      tuple(rows), names=2,
                      title="Cost by group kind and level (groups spanning >1 unit / Σ(span−1) / max span / "
                            "crossing ring edges)")
    summary = Text()
    summary.append(f"objective {plan.cost.objective:g}", style="bold")
    for name, report in plan.baselines.items():
        summary.append(f"   vs {name} {report.objective:g} ({_improvement(plan.cost.objective, report.objective)})")
    summary.append(f"\nleaf-crossing DP+PP groups: {plan.cost.leaf_crossing_groups()}")
    for name, report in plan.baselines.items():
        summary.append(f"   {name} {report.leaf_crossing_groups()}")
    summary.append(f"\nstrategy: {plan.strategy}")
    parts: list[RenderableType] = [tree, table, summary]
    if explain:
        parts.append(plain("\n".join(["Why:", *(f"  {line}" for line in plan.explanation)])))
    return Group(*parts)


def plan_svg(plan: Plan, topology: Topology) -> str:
    """A picture of the placement: one column per leaf, one box per node, coloured by pipeline stage."""
    rm = plan.rank_map
    gpn = rm.gpus_per_node
    slot_of = {node: s for s, node in enumerate(rm.slots)}
    leaves: dict[str, list[str]] = {}
    for node in rm.slots:
        leaves.setdefault(topology.leaf_of[node], []).append(node)
    box_w, box_h, gap, top = 150, 34, 12, 60
    tallest = max(len(v) for v in leaves.values())
    width = gap + len(leaves) * (box_w + gap)
    height = top + tallest * (box_h + 6) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{gap}" y="20" font-size="14" font-weight="bold">{escape(plan.strategy)}</text>',
           f'<text x="{gap}" y="38">objective {plan.cost.objective:g}; '
           + "; ".join(f"{n} {r.objective:g}" for n, r in plan.baselines.items()) + "</text>"]
    for column, (leaf, nodes) in enumerate(leaves.items()):
        x = gap + column * (box_w + gap)
        out.append(f'<text x="{x}" y="{top - 6}" font-weight="bold">{escape(leaf)}</text>')
        for row, node in enumerate(sorted(nodes, key=lambda n: slot_of[n])):
            s = slot_of[node]
            coords = plan.slot_coordinates(s)
            colour = COLOURS[coords.get("pp", 0) % len(COLOURS)]
            y = top + row * (box_h + 6)
            label = " ".join(f"{k}{v}" for k, v in coords.items())
            out.append(f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="4" fill="{colour}" '
                       f'fill-opacity="0.85"/>')
            out.append(f'<text x="{x + 6}" y="{y + 14}" fill="white">{escape(node)} · slot {s}</text>')
            out.append(f'<text x="{x + 6}" y="{y + 28}" fill="white">ranks {s * gpn}-{s * gpn + gpn - 1} '
                       f'{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
