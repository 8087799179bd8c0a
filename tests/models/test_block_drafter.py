"""The DFlash-style block drafter: one pass per round, incremental context cache, save/load."""

from __future__ import annotations

import pytest
import torch

from specdec.algorithms.sampling import GREEDY, Sampling
from specdec.models.block_drafter import BlockDrafter, BlockDrafterConfig, apply_rope
from specdec.models.target import TargetModel


@pytest.fixture(scope="module")
def pair(tiny_llama):
    config, _ = BlockDrafter.read_config(tiny_llama["block-drafter"])
    target = TargetModel.from_pretrained(tiny_llama["target"], "float64", config.tap_layers)
    return target, BlockDrafter.load(tiny_llama["block-drafter"], target)


def features(target, ids):
    return target.forward(target.new_state(), ids, taps=True).taps


def test_one_pass_drafts_block_size_minus_one_tokens_cut_into_pieces(pair):
    target, drafter = pair
    prompt = [3, 4, 5, 6, 7]
    state = drafter.start(prompt, features(target, prompt[:-1]))
    a, b = drafter.propose(state, 3, GREEDY), drafter.propose(state, 10, GREEDY)
    assert len(a) == 3 and len(b) == drafter.config.block_size - 1 - 3
    assert a.hidden.shape == (3, drafter.hidden_size)
    whole = drafter.start(prompt, features(target, prompt[:-1]))
    assert drafter.propose(whole, 20, GREEDY).tokens.tolist() == a.tokens.tolist() + b.tokens.tolist()


def test_incremental_context_equals_one_shot(pair):
    target, drafter = pair
    seq = [9, 8, 7, 6, 5, 4, 3, 2]
    feats = features(target, seq[:-1])
    stepwise = drafter.start(seq[:3], feats[:2])
    drafter.commit(stepwise, seq[3:6], feats[2:5])
    drafter.commit(stepwise, seq[6:], feats[5:])
    oneshot = drafter.start(seq, feats)
    for (k1, v1), (k2, v2) in zip(stepwise.ctx_kv, oneshot.ctx_kv, strict=True):
        torch.testing.assert_close(k1, k2)
        torch.testing.assert_close(v1, v2)
    assert drafter.propose(stepwise, 7, GREEDY).tokens.equal(drafter.propose(oneshot, 7, GREEDY).tokens)


def test_save_load_roundtrip(pair, tmp_path):
    target, drafter = pair
    loaded = BlockDrafter.load(drafter.save(tmp_path / "bd"), target)
    prompt = [1, 2, 3]
    f = features(target, prompt[:-1])
    a = drafter.propose(drafter.start(prompt, f), 7, GREEDY)
    b = loaded.propose(loaded.start(prompt, f), 7, GREEDY)
    assert a.tokens.equal(b.tokens)


def test_reduced_draft_vocabulary_maps_back_to_target_ids(pair):
    target, _ = pair
    config = BlockDrafterConfig.for_target(target, block_size=4, num_layers=1, num_taps=2,
                                           draft_vocab_size=16)
    drafter = BlockDrafter.initialise(config, target)
    keep = torch.arange(100, 116)
    drafter.net.draft_to_target.copy_(keep)
    drafter.head = target.lm_head_weight()[keep]
    prompt = [5, 6, 7]
    state = drafter.start(prompt, features(target, prompt[:-1]))
    tokens = drafter.propose(state, 3, GREEDY).tokens
    assert all(100 <= int(t) < 116 for t in tokens)
    sampled = drafter.start(prompt, features(target, prompt[:-1]))
    block = drafter.propose(sampled, 3, Sampling(1.0, torch.Generator().manual_seed(0)))
    assert block.probs.shape == (3, target.vocab_size)
    assert block.probs[:, :100].sum() == 0


def test_wrong_feature_count_is_a_clear_error(pair):
    target, drafter = pair
    with pytest.raises(ValueError, match="target features"):
        drafter.start([1, 2, 3], features(target, [1]))


def test_rope_preserves_norm_and_is_relative():
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64)
    pos = torch.arange(5)[None]
    torch.testing.assert_close(apply_rope(x, pos, 1e4).norm(dim=-1), x.norm(dim=-1))
    q, k = apply_rope(x[:, :1], pos[:, 1:2], 1e4), apply_rope(x[:, 1:2], pos[:, 3:4], 1e4)
    q2, k2 = apply_rope(x[:, :1], pos[:, 2:3], 1e4), apply_rope(x[:, 1:2], pos[:, 4:5], 1e4)
    torch.testing.assert_close((q * k).sum(-1), (q2 * k2).sum(-1))
