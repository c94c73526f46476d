"""The planner made fast gives exactly the maps it gave before, on generated clusters and jobs.

`tests/data/golden/plan/generated.json` holds, for every generated case, the fingerprint of
`clusterctl plan --json` (slots, cost tables, strategy, explanation) as the planner of commit
bb12a81 (before the fleet-scale work) produced it: any change to a map, a cost or a message
shows up as a different fingerprint.  Regenerate only for an intended change (`write_golden()`).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

import pytest

from clusterctl.errors import ClusterctlError
from clusterctl.launcher.pure.parallel import ParallelLayout
from clusterctl.launcher.pure.placement import plan
from clusterctl.launcher.pure.plan_document import plan_json
from clusterctl.slurm.topology import Topology, parse_topology_conf
from tests.golden import GOLDEN_ROOT


@dataclass(frozen=True)
class Case:
    """One generated planning problem."""

    name: str
    layout: ParallelLayout
    gpus_per_node: int
    topology: Topology
    allocated: tuple[str, ...]
    weights: dict[str, float]


def _tree(rng: random.Random, leaves: int, leaf_size: tuple[int, int], fan_out: int, levels: int,
          name: str) -> tuple[str, list[str]]:
    """topology.conf text of `levels` switch levels above uneven leaves, and its nodes in order."""
    lines, nodes, start = [], [], 1
    width = rng.choice([0, 4])  # plain or zero-padded names (gpu0007)
    for leaf in range(leaves):
        size = rng.randint(*leaf_size)
        names = [f"{name}{n:0{width}d}" for n in range(start, start + size)]
        lines.append(f"SwitchName=l{leaf} Nodes={','.join(names)}")
        nodes += names
        start += size + rng.choice([0, 0, 3])  # gaps in the numbering, as real clusters have
    below = [f"l{i}" for i in range(leaves)]
    for level in range(2, levels + 1):
        above = []
        for i in range(0, len(below), fan_out):
            switch = f"s{level}x{i // fan_out}"
            lines.append(f"SwitchName={switch} Switches={','.join(below[i:i + fan_out])}")
            above.append(switch)
        below = above
    if len(below) > 1:
        lines.append(f"SwitchName=top Switches={','.join(below)}")
    return "\n".join(lines), nodes


def _layout(rng: random.Random, nodes: int, gpus_per_node: int) -> ParallelLayout:
    """A layout filling `nodes` nodes (TP inside a node; PP, CP, EP and DP as they fit)."""
    tp = rng.choice([d for d in (1, 2, 4, 8) if d <= gpus_per_node and gpus_per_node % d == 0])
    gpus = nodes * gpus_per_node
    pp = rng.choice([p for p in (1, 2, 3, 4, 5, 8, 10) if (gpus // tp) % p == 0])
    rest = gpus // (tp * pp)
    cp = rng.choice([c for c in (1, 1, 2) if rest % c == 0])
    dp = rest // cp
    ep = rng.choice([e for e in (1, 1, 2, 4) if (cp * dp) % e == 0])
    order = rng.choice(["tp-cp-ep-dp-pp", "tp-pp-dp", "tp-cp-dp-pp"]) if cp == 1 and ep == 1 else "tp-cp-ep-dp-pp"
    return ParallelLayout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, order=order)


def generated_cases() -> list[Case]:
    """Deterministic cases: small (exhaustive polish) to ~1,500 nodes (sampled polish), flat to 4 levels,
    whole and fragmented allocations with spares, NVLink domains, other traffic weights."""
    rng = random.Random(20261122)
    cases = []
    for number in range(36):
        big = number % 6 == 5
        levels = rng.choice([1, 2, 2, 3, 3, 4])
        leaves = rng.randint(20, 60) if big else rng.randint(2, 12)
        text, nodes = _tree(rng, leaves, (8, 32) if big else (1, 9), rng.choice([2, 3, 4, 16]), levels,
                            rng.choice(["n", "gpu"]))
        topology = parse_topology_conf(text)
        gpus_per_node = rng.choice([8, 8, 4, 2])
        share = rng.choice([1.0, 0.9, 0.75, 0.5])
        available = sorted(rng.sample(nodes, max(1, int(len(nodes) * share))), key=nodes.index)
        if rng.random() < 0.5:
            available = rng.sample(available, len(available))  # Slurm's order is not the topology's
        used = max(1, int(len(available) * rng.choice([1.0, 1.0, 0.8])))
        layout = _layout(rng, used, gpus_per_node)
        if number % 7 == 3:  # TP across 2 nodes of a declared NVLink domain of 4
            domains = {node: f"rack{i // 4}" for i, node in enumerate(nodes)}
            topology = topology.with_nvlink_domains(domains)
            used = used - used % 2 or 2
            layout = ParallelLayout(tp=2 * gpus_per_node, pp=1, dp=used // 2)
        weights = rng.choice([{}, {}, {"dp": 2.0}, {"pp": 3.0, "tp": 8.0}])
        cases.append(Case(f"case{number:02d}", layout, gpus_per_node, topology, tuple(available), weights))
    return cases


def fingerprint(case: Case) -> dict[str, object]:
    """What the planner decided for a case: the strategy, objective and a hash of the whole JSON document."""
    try:
        result = plan(case.layout, case.gpus_per_node, case.topology, list(case.allocated), case.weights or
                      {"tp": 8.0, "cp": 4.0, "ep": 2.0, "dp": 1.0, "pp": 1.0})
    except ClusterctlError as exc:
        return {"error": str(exc)}
    text = json.dumps(plan_json(result, case.topology), indent=2, sort_keys=True)
    return {"nodes": len(result.rank_map.slots), "strategy": result.strategy,
            "objective": round(result.cost.objective, 6), "sha256": hashlib.sha256(text.encode()).hexdigest()}


CASES = generated_cases()
GOLDEN_FILE = GOLDEN_ROOT / "plan" / "generated.json"
GOLDEN = json.loads(GOLDEN_FILE.read_text()) if GOLDEN_FILE.exists() else {}


def write_golden() -> None:
    """Record every case's fingerprint (run against the planner whose results are the reference)."""
    GOLDEN_FILE.write_text(json.dumps({case.name: fingerprint(case) for case in CASES}, indent=1, sort_keys=True)
                           + "\n")


def test_the_generated_cases_cover_small_large_and_impossible_jobs():
    sizes = [len(case.allocated) for case in CASES]
    assert min(sizes) < 20 and max(sizes) > 800


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_planner_gives_the_same_map_as_before(case):
    assert fingerprint(case) == GOLDEN[case.name]


def test_every_case_has_a_golden_fingerprint():
    assert sorted(GOLDEN) == [case.name for case in CASES]
