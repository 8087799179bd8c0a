"""The actor classes run as plain objects here: same tokens as the engine, state freed."""

from __future__ import annotations

import platform
import time

import pytest

from actors.drafter import DrafterActor
from actors.leases import Leases
from actors.target import TargetActor
from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair
from specdec.engine.settings import GenerationParams
from specdec.engine.workers import Draft
from specdec.runtime.plan import cpu_flags


def with_drafter(target_ref: str, drafter_ref: str, **options) -> tuple[TargetActor, DrafterActor]:
    """A target actor whose drafter runs in a drafter actor (float64, the same batching)."""
    drafter = DrafterActor(drafter_ref, target_ref, dtype="float64",
                           batching=options.get("batching"))
    return TargetActor(target_ref, drafter_ref, "float64", drafter=drafter,
                       **options), drafter


def run_rounds(target_actor: TargetActor, prompt_ids, params, rid: str = "r1",
               steps: list | None = None) -> list[int]:
    """A served request, read as the orchestrator reads it: the target's ``rounds`` to their
    end; the target steps its work ran in go to ``steps``. A stream that ends before the
    program finished (a close) raises ``LookupError``."""
    tokens, last = [], None
    for last in target_actor.rounds(rid, prompt_ids, params):
        tokens += last.tokens
        if steps is not None:
            steps.extend(last.steps)
    if last is None or last.finish_reason is None:
        raise LookupError(f"request {rid} was closed before it finished")
    return tokens


@pytest.mark.parametrize("drafter_name", ["ngram", "block-drafter", "drafter"])
def test_actors_give_engine_tokens(tiny_llama, drafter_name):
    """The drafter in an actor of its own, called by the target."""
    ref = "ngram" if drafter_name == "ngram" else tiny_llama[drafter_name]
    target, drafter = with_drafter(tiny_llama["target"], ref)
    pair = load_pair(tiny_llama["target"], ref, dtype="float64")
    ids = pair.target.tokenizer("abc abc abc abc")["input_ids"]
    params = GenerationParams(max_new_tokens=30)
    assert run_rounds(target, ids, params) == \
        Engine(pair.target, pair.drafter).generate(ids, params).token_ids
    assert target.active() == [] and drafter.active() == []


@pytest.mark.parametrize("every", [1, 3, 0])
@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_a_request_gives_the_engine_tokens_in_messages_of_every_rounds(tiny_llama, drafter,
                                                                       every):
    """Drafting on the target (n-gram) or decoding plainly: the target's loop streams what its
    rounds commit, ``every`` rounds to a message (0: one message at the end), the last one
    with the finish reason and the request's stats, and frees the request itself."""
    local = {"drafter": drafter} if drafter != "none" else None
    target = TargetActor(tiny_llama["target"], drafter, "float64", local_drafter=local)
    pair = load_pair(tiny_llama["target"], drafter, dtype="float64")
    ids = pair.target.tokenizer("abc abc abc abc")["input_ids"]
    params = GenerationParams(max_new_tokens=30)
    expected = Engine(pair.target, pair.drafter).generate(ids, params)
    messages = list(target.rounds("r", ids, params, every))
    assert [t for m in messages for t in m.tokens] == expected.token_ids
    assert target.active() == []
    sizes = [len(m.rounds) for m in messages]
    total = sum(sizes)
    assert total == messages[-1].stats.rounds > 2
    assert sizes == ([total] if every == 0 else
                     [every] * (total // every) + ([total % every] if total % every else []))
    assert messages[-1].stats.committed == len(expected.token_ids)
    assert [m.finish_reason for m in messages] == [None] * (len(messages) - 1) + [
        expected.finish_reason]


def test_the_messages_say_when_their_first_tokens_came(tiny_llama):
    """``at_s``: when a message's first tokens were committed, from the call's start; the
    caller times the first token by it when all rounds come in one message."""
    target = TargetActor(tiny_llama["target"], "none", "float64")
    t0 = time.perf_counter()
    messages = list(target.rounds("r", [5, 6, 7, 8], GenerationParams(max_new_tokens=6)))
    wall = time.perf_counter() - t0
    times = [m.at_s for m in messages]
    assert len(times) == 6 and times == sorted(times) and 0 < times[0] and times[-1] <= wall
    with pytest.raises(ValueError, match="every"):
        next(target.rounds("r2", [5, 6], GenerationParams(), -1))


@pytest.mark.parametrize("placement", ["none", "actor"])
def test_closing_a_request_ends_its_rounds_quietly(tiny_llama, placement):
    """The caller cut the output at a stop string or its client left: the close ends the
    target's loop of the request mid-way, with no error, and frees it (on the drafter actor
    too)."""
    if placement == "actor":
        target, drafter = with_drafter(tiny_llama["target"], tiny_llama["block-drafter"])
    else:
        target, drafter = TargetActor(tiny_llama["target"], "none", "float64"), None
    messages = target.rounds("r", [5, 6, 7, 8, 9], GenerationParams(max_new_tokens=500))
    next(messages), next(messages)  # two rounds: 500 take far longer
    target.close("r")
    assert len(list(messages)) < 400  # what was committed before the close, then the end
    assert target.active() == [] and (drafter is None or drafter.active() == [])


def test_a_restarted_target_frees_what_its_drafter_actor_held(tiny_llama):
    """Ray restarts a crashed target by constructing it again: the requests of the lost process
    cannot go on, so their state in the drafter actor is freed at once, not at the reaper's
    next pass."""
    drafter = DrafterActor("ngram", tiny_llama["target"], dtype="float64")
    drafter.open("lost", [1, 2, 3], None, GenerationParams())
    assert drafter.active() == ["lost"]
    TargetActor(tiny_llama["target"], "ngram", "float64", drafter=drafter)
    assert drafter.active() == []


def test_an_error_in_a_request_run_whole_reaches_the_caller(tiny_llama):
    from specdec.runtime import PoolFull

    target = TargetActor(tiny_llama["target"], "none", "float64", kv_slots=1)
    target.open("a", [1, 2, 3], GenerationParams())
    with pytest.raises(PoolFull):
        next(target.rounds("b", [4, 5], GenerationParams()))
    assert target.active() == ["a"]
    # with a drafter actor: the drafter never opened it
    target, drafter = with_drafter(tiny_llama["target"], tiny_llama["block-drafter"], kv_slots=1)
    target.open("a", [1, 2, 3], GenerationParams())
    with pytest.raises(PoolFull):
        next(target.rounds("b", [4, 5], GenerationParams()))
    assert target.active() == ["a"] and drafter.active() == []


def test_model_work_runs_on_each_actors_scheduler_thread(tiny_llama):
    # one model thread per actor (actors.scheduler): opens, steps, commits and drafts alike
    import threading

    target, drafter = with_drafter(tiny_llama["target"], tiny_llama["block-drafter"])
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
    assert run_rounds(target, ids, GenerationParams(max_new_tokens=12))
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
    drafter = DrafterActor(*args)
    target = TargetActor(tiny_llama["target"], "suffix", "float64", drafter=drafter)
    assert drafter.worker.draft_model.cached_responses == 2
    ids = pair.target.tokenizer("abc abc abc abc")["input_ids"]
    run_rounds(target, ids, GenerationParams(max_new_tokens=12))
    assert drafter.worker.draft_model.cached_responses == 3  # the served output joined online
    assert DrafterActor(*args).worker.draft_model.cached_responses == 2  # the restart
