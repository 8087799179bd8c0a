"""Parity: the training forward on a block equals BlockDrafter.propose on the same context."""

import torch

from specdec.algorithms.sampling import Sampling
from specdec.training.block_batches import concat_blocks, sequence_blocks
from specdec.training.drafter_forward import FrozenTargetParts, block_logits
from specdec.training.target_features import sequence_features


def inference_block(pair, prompt: list[int]):
    target, drafter = pair.target, pair.drafter
    state = target.new_state()
    feats = target.forward(state, prompt[:-1], taps=True).taps
    dstate = drafter.start(prompt, feats)
    return drafter.propose(dstate, drafter.max_draft_len, Sampling(0.0, torch.Generator()))


def test_training_forward_equals_propose(pair64):
    target, drafter = pair64.target, pair64.drafter
    seq = list(range(40, 75))  # a longer sequence: context after the anchor must be hidden
    parts = FrozenTargetParts(target.embedding_weight(), target.lm_head_weight())
    feats = sequence_features(target, [seq, seq[:20]])
    b = drafter.config.block_size
    batch = concat_blocks([sequence_blocks(torch.tensor(seq), torch.tensor([9, 19, 30]), b),
                           sequence_blocks(torch.tensor(seq[:20]), torch.tensor([12]), b)])
    logits, hidden = block_logits(drafter.net, parts, feats.features, batch)
    for row, anchor in [(0, 9), (1, 19), (2, 30), (3, 12)]:
        ref = inference_block(pair64, seq[: anchor + 1])
        torch.testing.assert_close(hidden[row, 1:].float(), ref.hidden, rtol=1e-9, atol=1e-9)
        assert logits[row, 1:].argmax(-1).tolist() == ref.tokens.tolist()


def test_features_match_the_cached_target_pass(pair64):
    target = pair64.target
    seq = list(range(30, 50))
    cached = target.forward(target.new_state(), seq, taps=True).taps
    full = sequence_features(target, [seq, seq[:5]])
    torch.testing.assert_close(full.features[0], cached)
    assert full.lengths.tolist() == [20, 5]
    assert not full.features[1, 5:].any()


def test_labels_map_into_a_reduced_draft_vocabulary(pair64):
    from specdec.models.block_drafter import BlockDrafterModel
    from specdec.training.block_batches import IGNORE
    from specdec.training.drafter_forward import draft_labels

    config = pair64.drafter.config
    net = BlockDrafterModel(config)
    net.draft_to_target = torch.tensor([5, 9, 2])  # draft id -> target id
    labels = torch.tensor([[IGNORE, 9, 7, 2]])
    valid = torch.tensor([[False, True, True, True]])
    mapped, ok = draft_labels(net, labels, valid)
    assert mapped.tolist() == [[IGNORE, 1, IGNORE, 2]]
    assert ok.tolist() == [[False, True, False, True]]
