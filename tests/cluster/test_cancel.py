"""Cancelling a request, as Serve does when a client leaves, still frees its state in both actors,
and ends the request's loop on the target actor.

Serve cancels the replica's task with ``ray.cancel`` (recursive, and sometimes more than once),
which also cancels the actor calls that task has pending. The orchestrator's ``close`` must
reach a target that is still busy with the request's last round, and the target's close must
reach its drafter actor. Real Ray actors on the session's cluster: an async front actor
(standing in for the Serve replica) runs one request's loop; a busy actor records what reaches
it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from actors.drafter import DrafterActor
from actors.target import TargetActor
from cluster.app import actor_class
from cluster.orchestrator import Orchestrator, control


class Recorder:
    """Records the calls that reach it; ``hold`` keeps its model thread busy for a while."""

    def __init__(self):
        self.calls: list[str] = []

    def hold(self, seconds: float) -> None:
        self.calls.append("hold")
        time.sleep(seconds)

    def close(self, rid: str) -> None:
        self.calls.append(f"close {rid}")

    def seen(self) -> list[str]:
        return list(self.calls)


class Front:
    """One request's loop as the replica runs it: a round is pending when the cancel comes."""

    def __init__(self, busy):
        self.busy = busy
        self.orchestrator = Orchestrator(busy)

    async def ready(self) -> bool:
        return True

    async def request(self, rid: str) -> None:
        try:
            await self.busy.hold.remote(3.0)
            await asyncio.sleep(60)
        finally:
            self.orchestrator.close(rid)


def calls(actor) -> list[str]:
    import ray

    return ray.get(control(actor.seen).remote(), timeout=60)


def wait_for(actor, call: str, within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if call in calls(actor):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(240)
def test_close_survives_repeated_cancellation(ray_cluster):
    import ray

    busy = actor_class(Recorder).options(num_cpus=0).remote()
    front = ray.remote(Front).options(num_cpus=0).remote(busy)
    try:
        assert ray.get(front.ready.remote(), timeout=180)  # a cold worker imports torch
        ref = front.request.remote("r1")
        assert wait_for(busy, "hold")  # the round is running on the busy actor
        ray.cancel(ref)
        time.sleep(0.05)
        ray.cancel(ref)  # a second, recursive cancel after the loop's finally has run
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=60)
        assert wait_for(busy, "close r1")  # it ran after the held round ended
    finally:
        for actor in (front, busy):
            ray.kill(actor)


class CountingTarget(TargetActor):
    """A target actor that counts each request's verifies (plain decoding: one a round)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.verifies: Counter[str] = Counter()

    def _verifying(self, rid: str, draft):
        self.verifies[rid] += 1
        return super()._verifying(rid, draft)

    def verified(self, rid: str) -> int:
        return self.verifies[rid]


class StreamedFront:
    """The replica's loop of one request on the target actor."""

    def __init__(self, target):
        self.orchestrator = Orchestrator(target)
        self.rounds = 0

    async def ready(self) -> bool:
        return True

    async def request(self, rid: str, prompt_ids: list[int], max_new_tokens: int,
                      leave_after: int | None = None, incremental: bool = True) -> list[int]:
        """Run the request; ``leave_after`` rounds: stop reading it then, as the server does
        at a stop string (the loop's ``finally`` closes it). ``incremental=False``: its answers
        come in one message at the end, as for a non-streamed request."""
        from contextlib import aclosing

        from cluster.orchestrator import Served
        from specdec.engine.settings import GenerationParams

        served = Served(prompt_ids, GenerationParams(max_new_tokens=max_new_tokens))
        self.rounds = 0  # of this request
        async with aclosing(self.orchestrator.run(rid, served, incremental)) as rounds:
            async for _ in rounds:
                self.rounds += 1
                if self.rounds == leave_after:
                    break
        return served.token_ids

    async def seen_rounds(self) -> int:
        """Rounds of the current request so far."""
        return self.rounds


