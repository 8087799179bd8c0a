"""The Serve application builder: the only place where ``ray.remote`` and ``serve.deployment``
are applied.

``build_app(args)`` validates ``args`` against ``cluster.schema.ServeArgs`` and binds one
deployment, the HTTP ingress that orchestrates rounds (``cluster.server.Server``). Its replica
starts the target and drafter actors with ``spawn_actors`` at construction, so the actors live
and die with it; each replica reserves one placement group for itself and its actors
(``cluster.placement``). YAML names the builder by import path::

    serve run configs/serve/local.yaml
    serve run cluster.app:build_app target=smollm2-135m drafter=ngram
"""

from __future__ import annotations

from pathlib import Path

import ray
from ray import serve

from actors.drafter import DrafterActor
from actors.target import TargetActor
from cluster import placement
from cluster.metrics import ServeMetrics
from cluster.orchestrator import CONTROL_GROUP
from cluster.schema import Resources, ServeArgs
from cluster.server import Server
from cluster.tiny import materialise
from specdec.models.drafters import DRAFTERS
from specdec.models.preverifier import UNTRAINED
from specdec.models.registry import is_registry_ref
from specdec.models.sources import NAMED_SOURCES
from specdec.models.suffix_index import read_config
from specdec.runtime.plan import omp_env

BUILT_IN = {*DRAFTERS.named(), UNTRAINED}  # drafter / pre-verifier kinds with no files


def runtime_env(args: ServeArgs) -> dict:
    """What every process of the app needs in its environment: OpenMP's wait policy, which it
    reads when torch loads, before any of the actor's code runs (``omp_env``); the MLflow store,
    if set."""
    env = omp_env(args.omp_wait_policy)
    if args.mlflow_tracking_uri is not None:
        env["MLFLOW_TRACKING_URI"] = args.mlflow_tracking_uri
    return {"env_vars": env} if env else {}


def actor_options(resources: Resources, args: ServeArgs, bundle: int | None = None) -> dict:
    """Ray options of an actor with ``resources``, started in ``bundle`` of the caller's placement
    group when one is given (``cluster.placement.in_bundle``)."""
    # A crashed actor restarts (reloading its model) without end, in the same bundle; calls are
    # not retried, since the restarted actor holds no per-request state: the requests in flight
    # fail, later ones run.
    options = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus,
               "resources": dict(resources.resources), "max_restarts": -1,
               "max_task_retries": 0, "runtime_env": runtime_env(args)}
    if resources.accelerator_type is not None:
        options["accelerator_type"] = resources.accelerator_type
    return options | (placement.in_bundle(bundle) if bundle is not None else {})


def actor_class(cls: type, calls: int = 1):
    """``cls`` as a Ray actor class running up to ``calls`` calls at once (serving gives it one
    per request that may hold state, and a few for closes, so concurrent calls meet in the
    actor's batching scheduler); state reads (``cluster.orchestrator.control``) get a thread
    of their own."""
    return ray.remote(concurrency_groups={CONTROL_GROUP: 1}, max_concurrency=calls)(cls)


def device_of(resources: Resources) -> str:
    """An actor given a GPU share runs its model on the GPU Ray assigned it."""
    return "cuda" if resources.num_gpus > 0 else "cpu"


class RemoteDrafter:
    """The target actor's client of its drafter actor (``actors.target.DrafterClient``): Ray
    calls from the target's call threads, never its model thread; a draft call of each request
    in flight at once, so they meet in the drafter's scheduler."""

    def __init__(self, handle):
        self.handle = handle  # Ray actor handle of a DrafterActor

    def open(self, rid: str, prompt_ids: list[int], features, params) -> None:
        ray.get(self.handle.open.remote(rid, prompt_ids, features, params))

    def draft(self, rid: str, limit: int, commit):
        return ray.get(self.handle.draft.remote(rid, limit, commit))

    def close(self, rid: str) -> None:
        self.handle.close.remote(rid)

    def close_all(self) -> None:
        ray.get(self.handle.close_all.remote())


