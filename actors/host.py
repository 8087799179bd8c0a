"""What both actors share: hosting many requests' state over one worker, with idle leases.

``RequestHost`` frees a request on ``close``, on any error in one of its calls, and when it has
been idle past the TTL (``sweep``); it reports which requests hold state and the process's
memory. Subclasses set ``self.worker`` (a core worker with a ``requests`` dict and ``close``),
``self.scheduler`` (the ``actors.scheduler`` loop that runs the worker's calls, and frees) and
``self.leases``.
"""

from __future__ import annotations

from actors.leases import Leases
from actors.process import process_info
from actors.scheduler import BatchLoop


class RequestHost:
    worker: object
    scheduler: BatchLoop
    leases: Leases

    def close(self, rid: str) -> None:
        """The caller ends the request (finish, cancel, reaper): freed, its id remembered."""
        self.scheduler.close(rid)
        self.leases.drop(rid)

    def close_all(self) -> list[str]:
        """Free every request held (its caller restarted: none of them can go on); return
        their ids."""
        held = self.active()
        for rid in held:
            self.close(rid)
        return held

    def sweep(self) -> list[str]:
        """Free requests idle for longer than the TTL; return their ids."""
        stale = self.leases.expired()
        for rid in stale:
            self.close(rid)
        return stale

    # ``active`` and ``process`` may run on a control thread beside the model calls (see
    # cluster.orchestrator.CONTROL_GROUP): they only read, and copying a dict's keys is atomic
    # under the GIL.
    def active(self) -> list[str]:
        return sorted(list(self.worker.requests))

    def process(self) -> dict:
        """This actor's process id and resident memory (load tests watch it for leaks)."""
        return process_info()

    def free(self, rid: str) -> None:
        """Free a request after one of its calls failed; its id may be opened again."""
        self.scheduler.close(rid, final=False)
        self.leases.drop(rid)

    def _guarded(self, rid: str, fn, *args):
        """Run one call of a request: renew its lease on success, free its state on error."""
        try:
            out = fn(*args)
        except Exception:
            self.free(rid)  # an error ends the request
            raise
        self.leases.touch(rid)
        return out
