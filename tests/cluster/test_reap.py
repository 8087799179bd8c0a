"""Orphaned request state (held by an actor, no loop running for it) is freed by ``reap``; state
of running requests is left alone. Real Ray actors on the session's cluster."""

from __future__ import annotations

import asyncio

from actors.target import TargetActor
from cluster.orchestrator import Orchestrator
from specdec.engine.settings import GenerationParams


def test_reap_frees_orphans_only(ray_cluster, tiny_llama):
    import ray

    target = ray.remote(TargetActor).options(num_cpus=0).remote(tiny_llama["target"], "ngram",
                                                                 "float64")
    try:
        for rid in ("orphan", "running"):
            ray.get(target.open.remote(rid, [1, 2, 3], GenerationParams()))
        orchestrator = Orchestrator(target, None, frozenset())
        orchestrator.live.add("running")  # as if its loop were mid-round
        assert asyncio.run(orchestrator.reap()) == ["orphan"]
        assert ray.get(target.active.remote()) == ["running"]  # the close ran before this call
        assert asyncio.run(orchestrator.reap()) == []
    finally:
        ray.kill(target)
