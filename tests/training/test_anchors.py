import torch

from specdec.training.anchors import (
    anchor_range,
    context_mask,
    context_mask_reference,
    sample_anchors,
)


def test_anchors_are_distinct_sorted_in_range_and_reproducible():
    a = sample_anchors(50, 10, torch.Generator().manual_seed(3))
    b = sample_anchors(50, 10, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    lo, hi = anchor_range(50)
    assert a.unique().numel() == 10 and torch.equal(a, a.sort().values)
    assert int(a.min()) >= lo and int(a.max()) < hi


def test_short_sequences_give_fewer_or_no_anchors():
    assert sample_anchors(5, 10, torch.Generator()).tolist() == [1, 2, 3]
    assert sample_anchors(2, 4, torch.Generator()).numel() == 0


def test_context_mask_matches_reference():
    anchors = torch.tensor([1, 4, 6])
    assert context_mask(anchors, 7).tolist() == context_mask_reference([1, 4, 6], 7)
