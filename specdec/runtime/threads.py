"""Threads by load: each forward pass runs on one thread or on all the plan's, whichever is
faster now.

A pass shares its work among OpenMP's threads, which meet at the end of every parallel region.
Beside a busy process one of them waits for a core and the others wait for it, so a pass on
every CPU can run several times slower than on one (docs/RESULTS.md#runtime), while alone it is
the faster. ``ThreadGovernor`` times every pass and keeps, per size (new tokens, in powers of
two), a running mean of a pass's seconds at each count. A pass runs at the faster count, and now
and then at the other (a *try*), to see whether the load changed:

- on every thread, a neighbour shows itself: the passes slow down, their mean passes
  ``SWITCH`` times one thread's, and the next pass runs on one (beside a busy process a pass on
  every thread takes several times one thread's; a served replica's own brief work beside the
  target slows a pass by far less, and must not cost it its threads). So one thread is tried
  only every ``PATIENCE`` passes (and once early, to know its speed);
- on one thread, nothing shows that the neighbour has gone but a try, and a try beside a busy
  process can cost many passes: every thread is tried after a number of passes that grows with
  the square of how far it lost, at most ``PATIENCE``; and sooner when the CPUs this process may
  use sat idle since the last look (the neighbour seems gone), unless such tries kept losing
  (a CPU quota, not a neighbour, may be what holds the threads back): each that loses doubles
  the passes before the next (``room_wait``), one that wins starts them over.

A try that wins (its count would now be chosen, by the same ``SWITCH``) replaces its count's
mean, so the next pass runs at that count (a mean left high by a busier spell must not keep a
count away); one that loses weighs ``TRY_WEIGHT`` in it (a pass beside a busy process
takes anything from one pass's time to many, and one lucky try must not bring the next soon).

It changes how fast a pass runs, never what it computes, only where the plan's passes give the
same bits on any number of threads (``threads_by_load`` in ``specdec.runtime.plan``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

EXPLORE = 64  # passes between tries of the other count while both are as fast
PATIENCE = 1024  # the most passes between tries, however far the other count lost
WEIGHT = 0.3  # a pass's weight in its count's running mean
TRY_WEIGHT = 0.5  # a losing try's
SWITCH = 1.25  # how much slower than one thread every thread must run to give way
IDLE_LOOK = 0.05  # seconds between looks at the CPUs' idle time
IDLE_SHARE = 0.5  # idle CPUs (on average, in CPUs) that say more threads would find a core
STAT = Path("/proc/stat")

T = TypeVar("T")


class IdleClock:
    """The idle time of the CPUs this process may run on, from the kernel's ``/proc/stat``
    (idle and iowait); ``room()`` says whether they sat idle ``IDLE_SHARE`` of a CPU on average
    since its last look."""

    def __init__(self, stat: Path = STAT, cpus: set[int] | None = None):
        self.stat = stat
        cpus = os.sched_getaffinity(0) if cpus is None else cpus
        self.names = {f"cpu{i}" for i in cpus}
        self.tick = os.sysconf("SC_CLK_TCK")
        self.last: tuple[float, float] | None = None  # (when, idle seconds then)

    def idle_seconds(self) -> float | None:
        try:
            lines = self.stat.read_text().splitlines()
        except OSError:
            return None
        ticks = 0
        for line in lines[1:]:  # the first line sums every CPU
            if not line.startswith("cpu"):
                break
            name, *counts = line.split()
            if name in self.names:
                ticks += int(counts[3]) + int(counts[4])
        return ticks / self.tick

    def room(self) -> bool:
        now = time.perf_counter()
        if self.last is not None and now - self.last[0] < IDLE_LOOK:
            return False
        idle = self.idle_seconds()
        if idle is None:
            return False
        last, self.last = self.last, (now, idle)
        return last is not None and (idle - last[1]) / (now - last[0]) >= IDLE_SHARE


class ThreadGovernor:
    """Runs each pass at 1 or ``most`` threads (see the module's docstring). ``passes`` counts
    the passes run at each."""

    def __init__(self, most: int, idle: IdleClock | None = None):
        if most < 2:
            raise ValueError(f"threads by load choose between 1 and more threads, got {most}")
        self.most = most
        self.idle = IdleClock() if idle is None else idle
        self.mean: dict[tuple[int, int], float] = {}  # (size class, threads) -> seconds
        self.since = 0  # passes since the last try
        self.room_wait = 1  # passes before idle CPUs may prompt a try of every thread
        self.room_try = False  # whether the try running is one idle CPUs prompted
        self.passes = {1: 0, most: 0}

    def choose(self, tokens: int) -> tuple[int, bool]:
        """The thread count of a pass of ``tokens`` new tokens, and whether it is a try."""
        size = tokens.bit_length()
        full, one = self.mean.get((size, self.most)), self.mean.get((size, 1))
        if full is None:
            return self.most, True
        self.since += 1
        if one is None:
            due, best, other = self.since >= EXPLORE, self.most, 1
        elif full <= SWITCH * one:
            due, best, other = self.since >= PATIENCE, self.most, 1
        else:
            lost = full / one  # > SWITCH
            due = self.since >= min(PATIENCE, EXPLORE * lost * lost)
            self.room_try = not due and self.since >= self.room_wait and self.idle.room()
            due, best, other = due or self.room_try, 1, self.most
        if due:
            self.since = 0
            return other, True
        return best, False

    def record(self, tokens: int, threads: int, seconds: float, tried: bool) -> None:
        size = tokens.bit_length()
        mean = self.mean.get((size, threads))
        other = self.mean.get((size, 1 if threads == self.most else self.most))
        # a try wins where its count would now be chosen: every thread within SWITCH times one
        # thread's time, one thread faster than every thread's by more than SWITCH
        won = tried and (other is None or (seconds <= SWITCH * other if threads == self.most
                                           else SWITCH * seconds < other))
        if tried and threads == self.most and other is not None:
            if won:  # idle CPUs may prompt a try at once again
                self.room_wait = 1
            elif self.room_try:
                self.room_wait = min(PATIENCE, 2 * self.room_wait)
        self.room_try = False
        if mean is None or won:
            self.mean[size, threads] = seconds
        else:
            self.mean[size, threads] = mean + (TRY_WEIGHT if tried else WEIGHT) * (seconds - mean)
        self.passes[threads] += 1

    def run(self, tokens: int, work: Callable[[], T]) -> T:
        """``work()`` (one pass of ``tokens`` new tokens) at the count chosen for it, which
        stays set after it: what the process does between passes (sampling, a drafter) runs on
        it too, and beside a busy process a parallel region on every thread is slow wherever it
        runs."""
        threads, tried = self.choose(tokens)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        start = time.perf_counter()
        out = work()
        self.record(tokens, threads, time.perf_counter() - start, tried)
        return out
