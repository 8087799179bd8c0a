"""Idle leases on per-request state: when each open request was last touched, and which ones
have been idle longer than a time-to-live.

A client that vanishes without a cancel (a crashed orchestrator, a lost network) would otherwise
leave its KV cache in an actor forever. This module only keeps the clock; the actor frees state.
``require_state`` names the two ways a request can lose its state mid-flight.
"""

from __future__ import annotations

import time


class Leases:
    def __init__(self, ttl_s: float, clock=time.monotonic):
        self.ttl_s = ttl_s
        self.clock = clock
        self.touched: dict[str, float] = {}

    def touch(self, rid: str) -> None:
        self.touched[rid] = self.clock()

    def drop(self, rid: str) -> None:
        self.touched.pop(rid, None)

    def expired(self) -> list[str]:
        """Request ids idle for longer than the TTL (none when the TTL is not positive)."""
        if self.ttl_s <= 0:
            return []
        now = self.clock()
        return [rid for rid, t in self.touched.items() if now - t > self.ttl_s]


class LostState(LookupError):
    """A round arrived for a request this actor holds no state for."""


def require_state(requests, rid: str) -> None:
    if rid not in requests:
        raise LostState(f"request {rid} has no state in this actor: it was idle past the TTL, "
                        "or the actor restarted; retry the request")
