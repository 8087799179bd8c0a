"""Binary classifier metrics for the pre-verifier: accuracy, ROC AUC, expected calibration error.

AUC is the Mann-Whitney statistic: the probability that a random accepted token scores above a
random rejected one (ties count 1/2). ECE bins predictions into ``bins`` equal-width bins and
averages |observed rate - mean prediction| weighted by bin size.
"""

from __future__ import annotations

import torch


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """scores, labels: [n]; NaN when only one class is present."""
    pos, neg = scores[labels > 0.5].double(), scores[labels <= 0.5].double()
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).double().sum()
    ties = (pos[:, None] == neg[None, :]).double().sum()
    return float((greater + 0.5 * ties) / (pos.numel() * neg.numel()))


def calibration_bins(probs: torch.Tensor, labels: torch.Tensor, bins: int = 10):
    """-> (mean prediction [bins], observed rate [bins], count [bins]); empty bins have count 0."""
    idx = (probs.double() * bins).long().clamp(0, bins - 1)  # [n]
    count = torch.bincount(idx, minlength=bins).double()
    mean_pred = torch.bincount(idx, probs.double(), minlength=bins) / count.clamp_min(1)
    rate = torch.bincount(idx, labels.double(), minlength=bins) / count.clamp_min(1)
    return mean_pred, rate, count


def ece(probs: torch.Tensor, labels: torch.Tensor, bins: int = 10) -> float:
    mean_pred, rate, count = calibration_bins(probs, labels, bins)
    return float(((mean_pred - rate).abs() * count).sum() / count.sum().clamp_min(1))


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    return float(((probs > 0.5).double() == (labels > 0.5).double()).double().mean())
