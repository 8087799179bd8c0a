import torch

from specdec.training.block_batches import IGNORE, concat_blocks, distill_labels, sequence_blocks


def test_labels_positions_and_validity():
    ids = torch.arange(10, 20)  # T = 10
    batch = sequence_blocks(ids, torch.tensor([2, 7]), block_size=4)
    assert batch.anchor_ids.tolist() == [12, 17]
    assert batch.block_pos.tolist() == [[2, 3, 4, 5], [7, 8, 9, 10]]
    assert batch.labels.tolist() == [[IGNORE, 13, 14, 15], [IGNORE, 18, 19, IGNORE]]
    assert batch.valid.tolist() == [[False, True, True, True], [False, True, True, False]]
    assert batch.ctx_mask[0].tolist() == [True, True] + [False] * 8


def test_distill_labels_shift_the_greedy_predictions():
    ids = torch.tensor([5, 6, 7, 8])
    greedy_next = torch.tensor([60, 70, 80, 90])  # prediction for t + 1
    assert distill_labels(ids, greedy_next).tolist() == [5, 60, 70, 80]


def test_concat_pads_context_masks_and_indexes_sequences():
    a = sequence_blocks(torch.arange(6), torch.tensor([1, 3]), 3)
    b = sequence_blocks(torch.arange(9), torch.tensor([5]), 3)
    batch = concat_blocks([a, b])
    assert batch.seq_index.tolist() == [0, 0, 1]
    assert batch.ctx_mask.shape == (3, 9)
    assert not batch.ctx_mask[:2, 6:].any()
