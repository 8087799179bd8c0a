"""A full KV pool in a real Ray target actor reaches the server as a 503, and frees nothing
it should not: the first request keeps its slot, the refused one holds no state (asked for one
call at a time or as a request the target runs whole)."""

from __future__ import annotations

import pytest

from actors.target import TargetActor
from cluster.server import failure
from specdec.engine.settings import GenerationParams
from specdec.runtime import PoolFull


def test_a_full_pool_is_a_503(ray_cluster, tiny_llama):
    ray = ray_cluster
    actor = ray.remote(TargetActor).options(num_cpus=0.25).remote(
        tiny_llama["target"], "none", "float64", 1, 600.0, "cpu", 1)
    ray.get(actor.open.remote("a", [1, 2, 3], GenerationParams()))
    with pytest.raises(PoolFull) as refused:
        ray.get(actor.open.remote("b", [4, 5], GenerationParams()))
    error = failure(refused.value)
    assert error.status == 503 and "KV cache slots" in str(error.body())
    assert ray.get(actor.active.remote()) == ["a"]
    rounds = actor.rounds.options(num_returns="streaming").remote("c", [4, 5], GenerationParams())
    with pytest.raises(PoolFull):  # a request the target runs whole: the stream's first answer
        ray.get(next(rounds))
    assert ray.get(actor.active.remote()) == ["a"]
    ray.get(actor.close.remote("a"))
    ray.get(actor.open.remote("b", [4, 5], GenerationParams()))  # the freed slot is reused
    assert failure(ValueError("boom")).status == 500
    ray.kill(actor)
