"""A Serve replica's placement group: one bundle for the replica, one for its target actor, one
for its drafter actor (when the drafter runs in an actor of its own).

Serve reserves the group for each replica (the deployment's ``placement_group_bundles`` and
``placement_group_strategy``) and starts the replica in bundle 0; ``in_bundle`` pins the target to
bundle 1 and the drafter to bundle 2 (``PlacementGroupSchedulingStrategy``), so where each actor
runs is decided by the group, never left to Ray's choice at the time. ``STRICT_PACK`` (the
default) keeps a replica on one node, so a round pays no network hop; ``PACK`` prefers one node;
``SPREAD`` prefers several.

``check`` holds the bundles against the nodes alive at build time. A group that no node (or,
under ``STRICT_PACK``, no single node) can hold is never created, and Serve would wait for it
without end; the error names the bundle and the resource instead. Nodes a cluster autoscaler
would start are not seen (``check_placement: false`` turns the check off).

Not here: which actors a replica starts (``cluster.app.spawn_actors``), Serve's own scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.schema import Resources, ServeArgs

REPLICA_BUNDLE, TARGET_BUNDLE, DRAFTER_BUNDLE = 0, 1, 2
# Ray's resource for an accelerator_type constraint: a node with GPUs of type T offers
# "accelerator_type:T": 1, and an actor asking for type T takes 0.001 of it.
ACCELERATOR_PREFIX, ACCELERATOR_SHARE = "accelerator_type:", 0.001


@dataclass(frozen=True)
class Bundle:
    field: str  # the serve arg it comes from (server_num_cpus, target_resources, ...)
    resources: dict[str, float]  # Ray resource name -> amount, zeros left out

    def __str__(self) -> str:
        return f"{self.field} {self.resources}"


def demand(resources: Resources) -> dict[str, float]:
    """The Ray resources an actor with ``resources`` takes, as Ray counts them."""
    need = {"CPU": resources.num_cpus, "GPU": resources.num_gpus, **resources.resources}
    if resources.accelerator_type:
        need[ACCELERATOR_PREFIX + resources.accelerator_type] = ACCELERATOR_SHARE
    return {name: float(amount) for name, amount in need.items() if amount > 0}


def bundles(args: ServeArgs) -> list[Bundle]:
    """The replica's bundles, in the order ``REPLICA_BUNDLE``, ``TARGET_BUNDLE``,
    ``DRAFTER_BUNDLE`` (the last only for a drafter actor)."""
    out = [Bundle("server_num_cpus", demand(Resources(num_cpus=args.server_num_cpus))),
           Bundle("target_resources", demand(args.target_resources))]
    if args.drafter_actor:
        out.append(Bundle("drafter_resources", demand(args.drafter_resources)))
    for index, bundle in enumerate(out):
        if not bundle.resources:
            raise ValueError(f"placement bundle {index} ({bundle.field}) reserves no resource, and "
                             f"Ray refuses an empty bundle: give {bundle.field} some num_cpus")
    return out


def fits(need: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(name, 0.0) + 1e-9 >= amount for name, amount in need.items())


def shortfall(need: dict[str, float], nodes: list[dict[str, float]]) -> str:
    """Which resources of ``need`` no node has enough of, and the most any node has."""
    short = [f"{amount:g} {name} (the most a node has: {max(n.get(name, 0.0) for n in nodes):g})"
             for name, amount in need.items()
             if not any(n.get(name, 0.0) + 1e-9 >= amount for n in nodes)]
    return ", ".join(short) or "no node has all of it at once"


def check(bundles: list[Bundle], strategy: str, nodes: list[dict[str, float]]) -> None:
    """Raise ``ValueError`` if the nodes (each one's total resources) cannot hold the group."""
    nodes = nodes or [{}]
    for index, bundle in enumerate(bundles):
        if not any(fits(bundle.resources, node) for node in nodes):
            raise ValueError(f"placement bundle {index} ({bundle}) fits on no node of the "
                             f"cluster: {shortfall(bundle.resources, nodes)}")
    if strategy == "STRICT_PACK":
        total: dict[str, float] = {}
        for bundle in bundles:
            for name, amount in bundle.resources.items():
                total[name] = total.get(name, 0.0) + amount
        if not any(fits(total, node) for node in nodes):
            raise ValueError(
                f"placement_strategy STRICT_PACK puts a replica's bundles "
                f"({'; '.join(map(str, bundles))}) on one node, and no node holds {total}: "
                f"{shortfall(total, nodes)}; use PACK or SPREAD, or smaller resources")


def alive_nodes() -> list[dict[str, float]]:
    """The total resources of each node of the connected Ray cluster that is alive."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node["Alive"]]


def in_bundle(index: int) -> dict:
    """Actor options that start an actor in bundle ``index`` of the caller's placement group
    (none outside one: a replica that Serve did not place, a test's driver)."""
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = get_current_placement_group()
    if group is None:
        return {}
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=index)}
