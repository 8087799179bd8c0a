"""Threads by load (``specdec.runtime.threads``): the governor runs each pass at the faster count
and tries the other as its docstring says, the idle clock reads the kernel's counters, the plan
turns it on only where a pass's bits do not depend on its threads, and a pass on int8 rows gives
the same logits on one thread as on two (so the choice never changes a token)."""

from __future__ import annotations

import pytest
import torch

from specdec.models.tiny import tiny_config
from specdec.runtime import threads as governed
from specdec.runtime.plan import PlanError, RuntimeConfig, resolve_plan
from specdec.runtime.threads import EXPLORE, PATIENCE, IdleClock, ThreadGovernor
from tests.runtime.test_plan_auto import AVX512, plan_on

FAST, SLOW = 0.005, 0.007  # seconds of a pass on two threads alone, and on one


class Idle:
    """An idle clock that says what the test sets."""

    def __init__(self):
        self.free = False

    def room(self) -> bool:
        return self.free


def drive(g: ThreadGovernor, seconds, passes: int) -> str:
    """``passes`` one-token passes, each taking ``seconds[threads]``; the counts run, as a string
    with a ``T`` before each try."""
    out = []
    for _ in range(passes):
        n, tried = g.choose(1)
        g.record(1, n, seconds[n], tried)
        out.append(("T" if tried else "") + str(n))
    return "".join(out)


def test_alone_it_runs_every_thread_and_tries_one_rarely():
    g = ThreadGovernor(2, Idle())
    run = drive(g, {2: FAST, 1: SLOW}, EXPLORE + PATIENCE + 2)
    assert run.startswith("T2" + "2" * (EXPLORE - 1) + "T1" + "2")  # learns one thread's speed
    assert run.count("T1") == 2 and g.passes[1] == 2  # then once in PATIENCE passes


def test_a_neighbour_moves_it_to_one_thread_at_once_and_back_when_the_cpus_idle():
    idle = Idle()
    g = ThreadGovernor(2, idle)
    drive(g, {2: FAST, 1: SLOW}, EXPLORE + 1)
    crowded = {2: 0.05, 1: SLOW}  # beside a busy process, two threads wait for each other
    run = drive(g, crowded, 200)
    assert run.startswith("21")  # one slow pass on two threads, then one thread
    assert g.passes[2] < EXPLORE + 10  # tried seldom: it lost by far
    idle.free = True  # the neighbour has gone
    run = drive(g, {2: FAST, 1: SLOW}, 3)
    assert run == "T222"  # tried at once, and it won


def test_a_brief_slowdown_beside_it_keeps_every_thread():
    """A pass or two slowed by a neighbour's short work (a served replica's) is no reason to
    give up threads: the mean must pass ``SWITCH`` times one thread's."""
    g = ThreadGovernor(2, Idle())
    drive(g, {2: FAST, 1: SLOW}, EXPLORE + 1)
    assert drive(g, {2: 1.5 * SLOW, 1: SLOW}, 2) + drive(g, {2: FAST, 1: SLOW}, 5) == "2" * 7


def test_tries_prompted_by_idle_cpus_back_off_while_they_lose():
    """Idle CPUs that do not make two threads faster (a CPU quota): each losing try doubles
    the passes before the next; a win starts them over."""
    idle = Idle()
    g = ThreadGovernor(2, idle)
    drive(g, {2: FAST, 1: SLOW}, EXPLORE + 1)
    drive(g, {2: 0.05, 1: SLOW}, 2)  # on one thread now
    idle.free = True
    run = drive(g, {2: 0.02, 1: SLOW}, 31)
    assert run == "T2" + "".join("1" * (wait - 1) + "T2" for wait in (2, 4, 8, 16))
    assert drive(g, {2: FAST, 1: SLOW}, 33) == "1" * 31 + "T22" and g.room_wait == 1


def test_it_sets_torchs_threads_for_each_pass():
    g = ThreadGovernor(2, Idle())
    before = torch.get_num_threads()
    try:
        seen = [g.run(1, torch.get_num_threads) for _ in range(EXPLORE + 1)]
        assert seen[0] == 2 and seen[-1] == 1  # the first try of one thread
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="between 1 and more"):
        ThreadGovernor(1)


def test_the_idle_clock_reads_the_idle_ticks_of_its_cpus(tmp_path, monkeypatch):
    stat = tmp_path / "stat"

    def write(idle0: int, idle1: int, idle2: int):
        lines = ["cpu  1 2 3 999 0 0 0"] + [f"cpu{i} 1 2 3 {t} 5 0 0" for i, t in
                                             enumerate((idle0, idle1, idle2))]
        stat.write_text("\n".join(lines + ["intr 1 2", "ctxt 3"]) + "\n")

    clock = IdleClock(stat, cpus={0, 1})
    now = [100.0]
    monkeypatch.setattr(governed.time, "perf_counter", lambda: now[0])
    write(0, 0, 0)
    assert not clock.room()  # a first look has nothing to compare with
    now[0] += 1.0
    write(clock.tick // 4, 0, 10 * clock.tick)  # a quarter of a CPU of its own idle: busy
    assert not clock.room()
    now[0] += governed.IDLE_LOOK / 2
    assert not clock.room()  # too soon to look again
    now[0] += 1.0
    write(clock.tick, clock.tick // 4, 10 * clock.tick)
    assert clock.room()
    assert IdleClock(tmp_path / "none").idle_seconds() is None


def test_the_plan_governs_threads_only_where_a_passs_bits_do_not_depend_on_them(monkeypatch):
    plan = plan_on(monkeypatch, AVX512, threads=2)  # int8 rows, the attention kernel
    assert plan.threads_by_load and "2 torch threads (or 1, by load)" in plan.describe()
    assert any(r.startswith("threads_by_load auto: on") for r in plan.reasons)
    assert not plan_on(monkeypatch, AVX512, threads=2, threads_by_load="off").threads_by_load
    one = plan_on(monkeypatch, AVX512, threads=1)
    assert not one.threads_by_load and any("there is one thread" in r for r in one.reasons)
    onednn = plan_on(monkeypatch, AVX512, blocks=False, threads=2, linears="onednn")
    assert not onednn.threads_by_load
    torch_plan = resolve_plan(RuntimeConfig("cpu", "float32", "torch", max_model_len=64,
                                            threads=2), tiny_config())
    assert not torch_plan.threads_by_load
    with pytest.raises(PlanError, match="threads_by_load: on, but a pass's bits could depend"):
        resolve_plan(RuntimeConfig("cpu", "float32", "torch", max_model_len=64, threads=2,
                                   threads_by_load="on"), tiny_config())
    with pytest.raises(PlanError, match="threads_by_load must be one of"):
        RuntimeConfig(threads_by_load="yes")
