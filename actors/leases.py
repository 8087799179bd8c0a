"""Idle leases on per-request state: when each open request was last touched, and which ones
have been idle longer than a time-to-live.

A client that vanishes without a cancel (a crashed orchestrator, a lost network) would otherwise
leave its KV cache in an actor forever. This module only keeps the clock; the actor frees state.
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
