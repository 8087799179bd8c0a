"""The target adapter on both backends: KV crop must leave the cache exactly as a fresh prefill
would; the runtime is picked for the Llama family, transformers for the rest; a full KV pool
raises ``PoolFull``; a batch equals its requests run alone."""

from __future__ import annotations

import random

import pytest
import torch

from specdec.models.target import TargetModel, evenly_spaced_taps


@pytest.fixture(scope="module", params=["runtime", "transformers"])
def target(tiny, request):
    return TargetModel.from_pretrained(tiny["target"], dtype="float64", tap_layers=(0, 2),
                                       backend=request.param)


def cache_tensors(target, state):
    if state.slot is None:
        return [(layer.keys.clone(), layer.values.clone()) for layer in state.cache.layers]
    pool, n = target.runtime.pool, state.length
    return [(k[state.slot, :, :n].clone(), v[state.slot, :, :n].clone())
            for k, v in zip(pool.k, pool.v, strict=True)]


def test_any_extend_crop_sequence_equals_fresh_prefill(target):
    rng = random.Random(0)
    for _ in range(5):
        state, seq = target.new_state(), []
        for _step in range(8):
            if seq and rng.random() < 0.4:
                keep = rng.randint(0, len(seq))
                target.crop(state, keep)
                seq = seq[:keep]
            else:
                new = [rng.randrange(target.vocab_size) for _ in range(rng.randint(1, 5))]
                target.forward(state, new)
                seq += new
        if not seq:
            continue
        fresh = target.new_state()
        target.forward(fresh, seq)
        assert state.length == fresh.length == len(seq)
        for (k1, v1), (k2, v2) in zip(cache_tensors(target, state), cache_tensors(target, fresh),
                                              strict=True):
            torch.testing.assert_close(k1, k2, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(v1, v2, rtol=1e-10, atol=1e-10)
        probe = [rng.randrange(target.vocab_size)]
        torch.testing.assert_close(target.forward(state, probe).logits,
                                   target.forward(fresh, probe).logits)


def test_taps_are_the_tapped_layer_outputs(target):
    ids = [5, 6, 7, 8]
    out = target.forward(target.new_state(), ids, taps=True)
    assert out.logits.shape == (4, target.vocab_size)
    full = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    expected = torch.cat([full.hidden_states[1][0], full.hidden_states[3][0]], dim=-1)
    torch.testing.assert_close(out.taps, expected)


def test_taps_evenly_spaced_like_dflash():
    assert evenly_spaced_taps(30, 3) == (1, 14, 27)
    assert evenly_spaced_taps(4, 2) == (1, 1)
    with pytest.raises(ValueError):
        evenly_spaced_taps(30, 0)


def test_bad_calls_raise(target):
    state = target.new_state()
    with pytest.raises(ValueError, match="at least one token"):
        target.forward(state, [])
    target.forward(state, [1, 2])
    with pytest.raises(ValueError, match="crop"):
        target.crop(state, 3)
    with pytest.raises(ValueError, match="context"):
        target.forward(state, [1] * target.max_length)
    with pytest.raises(ValueError, match="tap layers"):
        TargetModel(target.model, target.tokenizer, tap_layers=(99,))


def test_the_cache_argument_follows_the_transformers_version():
    from specdec.models.kv import cache_kwarg

    class Old:
        def forward(self, input_ids, past_key_values=None, use_cache=None): ...

    class New:
        def forward(self, input_ids, cache=None, use_cache=None): ...

    assert cache_kwarg(Old) == "past_key_values"
    assert cache_kwarg(New) == "cache"


def test_a_forward_that_drops_the_cache_fails_loudly(tiny_llama):
    from specdec.models.kv import cached_forward, new_cache

    target = TargetModel.from_pretrained(tiny_llama["target"], "float64")

    class Forgetful(torch.nn.Module):  # a model whose forward ignores the cache it is given
        def __init__(self):
            super().__init__()
            self.inner, self.device = target.model, target.device

        def forward(self, input_ids, cache=None, **kwargs):
            return self.inner(input_ids=input_ids, **kwargs)

    with pytest.raises(RuntimeError, match="did not extend its cache"):
        cached_forward(Forgetful(), [1, 2, 3], new_cache(target.model.config))


def test_a_prefill_without_logits_keeps_the_cache_and_taps_exact(tiny_llama):
    target = TargetModel.from_pretrained(tiny_llama["target"], "float64", tap_layers=(1, 2))
    prompt = list(b"hello world, hello")
    full, short = target.new_state(), target.new_state()
    a = target.forward(full, prompt, taps=True)
    b = target.forward(short, prompt, taps=True, last_logits_only=True)
    assert b.logits.shape[0] == 1  # one lm_head row instead of 18: equal up to float64 rounding
    assert torch.allclose(a.logits[-1], b.logits[-1], rtol=0, atol=1e-12)
    assert torch.equal(a.taps, b.taps) and full.length == short.length == len(prompt)
    nxt_a, nxt_b = target.forward(full, [5, 6]), target.forward(short, [5, 6])
    assert torch.equal(nxt_a.logits, nxt_b.logits)


def test_the_llama_family_runs_on_the_runtime_and_others_fall_back(tiny, tmp_path, caplog):
    from transformers import AutoModelForCausalLM, GPT2Config

    with caplog.at_level("INFO", logger="specdec.models.target"):
        target = TargetModel.from_pretrained(tiny["target"], dtype="float64")
    assert target.backend == "runtime" and "runs on the runtime backend" in caplog.text
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=2, n_embd=32, n_head=2,
                                                       vocab_size=target.vocab_size))
    other = TargetModel(gpt2.to(torch.float64), target.tokenizer)
    assert other.backend == "transformers" and other.runtime is None
    state = other.new_state()
    logits = other.forward(state, [1, 2, 3]).logits
    with torch.no_grad():
        torch.testing.assert_close(logits, gpt2(input_ids=torch.tensor([[1, 2, 3]])).logits[0])
    with pytest.raises(ValueError, match="cannot run this model"):
        TargetModel(gpt2, target.tokenizer, backend="runtime")


