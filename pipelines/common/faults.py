"""Fault injection for the training jobs' tests: one worker dies once, as if killed.

What this is: ``maybe_fail``, called by a training loop before each step with the config's
``fail_at_step``. It is for tests of recovery (Ray Train's ``FailureConfig`` restarting the
worker group from the last checkpoint); a config that leaves ``fail_at_step`` unset never fails.
What it is not: no retry logic; Ray Train owns recovery.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER = ".injected-failure"  # in the run directory: the failure has happened, never again


def maybe_fail(run_dir: Path, fail_at_step: int | None, step: int, rank: int, world: int,
               in_worker: bool) -> None:
    """At 0-based ``step == fail_at_step``, once per run directory, the last worker (rank
    ``world - 1``) exits abruptly; the others are left to find their peer gone. In the driver
    (``in_worker`` false: num_workers 0) the loop raises instead, so the driver survives."""
    marker = run_dir / MARKER
    if fail_at_step != step or rank != world - 1 or marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    if in_worker:
        os._exit(1)
    raise RuntimeError(f"injected failure at step {step} (fail_at_step)")
