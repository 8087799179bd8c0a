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


def started(target, drafter, lengths):
    """One request state per context length (prompt ids 3, 4, ...)."""
    states, width = [], len(drafter.config.tap_layers) * drafter.config.feature_size
    for n in lengths:
        prompt = [3 + i % 50 for i in range(n)]
        feats = features(target, prompt[:-1]) if n > 1 else torch.zeros(0, width, dtype=torch.float64)
        states.append(drafter.start(prompt, feats))
    return states


def test_batched_block_pass_equals_one_by_one_and_needs_its_mask(pair, monkeypatch):
    target, drafter = pair
    lengths = [1, 4, 9, 6]  # different context lengths: the shorter ones are padded
    alone = started(target, drafter, lengths)
    for state in alone:
        drafter._forward([state])
    batched = started(target, drafter, lengths)
    drafter.prepare([(s, 1) for s in batched])
    for a, b in zip(alone, batched, strict=True):
        for x, y in zip(a.forward, b.forward, strict=True):
            torch.testing.assert_close(y, x, rtol=0, atol=1e-10)
    # the same batch without the key mask: the padded rows leak into every shorter context
    from specdec.models import block_drafter as module

    pad = module.pad_context
    monkeypatch.setattr(module, "pad_context", lambda contexts: (pad(contexts)[0], None))
    unmasked = started(target, drafter, lengths)
    drafter.prepare([(s, 1) for s in unmasked])
    for a, u, n in zip(alone, unmasked, lengths, strict=True):
        same = torch.allclose(u.forward[0], a.forward[0], rtol=0, atol=1e-10)
        assert same == (n == max(lengths)), n


def test_prepare_skips_requests_that_propose_nothing_and_leaves_the_choice_to_propose(pair):
    target, drafter = pair
    states = started(target, drafter, [2, 5])
    drafter.prepare([(states[0], 0), (states[1], 3)])
    assert states[0].forward is None and states[1].forward is not None
    sampled = drafter.propose(states[1], 3, Sampling(1.0, torch.Generator().manual_seed(7)))
    fresh = started(target, drafter, [5])[0]  # not prepared: propose runs the pass itself
    again = drafter.propose(fresh, 3, Sampling(1.0, torch.Generator().manual_seed(7)))
    assert sampled.tokens.equal(again.tokens)
    torch.testing.assert_close(sampled.probs, again.probs, rtol=0, atol=1e-10)


def test_commit_batch_equals_commit_one_by_one(pair):
    target, drafter = pair
    seqs = [[9, 8, 7, 6, 5, 4, 3, 2], [11, 12, 13, 14, 15], [21, 22, 23, 24, 25, 26]]
    cut = [3, 4, 2]  # prompt lengths; the rest is committed in one round
    one, many = [], []
    for seq, c in zip(seqs, cut, strict=True):
        feats = features(target, seq[:-1])
        one.append(drafter.start(seq[:c], feats[:c - 1]))
        drafter.commit(one[-1], seq[c:], feats[c - 1:])
        many.append(drafter.start(seq[:c], feats[:c - 1]))
    drafter.commit_batch([(s, seq[c:], features(target, seq[:-1])[c - 1:])
                          for s, seq, c in zip(many, seqs, cut, strict=True)])
    for a, b in zip(one, many, strict=True):
        assert a.committed == b.committed
        for (k1, v1), (k2, v2) in zip(a.ctx_kv, b.ctx_kv, strict=True):
            torch.testing.assert_close(k2, k1, rtol=0, atol=1e-10)
            torch.testing.assert_close(v2, v1, rtol=0, atol=1e-10)
