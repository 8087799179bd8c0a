"""The drafter's starting points: the reduced vocabulary and the copied target layer."""

from __future__ import annotations

import pytest
import torch

from specdec.models.block_drafter import BlockDrafter, BlockDrafterConfig
from specdec.models.target import TargetModel
from specdec.training.drafter_init import copy_target_layer, frequent_tokens, token_counts


def test_frequent_tokens_keeps_the_required_ones_and_the_most_common():
    seqs = [[5, 5, 5, 7, 7, 9], [5, 7, 3]]
    counts = token_counts(seqs)
    assert frequent_tokens(counts, 3, always=[2]).tolist() == [2, 5, 7]
    assert frequent_tokens(counts, 3).tolist() == [3, 5, 7]  # 9 and 3 tie: the smaller id
    assert frequent_tokens(token_counts(seqs[::-1]), 3).tolist() == [3, 5, 7]
    with pytest.raises(ValueError, match="only 4 distinct"):
        frequent_tokens(counts, 5)
    with pytest.raises(ValueError, match="cannot hold"):
        frequent_tokens(counts, 1, always=[1, 2])


@pytest.fixture()
def pair(tiny_llama):
    target = TargetModel.from_pretrained(tiny_llama["target"], "float64")
    config = BlockDrafterConfig.for_target(target, block_size=4, num_layers=2, num_taps=2)
    target = TargetModel(target.model, target.tokenizer, config.tap_layers)
    return target, BlockDrafter.initialise(config, target)


def test_copy_target_layer_copies_every_shared_parameter(pair):
    target, drafter = pair
    copied = copy_target_layer(drafter.net, target, -1)
    last = target.model.model.layers[-1]
    assert {"q_proj.weight", "o_proj.weight", "down.weight", "input_norm.weight"} <= set(copied)
    for layer in drafter.net.layers:
        assert torch.equal(layer.q_proj.weight, last.self_attn.q_proj.weight)
        assert torch.equal(layer.down.weight, last.mlp.down_proj.weight)
    with pytest.raises(ValueError, match="outside"):
        copy_target_layer(drafter.net, target, 99)


def test_reduced_vocabulary_drafts_only_its_tokens_and_survives_save_load(pair, tmp_path):
    target, drafter = pair
    vocab = torch.tensor([2, 10, 40, 97, 101])
    small = drafter.with_vocabulary(vocab)
    assert small.config.draft_vocab_size == 5 and small.head.shape[0] == 5
    state = small.start([1, 5, 9, 12], torch.randn(3, 2 * target.hidden_size, dtype=torch.float64))
    from specdec.algorithms.sampling import Sampling

    block = small.propose(state, 3, Sampling())
    assert {int(t) for t in block.tokens} <= set(vocab.tolist())
    loaded = BlockDrafter.load(small.save(tmp_path / "d"), target)
    assert loaded.config == small.config
    assert torch.equal(loaded.net.draft_to_target, vocab)
    with pytest.raises(ValueError, match="1-d tensor"):
        drafter.with_vocabulary(torch.tensor([0, 10**6]))
