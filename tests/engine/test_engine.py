"""Engine behaviour beyond losslessness: streaming, stats, sampling, bad input."""

from __future__ import annotations

import pytest

from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair
from specdec.engine.rounds import truncate
from specdec.engine.settings import GenerationParams, SpecSettings
from specdec.models.ngram import NgramDrafter
from specdec.models.target import TargetModel


@pytest.fixture(scope="module")
def engine(tiny_llama):
    pair = load_pair(tiny_llama["target"], "ngram", dtype="float64")
    return Engine(pair.target, pair.drafter)


def ids_of(engine, text="abc abc abc abc"):
    return engine.target_worker.target_model.tokenizer(text)["input_ids"]


def test_stream_yields_what_generate_returns(engine):
    ids, params = ids_of(engine), GenerationParams(max_new_tokens=30)
    stream = engine.stream(ids, params)
    chunks = list(stream)
    assert all(chunks) and sum(chunks, []) == stream.token_ids
    assert stream.token_ids == engine.generate(ids, params).token_ids
    assert engine.target_worker.requests == {} and engine.draft_worker.requests == {}  # state freed


def test_stats_are_consistent(engine):
    out = engine.generate(ids_of(engine), GenerationParams(max_new_tokens=40))
    s = out.stats
    assert s.committed == len(out.token_ids) == 40
    # the prefill, then one pass a round; the first round's only if it drafted (else the
    # prefill's last logits are the pending token's)
    assert s.rounds <= s.target_passes <= s.rounds + 1
    assert sum(s.drafted_at) == s.drafted and sum(s.accepted_at) == s.accepted
    assert sum(s.draft_lengths.values()) == s.rounds
    assert s.mean_accepted_length == pytest.approx(40 / s.rounds)
    assert s.total_s >= s.target_s > 0
    d = s.to_dict()
    assert d["committed"] == 40 and set(d["time_s"]) == {"drafter", "preverifier", "target", "total"}


def test_plain_decoding_makes_one_pass_per_token_like_generate(tiny_llama):
    pair = load_pair(tiny_llama["target"], "none", dtype="float64")
    plain = Engine(pair.target)
    out = plain.generate(ids_of(plain), GenerationParams(max_new_tokens=12))
    assert len(out.token_ids) == out.stats.rounds == 12
    assert out.stats.target_passes == 12  # the prefill yields the first token, as in generate


def test_sampling_is_reproducible_with_a_seed(engine):
    ids = ids_of(engine)
    run = [engine.generate(ids, GenerationParams(max_new_tokens=20, temperature=0.8, seed=s)).token_ids
           for s in (1, 1, 2)]
    assert run[0] == run[1] and run[0] != run[2]


def test_truncate_at_eos_and_budget():
    assert truncate([1, 2, 9, 3], 10, frozenset({9})) == ([1, 2, 9], "stop")
    assert truncate([1, 2, 3], 2, frozenset({9})) == ([1, 2], "length")
    assert truncate([1, 2], 5, frozenset()) == ([1, 2], None)


def test_context_full_finishes_with_length(tiny_llama):
    pair = load_pair(tiny_llama["target"], "ngram", dtype="float64")
    engine = Engine(pair.target, pair.drafter)
    limit = pair.target.max_length
    out = engine.generate([5] * (limit - 3), GenerationParams(max_new_tokens=50))
    assert out.finish_reason in ("length", "stop") and len(out.token_ids) <= 4


@pytest.mark.parametrize("build,match", [
    (lambda: GenerationParams(max_new_tokens=0), "max_new_tokens"),
    (lambda: SpecSettings(policy="bogus"), "unknown draft policy"),
    (lambda: SpecSettings(gamma=0), "gamma"),
    (lambda: SpecSettings(verify="asd", asd_budget=-1.0), "budget"),
    (lambda: SpecSettings(verify="nope"), "unknown verifier"),
    (lambda: GenerationParams(temperature=-0.1), "temperature"),
    (lambda: GenerationParams(temperature=0.7, spec=SpecSettings(verify="strict")), "sample"),
    (lambda: GenerationParams(spec=SpecSettings(verify="sample")), "temperature > 0"),
])
def test_bad_settings_are_clear_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_prompts_and_pairs(engine, tiny_llama):
    with pytest.raises(ValueError, match="empty"):
        engine.generate([])
    with pytest.raises(ValueError, match="context"):
        engine.generate([1] * engine.target_worker.target_model.max_length)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([10**6])
    target = TargetModel.from_pretrained(tiny_llama["target"])
    with pytest.raises(ValueError, match="does not match"):
        Engine(target, NgramDrafter(vocab_size=target.vocab_size + 1))


