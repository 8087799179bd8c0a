"""The acceptance evaluation's arithmetic on hand-made drafts: which tokens each question asks
of, the signal priced as ``actors.goodput`` prices it, and AUCs that see a perfect predictor.
(The job end to end runs in the tiny chain, ``test_chain``.)"""

from __future__ import annotations

import pytest
import torch

from actors.goodput import Goodput, StepCost
from pipelines.evaluate_acceptance import evaluate, predictions, signal_values
from specdec.training.preverifier_data import Step


def step(labels: list[int], confidence: list[float]) -> Step:
    """A draft whose signals (from column 2 on, after a 2-wide 'root and embedding') hold its
    confidence in column 0."""
    hidden = torch.zeros(len(labels), 3)
    hidden[:, 2] = torch.tensor(confidence)
    return Step(hidden, torch.tensor(labels, dtype=torch.float32))


DRAFTS = [step([1, 1, 0], [0.9, 0.8, 0.2]), step([0, 1], [0.3, 0.2]),
          step([1, 0, 1], [0.7, 0.4, 0.3])]


def test_the_signal_is_goodputs_price_after_every_draft():
    values = signal_values(DRAFTS, column=0, signals_at=2)
    goodput = Goodput(StepCost((1, 2), (1.0, 1.0)))
    for s, accepted in zip(DRAFTS, (2, 0, 1), strict=True):
        goodput.round(s.hidden[:, 2].tolist(), len(s.labels), accepted)
    c = goodput.calibration  # (3 accepted + prior) / (3.8 confidence + prior)
    assert c == pytest.approx(5 / 5.8)
    assert values[0].tolist() == pytest.approx([min(1, c * 0.9), c * 0.8, c * 0.2])
    # without a confidence, one value per depth: every draft's first token priced alike
    depth = signal_values(DRAFTS, column=None, signals_at=2)
    assert len({float(v[0]) for v in depth}) == 1


def test_accepted_asks_reached_tokens_and_survives_asks_all():
    model = [torch.tensor([0.9, 0.8, 0.1]), torch.tensor([0.2, 0.9]),
             torch.tensor([0.8, 0.3, 0.7])]
    p = predictions(DRAFTS, model, signal_values(DRAFTS, 0, 2))
    assert p.reached.tolist() == [True, True, True, True, False, True, True, False]
    assert p.labels["survives"].tolist() == [1, 1, 0, 0, 0, 1, 0, 0]
    assert p.model["survives"][:3].tolist() == pytest.approx([0.9, 0.72, 0.072])
    report = evaluate(p, max_position=3, bins=10)
    first = report["positions"][0]
    assert first["accepted"]["tokens"] == 3 and first["accepted"]["rate"] == pytest.approx(2 / 3)
    assert first["accepted"]["model_auc"] == 1.0  # 0.9 and 0.8 above 0.2
    pooled = report["from_position_2"]  # positions 2 and 3: the reached ones, and all five
    assert pooled["accepted"]["tokens"] == 3 and pooled["survives"]["tokens"] == 5
    assert pooled["accepted"]["model_auc"] == 1.0  # 0.8 (accepted) above 0.1 and 0.3
