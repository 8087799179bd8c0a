"""The actor classes run as plain objects here: same tokens as the engine, state freed."""

from __future__ import annotations

import platform
import time

import pytest

from actors.drafter import DrafterActor
from actors.leases import Leases
from actors.target import TargetActor
from specdec.engine import rounds
from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair
from specdec.engine.settings import GenerationParams
from specdec.engine.workers import Draft
from specdec.runtime.plan import cpu_flags


def run_rounds(target_actor: TargetActor, drafter_actor: DrafterActor | None, prompt_ids, params,
               rid: str = "r1", steps: list | None = None) -> list[int]:
    """The orchestrator's driving of the round program, synchronously: open, then draft (with
    the previous round's commit) -> verify, with the load-aware draft cap the target sends;
    the target steps it ran in go to ``steps``. A target that drafts itself (``drafter_actor``
    None) takes each round in one ``round`` call."""
    program = rounds.RoundProgram(prompt_ids, params)
    machine = program.steps(target_actor.info().eos_token_ids)
    step, commit, verified = next(machine), None, None
    try:
        while not isinstance(step, rounds.Finish):
            answer = None
            if isinstance(step, rounds.Open):
                opened = target_actor.open(rid, prompt_ids, params)
                if drafter_actor is not None:
                    drafter_actor.open(rid, prompt_ids, opened.features, params)
                answer = rounds.Opened(opened.room, draft_cap=opened.draft_cap)
            elif isinstance(step, rounds.Propose) and drafter_actor is None:
                verified, commit = target_actor.round(rid, step.limit, commit), None
                answer = verified.draft
            elif isinstance(step, rounds.Propose):
                answer, commit = drafter_actor.draft(rid, step.limit, commit), None
            elif isinstance(step, rounds.Verify):
                if drafter_actor is not None:
                    verified = target_actor.verify(rid, step.draft)
                answer = rounds.Verified(verified.result, verified.room, verified.draft_cap)
                if steps is not None:
                    steps.append(verified.step)
            elif isinstance(step, rounds.Commit):
                commit = step  # sent with the next draft
            step = machine.send(answer)
    finally:
        target_actor.close(rid)
        if drafter_actor is not None:
            drafter_actor.close(rid)
    return program.token_ids


@pytest.mark.parametrize("drafter_name", ["ngram", "block-drafter", "drafter"])
def test_actors_give_engine_tokens(tiny_llama, drafter_name):
    ref = "ngram" if drafter_name == "ngram" else tiny_llama[drafter_name]
    target = TargetActor(tiny_llama["target"], ref, "float64")
    drafter = DrafterActor(ref, tiny_llama["target"], dtype="float64")
    pair = load_pair(tiny_llama["target"], ref, dtype="float64")
    ids = pair.target.tokenizer("abc abc abc abc")["input_ids"]
    params = GenerationParams(max_new_tokens=30)
    assert run_rounds(target, drafter, ids, params) == \
        Engine(pair.target, pair.drafter).generate(ids, params).token_ids
    assert target.active() == [] and drafter.active() == []


def replay(target_actor: TargetActor, prompt_ids, params, rid: str = "r1", every: int = 1):
    """The orchestrator's replay of a request the target runs whole (``TargetActor.rounds``):
    its answers, in order, through a program of our own (``rounds.drive``); returns its tokens,
    the messages' sizes so far and the stream of answers, which the program's last round has
    drained up to the actor's own finish."""
    program = rounds.RoundProgram(prompt_ids, params)
    sizes = []

    def flat():
        for message in target_actor.rounds(rid, prompt_ids, params, every):
            sizes.append(len(message))
            yield from message

    answers = flat()
    last = None  # the round whose draft answered the last Propose

    def answer(step):
        nonlocal last
        if isinstance(step, rounds.Open):
            return next(answers).answer()
        if isinstance(step, rounds.Propose):
            last = next(answers)
            assert len(last.draft.tokens) <= step.limit
            return last.draft
        return last.answer() if isinstance(step, rounds.Verify) else None

    for _ in rounds.drive(program.steps(target_actor.info().eos_token_ids), answer):
        pass
    return program.token_ids, sizes, answers