def test_pacer_without_a_preverifier_is_a_clear_error(engine):
    with pytest.raises(ValueError, match="pre-verifier"):
        engine.generate(ids_of(engine), GenerationParams(spec=SpecSettings(policy="pacer")))
    assert engine.target_worker.requests == {}  # nothing leaked


@pytest.mark.parametrize("drafter", ["drafter", "block-drafter", "self"])
def test_sampling_runs_with_every_model_drafter(tiny_llama, drafter):
    ref = tiny_llama.get(drafter, drafter)
    pair = load_pair(tiny_llama["target"], ref, "untrained", dtype="float64")
    engine = Engine(pair.target, pair.drafter, pair.preverifier)
    ids = ids_of(engine)
    for policy in ["fixed", "pacer"]:
        params = GenerationParams(max_new_tokens=16, temperature=0.9, seed=3,
                                  spec=SpecSettings(policy=policy, gamma=3, block_size=2))
        a, b = engine.generate(ids, params), engine.generate(ids, params)
        assert a.token_ids == b.token_ids
        assert len(a.token_ids) == 16 or a.finish_reason == "stop"
        if drafter == "self":
            assert a.stats.accepted > 0  # the target's own proposals are often accepted


# ---- stop tokens, stop strings, logprobs (issue 16) -------------------------------------------
def test_a_stop_token_ends_the_output_like_eos(engine):
    ids = ids_of(engine)
    full = engine.generate(ids, GenerationParams(max_new_tokens=30)).token_ids
    stop = full[7]
    out = engine.generate(ids, GenerationParams(max_new_tokens=30, stop_token_ids=frozenset({stop})))
    assert out.token_ids == full[: full.index(stop) + 1] and out.finish_reason == "stop"
    assert out.stats.committed == len(out.token_ids)


def test_a_stop_string_cuts_the_round_that_ran_past_it(engine):
    from specdec.engine.stops import StopStrings

    tok = engine.target_worker.target_model.tokenizer
    ids = ids_of(engine)

    def decode(t):
        return tok.decode(t, skip_special_tokens=True)

    full = engine.generate(ids, GenerationParams(max_new_tokens=40)).token_ids
    text = decode(full)
    stop = text[len(text) // 2: len(text) // 2 + 3]  # a stop string from the middle of the output
    out = engine.generate(ids, GenerationParams(max_new_tokens=40), StopStrings([stop], decode))
    assert out.finish_reason == "stop" and out.token_ids == full[: len(out.token_ids)]
    assert stop in decode(out.token_ids) and stop not in decode(out.token_ids[:-1])
    assert out.stats.committed == len(out.token_ids) < len(full)
    assert out.stats.accepted <= out.stats.drafted


def test_logprobs_are_the_targets_own_per_token(engine):
    import torch

    ids = ids_of(engine)
    params = GenerationParams(max_new_tokens=12, logprobs=3)
    out = engine.generate(ids, params)
    assert out.token_ids == engine.generate(ids, GenerationParams(max_new_tokens=12)).token_ids
    lp = out.logprobs
    assert len(lp) == len(out.token_ids) and all(len(t) == 3 for t in lp.top_ids)
    model = engine.target_worker.target_model.model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + out.token_ids])).logits[0]
    ref = torch.log_softmax(logits[len(ids) - 1: -1].double(), dim=-1)  # row i predicts token i
    for i, token in enumerate(out.token_ids):
        assert lp.logprobs[i] == pytest.approx(float(ref[i, token]), abs=1e-9)
        assert lp.top_ids[i][0] == token  # greedy: the chosen token is the most likely
        assert lp.top_logprobs[i] == pytest.approx(ref[i].topk(3).values.tolist(), abs=1e-9)
    assert engine.generate(ids, GenerationParams(max_new_tokens=4)).logprobs is None


def test_top_k_one_sampling_is_greedy(engine):
    ids = ids_of(engine)
    greedy = engine.generate(ids, GenerationParams(max_new_tokens=20)).token_ids
    sampled = engine.generate(ids, GenerationParams(max_new_tokens=20, temperature=1.5, top_k=1,
                                                    spec=SpecSettings())).token_ids
    assert sampled == greedy
