"""The gathering rule of ``actors.scheduler.BatchLoop``: how long a step waits for the work of
running requests. A loop whose step sleeps a known time stands in for a model, so the window
(``gather_share`` of the last step, at least ``gather_s``) is checked against fixed times."""

from __future__ import annotations

import threading
import time

import pytest

from actors.scheduler import (
    BatchingConfig,
    BatchLoop,
    DraftScheduler,
    Prefill,
    TargetScheduler,
    Verify,
    Work,
)
from specdec.engine.loading import load_pair
from specdec.engine.settings import GenerationParams
from specdec.engine.workers import Draft, DraftWorker, OpenRequest

STEP_S = 0.2


class Slots:
    """The worker side: which requests hold state."""

    def __init__(self):
        self.requests: dict[str, None] = {}

    def close(self, rid: str) -> None:
        self.requests.pop(rid, None)


class Sleeper(BatchLoop):
    """A step sleeps STEP_S and answers each item with the step's number."""

    name = "sleeper"

    def __init__(self, config: BatchingConfig, build=Slots):
        super().__init__(build, config)
        self.done = 0

    def execute(self, batch):
        time.sleep(STEP_S)
        self.done += 1
        for w, _ in batch:
            self.worker.requests[w.rid] = None
        return {w.rid: (self.done, 0) for w, _ in batch}


def second_steps(config: BatchingConfig, late_s: float) -> tuple[int, int]:
    """Two requests run a first step together; then one comes back at once and the other
    ``late_s`` later. Returns the step index each one's second item ran in."""
    loop = Sleeper(config)
    try:
        first = [loop.submit(Work(rid)) for rid in ("a", "b")]
        assert {f.result(5).value for f in first} == {1}  # both running now
        a = loop.submit(Work("a"))
        time.sleep(late_s)
        b = loop.submit(Work("b"))
        return a.result(5).value, b.result(5).value
    finally:
        loop.stop()


def test_a_straggler_within_the_share_of_the_last_step_joins_the_step():
    # window = 0.5 x 0.2 s = 100 ms: b, 40 ms late, is waited for
    a, b = second_steps(BatchingConfig(gather_s=0.001, gather_share=0.5), late_s=0.04)
    assert a == b == 2


def test_without_the_share_a_straggler_past_gather_s_runs_in_a_step_of_its_own():
    a, b = second_steps(BatchingConfig(gather_s=0.001, gather_share=0.0), late_s=0.04)
    assert (a, b) == (2, 3)


def test_the_window_never_waits_longer_than_the_share():
    # b comes 150 ms late, past the 100 ms window: a's step does not wait for it
    a, b = second_steps(BatchingConfig(gather_s=0.001, gather_share=0.5), late_s=0.15)
    assert (a, b) == (2, 3)


def test_work_queued_during_a_step_waits_for_the_requests_of_that_step():
    # b runs step 2 alone (a is away past the window); a's item arrives during that step.
    # When step 2 ends, a's item has waited longer than the window, yet the window counts from
    # the step's end: b, back 40 ms later, joins a in step 3 (the groups do not take turns).
    loop = Sleeper(BatchingConfig(gather_s=0.001, gather_share=0.5))
    try:
        assert {f.result(5).value for f in [loop.submit(Work(r)) for r in ("a", "b")]} == {1}
        b = loop.submit(Work("b"))
        time.sleep(0.15)  # b's window (100 ms) passes; step 2 runs until ~300 ms
        a = loop.submit(Work("a"))
        assert b.result(5).value == 2
        time.sleep(0.04)
        b = loop.submit(Work("b"))
        assert a.result(5).value == b.result(5).value == 3
    finally:
        loop.stop()


@pytest.mark.parametrize("share", [-0.1])
def test_a_negative_share_is_refused(share):
    with pytest.raises(ValueError, match="gather_share"):
        BatchingConfig(gather_share=share)


def test_the_worker_is_built_and_every_step_runs_on_the_scheduler_thread():
    # one model thread (actors.scheduler): OpenMP slows every forward once two threads run
    # model work, so neither the build nor any step may run on a caller's thread
    seen = []

    class Recorded(Sleeper):
        def execute(self, batch):
            seen.append(threading.current_thread())
            return super().execute(batch)

    def build():
        seen.append(threading.current_thread())
        return Slots()

    loop = Recorded(BatchingConfig(), build)
    try:
        assert loop.submit(Work("a")).result(5).value == 1
        assert seen == [loop.thread, loop.thread]
    finally:
        loop.stop()


def test_a_failing_build_raises_in_the_constructor():
    def build():
        raise FileNotFoundError("no such model")

    with pytest.raises(FileNotFoundError, match="no such model"):
        BatchLoop(build, BatchingConfig())


@pytest.mark.parametrize("drafter, gathers", [("ngram", False), ("suffix", False),
                                              ("block", True)])
def test_a_drafter_gathers_only_when_it_batches_forwards(tiny_llama, drafter, gathers):
    # a suffix or n-gram lookup costs the same in a step of its own: its round never waits
    # for the other requests; a block drafter's step waits for them (one forward for all)
    ref = tiny_llama["block-drafter"] if drafter == "block" else drafter
    pair = load_pair(tiny_llama["target"], ref, dtype="float64")
    loop = DraftScheduler(lambda: DraftWorker(pair.drafter), BatchingConfig(gather_s=0.5))
    try:
        assert loop.worker.batches is gathers
        assert loop.window() == (0.5 if gathers else 0.0)
    finally:
        loop.stop()


def test_prompts_are_cut_at_fixed_points_whatever_else_a_step_holds():
    # budget 8: a verify of 3 draft tokens (4 target tokens) leaves 4, yet the 20-token prompt's
    # first chunk is 8 tokens whenever it runs, so it waits for the next step, where it goes
    # first; its chunks are 8, 8, 4 (a batch-invariant runtime computes each the same in every
    # run only if the chunks are the same)
    loop = TargetScheduler(Slots, BatchingConfig(token_budget=8))
    try:
        prompt = Prefill("p", OpenRequest(list(range(20)), GenerationParams()))
        verify = Verify("v", Draft([1, 2, 3], None))
        assert [(w.rid, n) for w, n in loop.plan([verify, prompt])] == [("v", 4)]
        assert [(w.rid, n) for w, n in loop.plan([prompt, verify])] == [("p", 8)]
        chunks = []
        while prompt.cost:
            (_, n), = loop.plan([prompt])
            chunks.append(n)
            prompt.fed += n
        assert chunks == [8, 8, 4]
    finally:
        loop.stop()
