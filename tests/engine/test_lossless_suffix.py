"""Losslessness with the suffix and hybrid drafters: strict verification and ASD with B = 0
give exactly the target's greedy tokens (float64 tiny models), with a cold drafter (local tree
only) and a warm one (the global tree holds earlier outputs, so long drafts are proposed)."""

from __future__ import annotations

import pytest

from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair
from specdec.engine.settings import GenerationParams, SpecSettings
from tests.conftest import PROMPTS, greedy_reference

N = 32
SETTINGS = [SpecSettings(gamma=16, max_draft=8, hybrid_skip=2.0),
            SpecSettings(gamma=16, max_draft=8, verify="asd", asd_budget=0.0, asd_gate=0.5),
            SpecSettings(gamma=3, suffix_factor=1.0, suffix_min_prob=0.3, hybrid_skip=100.0,
                         block_size=2, threshold=0.3)]


@pytest.fixture(scope="module")
def expected(tiny):
    pair = load_pair(tiny["target"], "none", dtype="float64")
    tok, eos = pair.target.tokenizer, pair.target.eos_token_ids
    return {p: greedy_reference(pair.target.model, tok(p)["input_ids"], N, eos) for p in PROMPTS}


@pytest.mark.parametrize("drafter", ["suffix", "hybrid"])
def test_suffix_and_hybrid_are_greedy(tiny, expected, drafter):
    pair = load_pair(tiny["target"], drafter, "untrained", dtype="float64",
                     block_drafter=tiny["block-drafter"])
    engine = Engine(pair.target, pair.drafter, pair.preverifier)
    tok = engine.target_worker.target_model.tokenizer
    sources = set()
    for repeat in range(2):  # the second pass drafts from the first pass's outputs
        for prompt in PROMPTS[:2]:
            for spec in SETTINGS:
                out = engine.generate(tok(prompt)["input_ids"], GenerationParams(N, spec=spec))
                assert out.token_ids == expected[prompt], (drafter, spec, prompt, repeat)
                assert out.stats.regret_spent == 0.0
                sources |= set(out.stats.draft_sources)
                if repeat == 1 and spec.max_draft == 8:  # warm: the output is in the tree
                    assert out.stats.mean_accepted_length > 2.0, out.stats.to_dict()
    assert sources == ({"suffix"} if drafter == "suffix" else {"suffix", "block"})


def test_hybrid_rejects_other_policies(tiny_llama):
    pair = load_pair(tiny_llama["target"], "hybrid", "untrained", dtype="float64",
                     block_drafter=tiny_llama["block-drafter"])
    engine = Engine(pair.target, pair.drafter, pair.preverifier)
    with pytest.raises(ValueError, match="use policy fixed"):
        engine.generate([1, 2, 3], GenerationParams(8, spec=SpecSettings(policy="heuristic")))


def test_hybrid_needs_its_parts(tiny_llama):
    with pytest.raises(ValueError, match="needs a block drafter"):
        load_pair(tiny_llama["target"], "hybrid", "untrained", dtype="float64")
    with pytest.raises(ValueError, match="needs a pre-verifier"):
        load_pair(tiny_llama["target"], "hybrid", None, dtype="float64",
                  block_drafter=tiny_llama["block-drafter"])


ACCEPTANCE = [SpecSettings(policy="pacer", block_size=2, threshold=0.4, max_draft=8),
              SpecSettings(policy="pacer", block_size=3, threshold=0.0, growth=1.0, max_draft=8,
                           verify="asd", asd_budget=0.0, asd_gate=0.5),
              SpecSettings(gamma=5)]


@pytest.mark.parametrize("drafter", ["suffix", "ngram", "block-drafter"])
def test_the_acceptance_model_on_keeps_greedy(tiny, expected, drafter):
    """An (untrained) acceptance model cuts the drafts by PACER's rule and prices them: the
    target taps its last layer for the root state (a block drafter's own taps: their deepest),
    and the tokens stay plain greedy's."""
    pair = load_pair(tiny["target"], tiny.get(drafter, drafter), dtype="float64",
                     acceptance_ref="untrained")
    own = getattr(pair.drafter, "config", None)
    assert pair.target.tap_layers == (own.tap_layers if drafter == "block-drafter"
                                      else (pair.target.num_layers - 1,))
    engine = Engine(pair.target, pair.drafter, acceptance=pair.acceptance)
    tok, timed = pair.target.tokenizer, 0.0
    for prompt in PROMPTS[:2]:
        for spec in ACCEPTANCE:
            out = engine.generate(tok(prompt)["input_ids"], GenerationParams(N, spec=spec))
            assert out.token_ids == expected[prompt], (drafter, spec, prompt)
            timed += out.stats.preverifier_s
    assert timed > 0  # the model scored drafts
    plain = load_pair(tiny["target"], tiny.get(drafter, drafter), dtype="float64")
    assert plain.acceptance is None and (drafter == "block-drafter" or not plain.target.tap_layers)
