"""Continuous batching in the actors, run as plain objects: many requests' rounds come from
threads at once and the schedulers batch them (one target forward verifies every waiting
draft, prompts are prefilled in chunks); each request still gets exactly the tokens it gets
served alone, and one request's close or error leaves the others as they were."""

from __future__ import annotations

import threading
import time

import pytest

from actors.goodput import Goodput, StepCost
from actors.scheduler import BatchingConfig, Closed
from actors.target import TargetActor
from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair
from specdec.engine.settings import GenerationParams, SpecSettings
from specdec.engine.workers import Draft
from specdec.runtime import PoolFull
from specdec.runtime.batch import SHORT
from tests.actors.test_actors import run_rounds, with_drafter

TEXTS = ["abc abc abc abc", "the cat sat on the mat and the cat sat", "x", "hello hello hello",
         "one two three four five six seven eight nine ten eleven twelve", "zz zz"]
WAIT = {"gather_s": 0.05}  # generous, so the threads' calls meet in steps on a busy machine


@pytest.fixture(scope="module")
def pair(tiny_llama):
    return load_pair(tiny_llama["target"], tiny_llama["block-drafter"], dtype="float64")


def actors(tiny_llama, **batching):
    """A target that calls its drafter actor (the block drafter)."""
    return with_drafter(tiny_llama["target"], tiny_llama["block-drafter"], kv_slots=8,
                        batching={**WAIT, **batching})


def local_actors(tiny_llama, drafter: str = "ngram", **batching):
    """A target that runs the drafter itself (no drafter actor)."""
    target = TargetActor(tiny_llama["target"], drafter, "float64", kv_slots=8,
                         batching={**WAIT, **batching}, local_drafter={"drafter": drafter})
    return target, None


def concurrently(target, jobs: dict, stagger_s: float = 0.0):
    """Run each job (prompt ids, params) as its own request thread; per request id its tokens
    (or the exception it raised) and the steps it ran in."""
    out, steps = {}, {rid: [] for rid in jobs}

    def one(rid, ids, params):
        try:
            out[rid] = run_rounds(target, ids, params, rid, steps[rid])
        except Exception as e:  # noqa: BLE001 -- the test inspects it
            out[rid] = e

    threads = [threading.Thread(target=one, args=(rid, *job)) for rid, job in jobs.items()]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    for t in threads:
        t.join(120)
    return out, steps


SETTINGS = {
    "strict": SpecSettings(policy="fixed", gamma=3, verify="strict"),
    "asd-b0": SpecSettings(policy="fixed", gamma=3, verify="asd", asd_budget=0.0),
    "asd-b2": SpecSettings(policy="fixed", gamma=3, verify="asd", asd_budget=2.0),
}


@pytest.mark.parametrize("verify", sorted(SETTINGS))
@pytest.mark.parametrize("placement", ["actor", "target"])
def test_batched_requests_get_their_tokens_alone(tiny_llama, pair, verify, placement):
    """A block drafter in its own actor, or the n-gram drafter on the target's thread."""
    if placement == "actor":
        (target, drafter), engine = actors(tiny_llama), Engine(pair.target, pair.drafter)
    else:
        (target, drafter) = local_actors(tiny_llama)
        ngram = load_pair(tiny_llama["target"], "ngram", dtype="float64")
        engine = Engine(ngram.target, ngram.drafter)
    tok = pair.target.tokenizer
    jobs = {f"r{i}": (tok(text)["input_ids"],
                      GenerationParams(max_new_tokens=20 + 3 * i, spec=SETTINGS[verify]))
            for i, text in enumerate(TEXTS)}
    out, steps = concurrently(target, jobs, stagger_s=0.01)  # later ones join mid-flight
    for rid, (ids, params) in jobs.items():
        assert out[rid] == engine.generate(ids, params).token_ids, rid
    assert max(s.batch for ss in steps.values() for s in ss) > 1, "nothing was batched"
    assert target.active() == [] and (drafter is None or drafter.active() == [])


