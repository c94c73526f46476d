"""A plan as a JSON document: what `clusterctl plan --json` prints and what the in-job plan step
keeps next to the rank map (pure; the terminal and SVG views are `clusterctl.launcher.login.plan_view`)."""

from __future__ import annotations

from typing import Any

from clusterctl.launcher.pure.cost import CostReport
from clusterctl.launcher.pure.placement import Plan
from clusterctl.slurm.topology import Topology


def _cost_json(report: CostReport) -> dict[str, Any]:
    return {
        "objective": round(report.objective, 6),
        "leaf_crossing_dp_pp_groups": report.leaf_crossing_groups(),
        "groups": {kind: {level: vars(cost) for level, cost in levels.items()}
                   for kind, levels in report.table.items()},
    }


def plan_json(plan: Plan, topology: Topology) -> dict[str, Any]:
    """The plan as a JSON-ready dict (deterministic: sort keys when dumping)."""
    rm = plan.rank_map
    layout = plan.layout
    gpn = rm.gpus_per_node
    return {
        "layout": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "cp": layout.cp, "ep": layout.ep,
                   "order": layout.order, "world_size": layout.world_size},
        "gpus_per_node": gpn,
        "strategy": plan.strategy,
        "nodes": [{"slot": s, "node": node, "leaf": topology.leaf_of[node], "ranks": [s * gpn, s * gpn + gpn - 1],
                   "coords": plan.slot_coordinates(s)} for s, node in enumerate(rm.slots)],
        "cost": _cost_json(plan.cost),
        "baselines": {name: _cost_json(report) for name, report in plan.baselines.items()},
        "explanation": list(plan.explanation),
    }