def holds_nothing(actor, within_s: float = 60.0) -> bool:
    """Whether the actor holds no request's state, within ``within_s``."""
    import ray

    deadline = time.monotonic() + within_s
    while ray.get(control(actor.active).remote(), timeout=60):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def cancel_when(ref, rounds, at_least: int = 10) -> None:
    """Cancel the request ``ref`` once ``rounds()`` (a ref to its rounds so far) reaches
    ``at_least``; it must then end cancelled."""
    import ray

    deadline = time.monotonic() + 60
    while ray.get(rounds(), timeout=60) < at_least:
        assert time.monotonic() < deadline, "the request never got going"
        time.sleep(0.01)
    ray.cancel(ref)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(ref, timeout=60)


@pytest.mark.timeout(240)
def test_a_request_on_the_target_ends_when_left_or_cancelled(ray_cluster, tiny_llama):
    """The target's round loop of the request (``TargetActor.rounds``) has a round in flight
    when the replica stops reading the request (a stop string) or when the replica's task is
    cancelled (Ray's recursive cancel reaches the loop too): either way the loop ends long
    before its 200 rounds, and the actor holds nothing; a request run to its end frees itself."""
    import ray

    target = actor_class(CountingTarget, 8).options(num_cpus=0).remote(
        tiny_llama["target"], "none", "float64")
    front = ray.remote(StreamedFront).options(num_cpus=0).remote(target)
    prompt = [5, 6, 7, 8, 9]  # no EOS within 200 tokens
    try:
        assert ray.get(front.ready.remote(), timeout=180)
        assert len(ray.get(front.request.remote("done", prompt, 8), timeout=120)) == 8
        assert holds_nothing(target)
        ray.get(front.request.remote("left", prompt, 200, 4), timeout=120)
        assert holds_nothing(target)
        assert ray.get(control(target.verified).remote("left"), timeout=60) < 100  # it stopped
        cancel_when(front.request.remote("cancelled", prompt, 200),
                    front.seen_rounds.remote)  # well into its rounds
        assert holds_nothing(target)
        assert ray.get(control(target.verified).remote("cancelled"), timeout=60) < 100
        # answered in one message at the end: cancelled while the target runs its rounds
        assert len(ray.get(front.request.remote("whole", prompt, 8, None, False), timeout=120)) == 8
        assert holds_nothing(target)  # freed by the target's own loop: no close was sent
        cancel_when(front.request.remote("cancelled-whole", prompt, 200, None, False),
                    lambda: control(target.verified).remote("cancelled-whole"))
        assert holds_nothing(target)
        assert ray.get(control(target.verified).remote("cancelled-whole"), timeout=60) < 100
    finally:
        for actor in (front, target):
            ray.kill(actor)


@pytest.mark.timeout(240)
def test_a_cancel_frees_the_request_on_the_targets_drafter_actor(ray_cluster, tiny_llama):
    """With a drafter actor (the target's callee): a request left at a stop string, or cancelled
    mid-way, holds no state in either actor; one run to its end frees both itself."""
    import ray

    from cluster.app import RemoteDrafter
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_pair
    from specdec.engine.settings import GenerationParams

    ref = tiny_llama["block-drafter"]
    drafter = actor_class(DrafterActor, 8).options(num_cpus=0).remote(
        ref, tiny_llama["target"], None, "float64")
    target = actor_class(CountingTarget, 8).options(num_cpus=0).remote(
        tiny_llama["target"], ref, "float64", drafter=RemoteDrafter(drafter))
    front = ray.remote(StreamedFront).options(num_cpus=0).remote(target)
    prompt = [5, 6, 7, 8, 9]
    try:
        assert ray.get(front.ready.remote(), timeout=180)
        got = ray.get(front.request.remote("done", prompt, 12), timeout=120)
        pair = load_pair(tiny_llama["target"], ref, dtype="float64")
        params = GenerationParams(max_new_tokens=12)
        assert got == Engine(pair.target, pair.drafter).generate(prompt, params).token_ids
        assert holds_nothing(target) and holds_nothing(drafter)
        ray.get(front.request.remote("left", prompt, 200, 2), timeout=120)
        assert holds_nothing(target) and holds_nothing(drafter)
        cancel_when(front.request.remote("cancelled", prompt, 200), front.seen_rounds.remote, 3)
        assert holds_nothing(target) and holds_nothing(drafter)
        assert ray.get(control(target.verified).remote("cancelled"), timeout=60) < 100
    finally:
        for actor in (front, target, drafter):
            ray.kill(actor)