def test_batching_off_runs_one_request_a_step(tiny_llama, pair):
    target, drafter = actors(tiny_llama, max_batch=1)
    tok = pair.target.tokenizer
    jobs = {f"r{i}": (tok(t)["input_ids"], GenerationParams(max_new_tokens=12))
            for i, t in enumerate(TEXTS[:3])}
    out, steps = concurrently(target, jobs)
    engine = Engine(pair.target, pair.drafter)
    assert all(out[rid] == engine.generate(*jobs[rid]).token_ids for rid in jobs)
    assert {s.batch for ss in steps.values() for s in ss} == {1}


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_requests(tiny_llama, pair):
    budget = 8
    target, drafter = actors(tiny_llama, token_budget=budget)
    tok = pair.target.tokenizer
    long = tok(" ".join(TEXTS * 2))["input_ids"]
    assert len(long) > 4 * budget
    jobs = {"running": (tok(TEXTS[0])["input_ids"], GenerationParams(max_new_tokens=40)),
            "long": (long, GenerationParams(max_new_tokens=10))}
    out, steps = concurrently(target, jobs, stagger_s=0.05)
    engine = Engine(pair.target, pair.drafter)
    for rid, job in jobs.items():
        assert out[rid] == engine.generate(*job).token_ids, rid
    # every step within the budget, unless it held a single item bigger than the budget
    assert all(s.tokens <= budget or s.batch == 1 for ss in steps.values() for s in ss)


def test_a_close_frees_the_request_at_once_and_spares_the_others(tiny_llama, pair):
    target, drafter = actors(tiny_llama)
    tok = pair.target.tokenizer
    jobs = {f"r{i}": (tok(t)["input_ids"], GenerationParams(max_new_tokens=60))
            for i, t in enumerate(TEXTS[:3])}
    def close_r1_once_drafting():  # mid-flight: after its first draft, long before its 60th token
        deadline = time.monotonic() + 60
        while "r1" not in drafter.active() and time.monotonic() < deadline:
            time.sleep(0.001)
        target.close("r1")  # and on its drafter actor

    closer = threading.Thread(target=close_r1_once_drafting)
    closer.start()
    out, _ = concurrently(target, jobs)
    closer.join()
    assert isinstance(out["r1"], (Closed, LookupError)), out["r1"]
    engine = Engine(pair.target, pair.drafter)
    for rid in ("r0", "r2"):
        assert out[rid] == engine.generate(*jobs[rid]).token_ids, rid
    assert target.active() == [] and drafter.active() == []
    assert target.scheduler.running == set() == drafter.scheduler.running  # none expected
    with pytest.raises(Closed):  # a closed request's later work is refused
        target.scheduler.verify("r1", Draft([], None)).result(5)


def test_an_error_in_one_request_spares_the_others_in_its_step(tiny_llama, pair):
    target, _ = actors(tiny_llama)
    params = GenerationParams(max_new_tokens=5)
    for rid in ("good", "bad"):
        target.open(rid, [1, 2, 3], params)
    good = target.scheduler.verify("good", Draft([4, 5], None))
    bad = target.scheduler.verify("bad", Draft([10**6], None))  # outside the vocabulary
    with pytest.raises(ValueError, match="vocabulary"):
        bad.result(10)
    done = good.result(10)
    assert done.info.batch == 2  # they shared the step
    assert target.active() == ["good"]
    target.close("good")


def test_a_full_pool_refuses_only_the_request_over_it(tiny_llama):
    target = TargetActor(tiny_llama["target"], "ngram", "float64", kv_slots=2, batching=WAIT)
    futures = {rid: target.scheduler.open(rid, _open([1, 2, 3])) for rid in ("a", "b", "c")}
    outcomes = {rid: f.exception(10) for rid, f in futures.items()}
    assert sum(isinstance(e, PoolFull) for e in outcomes.values()) == 1
    assert sorted(target.active()) == sorted(r for r, e in outcomes.items() if e is None)


def _open(ids):
    from specdec.engine.workers import OpenRequest

    return OpenRequest(ids, GenerationParams(max_new_tokens=4))


def test_draft_caps_follow_the_number_of_running_requests(tiny_llama):
    config = BatchingConfig.from_dict({"draft_caps": {1: 6, 3: 2}})
    assert [config.draft_cap(n) for n in (0, 1, 2, 3, 9)] == [None, 6, 6, 2, 2]
    target = TargetActor(tiny_llama["target"], "ngram", "float64",
                         batching={**WAIT, "draft_caps": {1: 6, 2: 1}})
    params = GenerationParams(max_new_tokens=5)
    assert target.open("a", [1, 2, 3], params).draft_cap == 6
    assert target.open("b", [1, 2, 3], params).draft_cap == 1
    target.close("b")
    assert target.verify("a", Draft([], None)).draft_cap == 6
    target.close("a")


@pytest.mark.parametrize("bad", [{"max_batch": 0}, {"token_budget": 0}, {"gather_s": -1},
                                 {"draft_caps": {0: 4}}, {"draft_caps": {2: 0}}])
def test_bad_batching_configs_fail(bad):
    with pytest.raises(ValueError):
        BatchingConfig.from_dict(bad)


