"""Cancelling a request, as Serve does when a client leaves, still frees its state in both actors.

Serve cancels the replica's task with ``ray.cancel`` (recursive, and sometimes more than once),
which also cancels the actor calls that task has pending. The orchestrator's ``close`` must
reach an actor that is still busy with the request's last round. Real Ray actors on the
session's cluster: an async front actor (standing in for the Serve replica) runs one
request's loop; a busy and an idle actor record what reaches them.
"""

from __future__ import annotations

import asyncio
import time

import pytest

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

    def __init__(self, busy, idle):
        self.busy = busy
        self.orchestrator = Orchestrator(busy, idle, frozenset())

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

    recorder = actor_class(Recorder).options(num_cpus=0)
    busy, idle = recorder.remote(), recorder.remote()
    front = ray.remote(Front).options(num_cpus=0).remote(busy, idle)
    try:
        assert ray.get(front.ready.remote(), timeout=180)  # a cold worker imports torch
        ref = front.request.remote("r1")
        assert wait_for(busy, "hold")  # the round is running on the busy actor
        ray.cancel(ref)
        time.sleep(0.05)
        ray.cancel(ref)  # a second, recursive cancel after the loop's finally has run
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=60)
        assert wait_for(idle, "close r1")
        assert wait_for(busy, "close r1")  # it ran after the held round ended
    finally:
        for actor in (front, busy, idle):
            ray.kill(actor)
