"""Orphaned request state (held by an actor, no loop running for it) is freed by ``reap``; state
of running requests is left alone; reads of that state answer while a model call is running.
Real Ray actors on the session's cluster."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from actors.drafter import DrafterActor
from actors.target import TargetActor
from cluster.app import actor_class, actor_options
from cluster.orchestrator import Orchestrator, control
from cluster.schema import Resources, ServeArgs
from specdec.engine.settings import GenerationParams
from specdec.engine.workers import Draft


class BusyTarget(TargetActor):
    """A target actor whose ``busy`` holds the model thread, as a long queue of rounds would."""

    def __init__(self, *args):
        super().__init__(*args)
        self.released = threading.Event()

    def busy(self, seconds: float) -> bool:
        return self.released.wait(seconds)  # True: released before the time ran out

    def release(self) -> None:
        self.released.set()


@pytest.fixture(scope="module")
def target(ray_cluster, tiny_llama):
    import ray

    options = actor_options(Resources(num_cpus=0), ServeArgs(target=tiny_llama["target"]))
    actor = actor_class(BusyTarget).options(**options).remote(tiny_llama["target"], "ngram",
                                                              "float64")
    yield actor
    ray.kill(actor)


def test_reap_frees_orphans_only(target):
    import ray

    for rid in ("orphan", "running"):
        ray.get(target.open.remote(rid, [1, 2, 3], GenerationParams()))
    orchestrator = Orchestrator(target)
    orchestrator.live.add("running")  # as if its loop were mid-round
    assert asyncio.run(orchestrator.reap()) == ["orphan"]
    assert ray.get(target.active.remote()) == ["running"]  # the close ran before this call
    assert asyncio.run(orchestrator.reap()) == []
    ray.get(target.close.remote("running"))


def test_reap_frees_an_orphan_of_the_drafter_actor_through_the_target(ray_cluster, tiny_llama):
    """State left in the drafter actor alone: the replica reads it there, and its close goes
    to the target, which closes the request on its drafter actor."""
    import ray

    from cluster.app import RemoteDrafter

    options = actor_options(Resources(num_cpus=0), ServeArgs(target=tiny_llama["target"]))
    drafter = actor_class(DrafterActor).options(**options).remote("ngram", tiny_llama["target"])
    target = actor_class(TargetActor).options(**options).remote(
        tiny_llama["target"], "ngram", "float64", drafter=RemoteDrafter(drafter))
    try:
        ray.get(target.info.remote())  # started: it frees what the drafter held before
        ray.get(drafter.open.remote("orphan", [1, 2, 3], None, GenerationParams()))
        orchestrator = Orchestrator(target, drafter)
        assert asyncio.run(orchestrator.reap()) == ["orphan"]
        deadline = time.monotonic() + 60
        while ray.get(control(drafter.active).remote()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ray.get(control(drafter.active).remote()) == []
    finally:
        ray.kill(target)
        ray.kill(drafter)


def test_state_reads_do_not_wait_behind_model_calls(target):
    import ray

    ray.get(target.open.remote("held", [1, 2, 3], GenerationParams()))
    busy = target.busy.remote(120)
    queued = target.verify.remote("held", Draft([], None))  # behind busy, in the model thread
    try:
        # answered while busy holds the model thread (else these time out)
        assert ray.get(control(target.active).remote(), timeout=60) == ["held"]
        assert ray.get(control(target.process).remote(), timeout=60)["rss_bytes"] > 0
        assert ray.wait([busy, queued], timeout=0)[0] == []  # neither had run
    finally:
        ray.get(control(target.release).remote())
    assert ray.get(busy) is True
    assert len(ray.get(queued).result.tokens) == 1
    ray.get(target.close.remote("held"))
