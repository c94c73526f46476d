"""Growing a shrunk job back (pure): when nodes are usable again, how many data-parallel replicas the job can
run on what it holds plus what Slurm offers, which offered nodes to ask for, and by which route.

A grow is the mirror of a shrink (shrink.py): it adds whole data-parallel replicas (tp, cp and pp unchanged)
up to the spec's dp, never past it, and only at a checkpoint boundary, so the larger step resumes from a
checkpoint the smaller one has just completed and loses no steps.  The placement planner places the new map
over the nodes held and the nodes offered; the job asks only for the offered nodes the map uses, and gives
back any held node the map leaves out (never the batch host): a job must never hold nodes it does not use.

How the nodes join the job depends on the site (docs/measured.md, "Growing a running job: what each Slurm
release allows"): Slurm 22.05 to 26.05 all still carry job expansion (`--dependency=expand:JOB`, then
`scontrol update JobId=NEW NumNodes=0` merges NEW into JOB), but only where `SchedulerParameters` has
`permit_job_expansion` (off by default since 19.05) and the expander has no step (PrologFlags=Contain gives
every job an extern step, and slurmctld refuses to merge a job with steps).  Elsewhere the nodes come as a
second allocation that the job's own launcher joins to the same world (one srun step per allocation).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from clusterctl.errors import LayoutError, PlacementError
from clusterctl.launcher.pure.parallel import grow_sizes, with_data_parallel
from clusterctl.launcher.pure.placement import plan
from clusterctl.launcher.pure.shrink import JobShape, nodes_for, placement_weights, sizes_on


@dataclass(frozen=True)
class Grow:
    """The next step's shape after a grow: `data_parallel` replicas on `nodes` (held ones first, then the asked
    ones, each in its own order); `ask`: the offered nodes to ask Slurm for (every one of them is used);
    `give_back`: held nodes the larger map leaves out (never the batch host)."""

    data_parallel: int
    nodes: tuple[str, ...]
    ask: tuple[str, ...]
    give_back: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoGrow:
    """Why the job does not grow now, as a user reads it."""

    reason: str


def plan_grow(shape: JobShape, held: Sequence[str], offered: Sequence[str], batch_host: str, *,
              at_checkpoint: bool, blamed: Collection[str] = ()) -> Grow | NoGrow:
    """The largest DP size above the shape's, up to the spec's (`shape.original_data_parallel`), that the
    `held` nodes (allocation order) and the usable `offered` ones (idle in the job's partition; `blamed`
    nodes and held ones left out) can run, with the nodes to ask for; or why not.

    `at_checkpoint`: the program has just completed a checkpoint the larger step will resume from; a grow at
    any other moment would throw away the steps since the last one, so it waits."""
    layout, gpus = shape.layout, shape.gpus_per_node
    if layout.dp >= shape.original_data_parallel:
        return NoGrow(f"it runs all {layout.dp} data-parallel replicas the spec asks for")
    if not at_checkpoint:
        return NoGrow("it grows only when a checkpoint completes (the larger step resumes from it)")
    sizes = grow_sizes(layout, gpus, shape.original_data_parallel)
    if not sizes:
        return NoGrow(f"no data-parallel size from {layout.dp + 1} up to {shape.original_data_parallel} fills "
                      f"whole nodes of {gpus} GPUs with tp×cp×pp = {layout.tp * layout.cp * layout.pp} GPUs a "
                      f"replica")
    held_set, skip = set(held), set(blamed)
    usable = [n for n in dict.fromkeys(offered) if n not in held_set and n not in skip]
    pool = [*held, *usable]
    fitting = sizes_on(shape, sizes, len(pool))
    if not fitting:
        smallest = sizes[-1]
        return NoGrow(f"{len(usable)} usable node{'s' if len(usable) != 1 else ''} offered; one more replica "
                      f"(dp = {smallest}) needs {nodes_for(layout, gpus, smallest) - len(held)} beyond the "
                      f"{len(held)} held")
    weights = placement_weights(shape)
    problems = []
    for dp in fitting:
        try:
            slots = plan(with_data_parallel(layout, dp), gpus, shape.topology, pool, weights).rank_map.slots
        except (PlacementError, LayoutError) as exc:
            problems.append(f"dp = {dp}: {exc}")
            continue
        used = set(slots)
        return Grow(dp, tuple(n for n in pool if n in used), tuple(n for n in usable if n in used),
                    tuple(n for n in held if n not in used and n != batch_host))
    return NoGrow(f"the {len(pool)} held and offered nodes hold no map of the larger sizes ({'; '.join(problems)})")


EXPAND = "expand"
SECOND_ALLOCATION = "second-allocation"


@dataclass(frozen=True)
class GrowRoute:
    """How asked nodes join the job: `expand` (Slurm merges a second job into this one: one job, one step) or
    `second-allocation` (the nodes stay a job of their own, the launcher adds a step there to the same world);
    `why` says which site setting chose it."""

    route: str
    why: str


def choose_grow_route(scheduler_parameters: str | None, prolog_flags: str | None) -> GrowRoute:
    """The route the site allows, from `scontrol show config`'s SchedulerParameters and PrologFlags."""
    params = {p.split("=", 1)[0].strip().lower() for p in (scheduler_parameters or "").split(",")}
    flags = {f.strip().lower() for f in (prolog_flags or "").split(",")}
    if "permit_job_expansion" not in params:
        return GrowRoute(SECOND_ALLOCATION, "SchedulerParameters lacks permit_job_expansion (Slurm's default "
                                            "since 19.05): a running job cannot be expanded")
    if flags & {"contain", "x11"}:
        return GrowRoute(SECOND_ALLOCATION, "PrologFlags=Contain gives every job an extern step, and Slurm "
                                            "merges only a job without steps into another")
    return GrowRoute(EXPAND, "SchedulerParameters has permit_job_expansion and jobs get no extern step")