def test_a_full_pool_raises_and_released_slots_are_reused(tiny):
    from specdec.runtime import PoolFull

    target = TargetModel.from_pretrained(tiny["target"], dtype="float64", pool_size=2)
    a, b = target.new_state(), target.new_state()
    with pytest.raises(PoolFull, match="KV cache slots"):
        target.new_state()
    target.release(a)
    target.release(a)  # twice is harmless: the slot is not given back again
    c = target.new_state()
    assert c.slot == a.slot != b.slot
    del b  # a state nobody released gives its slot back when collected
    target.new_state()


def test_a_batch_equals_its_requests_alone(target):
    prompts = [[5, 6, 7], list(range(10, 30)), [40]]
    alone = [target.forward(target.new_state(), p, taps=True) for p in prompts]
    batch = target.forward_batch([target.new_state() for _ in prompts], prompts, taps=True)
    for a, b in zip(alone, batch, strict=True):
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-12)
        torch.testing.assert_close(a.taps, b.taps, rtol=0, atol=1e-12)


def test_sequence_features_equal_on_both_backends(tiny):
    from specdec.training.target_features import sequence_features

    seqs = [list(range(5, 25)), [7, 8, 9], list(range(40, 52))]
    a, b = (sequence_features(TargetModel.from_pretrained(tiny["target"], "float64", (0, 2),
                                                          backend=backend, pool_size=2), seqs)
            for backend in ("runtime", "transformers"))
    torch.testing.assert_close(a.features, b.features, rtol=0, atol=1e-9)
    assert torch.equal(a.lengths, b.lengths)
    for i, n in enumerate(a.lengths.tolist()):  # past a sequence's end the padded HF batch
        assert torch.equal(a.greedy_next[i, :n], b.greedy_next[i, :n])  # predicts junk