@pytest.mark.parametrize("every", [1, 3, 0])
@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_a_request_run_whole_on_the_target_gives_the_engine_tokens(tiny_llama, drafter, every):
    """Drafting on the target (n-gram) or decoding plainly: the target's own loop streams the
    answers a replaying program needs, ``every`` to a message (0: one message at the end), ends
    with that program's last round, and frees the request itself, with no close."""
    local = {"drafter": drafter} if drafter != "none" else None
    target = TargetActor(tiny_llama["target"], drafter, "float64", local_drafter=local)
    pair = load_pair(tiny_llama["target"], drafter, dtype="float64")
    ids = pair.target.tokenizer("abc abc abc abc")["input_ids"]
    params = GenerationParams(max_new_tokens=30)
    tokens, sizes, answers = replay(target, ids, params, every=every)
    assert tokens == Engine(pair.target, pair.drafter).generate(ids, params).token_ids
    assert next(answers, None) is None  # its loop finished with the same round
    assert target.active() == []
    total = sum(sizes)  # the Opened and one Verified a round
    assert total > 3
    assert sizes == ([total] if every == 0 else
                     [every] * (total // every) + ([total % every] if total % every else []))


def test_the_answers_of_a_request_run_whole_say_when_they_were_ready(tiny_llama):
    """``at_s``: each answer's time on the actor from the call's start, in order; the caller
    times the first token by it when all answers come at the end."""
    target = TargetActor(tiny_llama["target"], "none", "float64")
    t0 = time.perf_counter()
    [answers] = list(target.rounds("r", [5, 6, 7, 8], GenerationParams(max_new_tokens=6), 0))
    wall = time.perf_counter() - t0
    times = [a.at_s for a in answers]
    assert len(times) == 7 and times == sorted(times) and 0 < times[0] and times[-1] <= wall
    with pytest.raises(ValueError, match="every"):
        next(target.rounds("r2", [5, 6], GenerationParams(), -1))


def test_closing_a_request_ends_its_rounds_quietly(tiny_llama):
    """The caller's program finished first (a stop string) or its client left: the close ends
    the target's loop of the request mid-way, with no error, and frees it."""
    target = TargetActor(tiny_llama["target"], "none", "float64")
    answers = target.rounds("r", [5, 6, 7, 8, 9], GenerationParams(max_new_tokens=500))
    next(answers), next(answers)  # opened, one round: 500 rounds take far longer
    target.close("r")
    assert len(list(answers)) < 400  # what was answered before the close, then the end
    assert target.active() == []


def test_an_error_in_a_request_run_whole_reaches_the_caller(tiny_llama):
    from specdec.runtime import PoolFull

    target = TargetActor(tiny_llama["target"], "none", "float64", kv_slots=1)
    target.open("a", [1, 2, 3], GenerationParams())
    with pytest.raises(PoolFull):
        next(target.rounds("b", [4, 5], GenerationParams()))
    assert target.active() == ["a"]


def test_model_work_runs_on_each_actors_scheduler_thread(tiny_llama):
    # one model thread per actor (actors.scheduler): opens, steps, commits and drafts alike
    import threading

    ref = tiny_llama["block-drafter"]
    target = TargetActor(tiny_llama["target"], ref, "float64")
    drafter = DrafterActor(ref, tiny_llama["target"], dtype="float64")
    seen: dict[str, set] = {"target": set(), "drafter": set()}

    def record(side: str, obj, name: str) -> None:
        fn = getattr(obj, name)

        def wrapped(*args, **kwargs):
            seen[side].add(threading.current_thread())
            return fn(*args, **kwargs)

        setattr(obj, name, wrapped)

    record("target", target.worker, "step")
    for name in ("open", "commit_batch", "draft_batch"):
        record("drafter", drafter.worker, name)
    ids = target.worker.target_model.tokenizer("abc abc abc")["input_ids"]
    assert run_rounds(target, drafter, ids, GenerationParams(max_new_tokens=12))
    assert seen == {"target": {target.scheduler.thread}, "drafter": {drafter.scheduler.thread}}


def test_an_error_frees_the_request(tiny_llama):
    target = TargetActor(tiny_llama["target"], "ngram", "float64")
    target.open("r", [1, 2, 3], GenerationParams())
    with pytest.raises((IndexError, RuntimeError, ValueError)):
        target.verify("r", Draft([10**6], None))  # a token outside the vocabulary
    assert target.active() == []


def test_idle_requests_are_swept(tiny_llama):
    now = [0.0]
    target = TargetActor(tiny_llama["target"], "ngram", "float64", idle_ttl_s=5.0)
    target.leases = Leases(5.0, clock=lambda: now[0])
    target.open("old", [1, 2, 3], GenerationParams())
    now[0] = 10.0
    target.open("new", [1, 2, 3], GenerationParams())  # opening sweeps the idle ones
    assert target.active() == ["new"]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the x86 backend")
def test_the_actor_attends_the_way_it_is_told(tiny_llama):
    """The serve config's runtime knobs reach the target's plan and runtime (bfloat16 on the x86
    backend: batch invariant); auto leaves it to the plan's probe; the plan comes back in
    ``info`` (``/health`` returns it)."""
    for attention in ("per_query", "grouped"):
        target = TargetActor(tiny_llama["target"], "none", "bfloat16", attention=attention)
        assert target.worker.target_model.runtime.attention.kind == attention
        assert target.info().plan["attention"] == attention
    auto = TargetActor(tiny_llama["target"], "none", "bfloat16").worker.target_model.runtime
    assert auto.attention.kind in ("grouped", "per_query")
    torch_backend = TargetActor(tiny_llama["target"], "none", "float64", backend="torch",
                                max_model_len=96, kv_slots=3).info()
    assert torch_backend.max_length == 96
    assert (torch_backend.plan["backend"], torch_backend.plan["slots"]) == ("torch", 3)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or "avx2" not in cpu_flags(),
                    reason="isa: avx2 runs x86-64 CPUs with AVX2")
def test_the_isa_knob_reaches_the_actors_plan(tiny_llama):
    plan = TargetActor(tiny_llama["target"], "none", "float32", isa="avx2").info().plan
    assert (plan["backend"], plan["isa"]) == ("x86", "avx2")


def test_actor_sets_its_torch_threads(tiny_llama):
    import torch

    before = torch.get_num_threads()
    try:
        info = TargetActor(tiny_llama["target"], threads=2).info()
        assert info.threads == info.plan["threads"] == 2  # its plan records them
    finally:
        torch.set_num_threads(before)


def test_a_restarted_suffix_drafter_starts_from_the_offline_index(tiny_llama, tmp_path):
    """Ray restarts a crashed actor by constructing it again with the same arguments: the
    served outputs its global tree had taken in are gone, the offline index is back."""
    from specdec.models.suffix_index import SuffixIndex

    pair = load_pair(tiny_llama["target"], "ngram", dtype="float64")
    index = SuffixIndex(((5, 6, 7, 8), (9, 10, 11)), "tiny", pair.target.vocab_size)
    suffix = {"index": str(index.save(tmp_path / "index")), "online": True}
    args = ("suffix", tiny_llama["target"], None, "float64", 1, 600.0, "cpu", suffix)
    target, drafter = TargetActor(tiny_llama["target"], "suffix", "float64"), DrafterActor(*args)
    assert drafter.worker.draft_model.cached_responses == 2
    ids = pair.target.tokenizer("abc abc abc abc")["input_ids"]
    run_rounds(target, drafter, ids, GenerationParams(max_new_tokens=12))
    assert drafter.worker.draft_model.cached_responses == 3  # the served output joined online
    assert DrafterActor(*args).worker.draft_model.cached_responses == 2  # the restart
