import math

import torch

from specdec.training.calibration import accuracy, auc, calibration_bins, ece


def test_auc_matches_pairwise_count():
    scores = torch.tensor([0.9, 0.4, 0.6, 0.2, 0.6])
    labels = torch.tensor([1, 1, 0, 0, 1])
    # pos {0.9, 0.4, 0.6} vs neg {0.6, 0.2}: wins 0.9>both (2), 0.4>0.2 (1), 0.6>0.2 (1) + tie 0.5
    assert auc(scores, labels) == (2 + 1 + 1 + 0.5) / 6
    assert math.isnan(auc(scores, torch.ones(5)))


def test_perfectly_calibrated_bins_have_zero_ece():
    probs = torch.tensor([0.25] * 4 + [0.75] * 4)
    labels = torch.tensor([1, 0, 0, 0, 1, 1, 1, 0])
    assert ece(probs, labels) == 0.0
    _, rate, count = calibration_bins(probs, labels)
    assert count.sum() == 8 and rate[2] == 0.25
    assert accuracy(probs, labels) == 0.75