def test_a_target_that_drafts_frees_both_states_and_refuses_rounds_without_a_drafter(tiny_llama):
    target, _ = local_actors(tiny_llama)
    params = GenerationParams(max_new_tokens=20)
    ids = target.worker.target_model.tokenizer("abc abc abc abc abc abc")["input_ids"]
    target.open("r", ids, params)
    verified = target.round("r", 16)
    assert 0 < len(verified.draft.tokens) < 16  # the n-gram drafter found the repeat
    # the step counts the draft's own length and the bonus token (not the limit)
    assert verified.step.tokens == len(verified.draft.tokens) + 1
    assert set(target.scheduler.drafter.requests) == {"r"} == set(target.active())
    target.close("r")
    assert target.active() == [] and target.scheduler.drafter.requests == {}
    plain = TargetActor(tiny_llama["target"], "ngram", "float64")
    plain.open("p", ids, params)
    with pytest.raises(ValueError, match="runs no drafter"):
        plain.round("p", 4)
    assert plain.active() == []  # the failed call freed the request


def test_a_target_fitting_drafts_to_its_goodput_cuts_them_and_keeps_every_token(tiny_llama):
    """The n-gram drafter on the target, its steps priced as if a step's short rows were free
    up to 8 and cost a second past them (the float64 runtime's real costs are tiny: only the
    plan changes): a cut leaves the short rows within 8 (or cuts the drafts it can whole: the
    rows it cannot cut fill them), only greedy lossless requests are
    cut (an ASD request with a regret budget keeps its drafts: its tokens depend on them), and
    each request's tokens are its tokens alone."""
    target, _ = local_actors(tiny_llama)
    scheduler = target.scheduler
    assert scheduler.goodput is not None  # measured at load: the drafter runs on the target
    scheduler.goodput = Goodput(StepCost((1, 8, 9, 512), (0.001, 0.001, 1.0, 1.0)))
    fitted, plan = [], scheduler._fit

    def recording(batch):
        before = [(w.rid, n) for w, n in batch]
        after = plan(batch)
        fitted.append((before, [(w.rid, n) for w, n in after]))
        return after

    scheduler._fit = recording
    ngram = load_pair(tiny_llama["target"], "ngram", dtype="float64")
    engine = Engine(ngram.target, ngram.drafter)
    tok = ngram.target.tokenizer
    exact = SpecSettings(policy="fixed", gamma=6)
    budgeted = SpecSettings(policy="fixed", gamma=6, verify="asd", asd_budget=2.0)
    jobs = {f"r{i}": (tok(text)["input_ids"], GenerationParams(
        max_new_tokens=24, spec=budgeted if i == 1 else exact)) for i, text in enumerate(TEXTS)}
    out, _ = concurrently(target, jobs)
    for rid, (ids, params) in jobs.items():
        assert out[rid] == engine.generate(ids, params).token_ids, rid
    cuts = [(b, a) for b, a in fitted if a != b]
    assert cuts, "no draft was cut"
    for before, after in cuts:  # within the 8 free rows, or every cut draft gone
        pairs = list(zip(before, after, strict=True))
        cut = [m for (_, n), (_, m) in pairs if m != n]
        assert sum(n for _, n in after if n <= SHORT) <= 8 or set(cut) == {1}, (before, after)
        assert all(n == m for (rid, n), (_, m) in pairs if rid == "r1"), \
            "the budgeted ASD request's draft was cut"
    assert target.active() == []


def test_the_acceptance_model_on_a_target_that_drafts_keeps_each_request_greedy(tiny_llama, pair):
    """The suffix drafter on the target's thread with an (untrained) acceptance model: PACER cuts
    by it and the goodput prices rows by it; batched requests still get plain greedy tokens."""
    local = {"drafter": "suffix", "acceptance": "untrained"}
    target = TargetActor(tiny_llama["target"], "suffix", "float64", kv_slots=8,
                         batching={**WAIT, "fit_drafts": True}, local_drafter=local)
    drafter = target.scheduler.drafter
    assert drafter.acceptance is not None and drafter.survival and target.worker.features
    plain = load_pair(tiny_llama["target"], "none", dtype="float64")
    tok, engine = pair.target.tokenizer, Engine(plain.target)
    specs = [SpecSettings(policy="pacer", block_size=2, threshold=0.3, max_draft=8),
             SpecSettings(gamma=6, verify="asd", asd_budget=0.0)]
    jobs = {f"r{i}": (tok(text)["input_ids"],
                      GenerationParams(max_new_tokens=16 + 2 * i, spec=specs[i % 2]))
            for i, text in enumerate(TEXTS)}
    out, steps = concurrently(target, jobs, stagger_s=0.01)
    for rid, (ids, params) in jobs.items():
        assert out[rid] == engine.generate(ids, params).token_ids, rid
    assert max(s.batch for ss in steps.values() for s in ss) > 1, "nothing was batched"
    assert target.active() == []