def spawn_actors(args: ServeArgs):
    """Start the target actor and, for a drafter that runs in an actor of its own (see
    ``ServeArgs.drafter_placement``), the drafter actor first, the target's callee, each in its
    bundle of the replica's placement group; return both handles (None: no drafter actor; the
    replica reads the drafter actor's state, the target makes its calls)."""
    ttl = args.limits.idle_ttl_s
    batching, calls = args.batching.actor_config(), args.limits.kv_slots + 8
    drafter_actor = None
    if args.drafter_actor:
        drafter_actor = actor_class(DrafterActor, calls).options(
            **actor_options(args.drafter_resources, args, placement.DRAFTER_BUNDLE)).remote(
            args.drafter, args.target, args.preverifier, args.dtype,
            args.drafter_resources.threads, ttl, device_of(args.drafter_resources),
            args.suffix.model_dump(), args.block_drafter, batching)
    local = ({"drafter": args.drafter, "suffix": args.suffix.model_dump(),
              "acceptance": args.acceptance} if args.drafter_on_target else None)
    target_actor = actor_class(TargetActor, calls).options(
        **actor_options(args.target_resources, args, placement.TARGET_BUNDLE)).remote(
        args.target, args.block_drafter if args.drafter == "hybrid" else args.drafter, args.dtype,
        args.target_resources.threads, ttl, device_of(args.target_resources), args.limits.kv_slots,
        batching, local, args.attention, args.linears, args.kv_cache_dtype, args.max_model_len,
        args.backend, args.isa, None if drafter_actor is None else RemoteDrafter(drafter_actor),
        threads_by_load=args.threads_by_load)
    return target_actor, drafter_actor


def resolve_references(args: ServeArgs) -> ServeArgs:
    """Build ``tiny:`` references into local directories (a no-op for every other kind), then
    check that every model comes from an allowed source."""
    resolved = args.model_copy(update={
        "target": materialise(args.target), "drafter": materialise(args.drafter),
        "preverifier": materialise(args.preverifier),
        "block_drafter": materialise(args.block_drafter),
        "acceptance": materialise(args.acceptance),
        "model_id": args.served_model_id,
    })
    for ref in (resolved.target, resolved.drafter, resolved.preverifier, resolved.block_drafter,
                resolved.suffix.index, resolved.acceptance):
        check_source(ref, resolved.model_roots)
    if resolved.suffix.index and not is_registry_ref(resolved.suffix.index):
        read_config(Path(resolved.suffix.index))  # a malformed index fails here, at build time
    return resolved


def check_source(ref: str | None, roots: tuple[str, ...]) -> None:
    """Models load only from a named source, the MLflow registry (``models:/``), or a local
    directory (under one of ``roots`` when any are given); never from a hub id or elsewhere."""
    if ref is None or ref in BUILT_IN or ref in NAMED_SOURCES or is_registry_ref(ref):
        return
    path = Path(ref).expanduser().resolve()
    if not path.is_dir():
        raise ValueError(f"model reference {ref!r} is not a named source, a models:/ registry "
                         "reference, or an existing local directory")
    if roots and not any(path.is_relative_to(Path(r).expanduser().resolve()) for r in roots):
        raise ValueError(f"model directory {path} is outside the allowed model_roots {list(roots)}")


class ServedServer(Server):
    """``Server`` as a Serve ingress, observed by Ray metrics. Serve calls the ASGI hook on the
    replica after ``__init__``."""

    def __init__(self, args: dict, spawn):
        super().__init__(args, spawn, observer=ServeMetrics(args["model_id"]))

    def __serve_build_asgi_app__(self):
        return self.asgi_app()


def build_app(args: dict) -> serve.Application:
    config = resolve_references(ServeArgs.model_validate(args))
    limit = config.limits.max_concurrent_requests
    replicas = ({"autoscaling_config": config.autoscaling_config}
                if config.autoscaling_config is not None else {"num_replicas": config.num_replicas})
    bundles = placement.bundles(config)
    if config.check_placement and ray.is_initialized():
        placement.check(bundles, config.placement_strategy, placement.alive_nodes())
    deployment = serve.deployment(
        serve.ingress()(ServedServer), name="specdec", **replicas,
        # Serve lets a few more in than the limit, so the server itself answers them with a
        # JSON 503 instead of Serve queueing them.
        max_ongoing_requests=limit + 8,
        ray_actor_options={"num_cpus": config.server_num_cpus, "runtime_env": runtime_env(config)},
        placement_group_bundles=[b.resources for b in bundles],
        placement_group_strategy=config.placement_strategy,
    )
    return deployment.bind(config.model_dump(), spawn_actors)
