"""Tests for specdec.algorithms.losses: DFlash and D-PACE block losses.

Expected values are worked out by hand from chosen label probabilities, never
by calling the function under test.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.algorithms.losses import (
    LOSSES,
    DFlashLoss,
    DPaceLoss,
    block_cross_entropy,
    default_gamma,
    dflash_loss,
    dpace_loss,
    dpace_weights,
    dpace_weights_reference,
    make_loss,
)

# One block, B = 4, V = 3. Each row is a softmax distribution; the label is token 0,
# so the draft probability of the label is q = row[0] and CE = -log q exactly.
#   j = 0 (anchor): anything;  j = 1: q = 0.5;  j = 2: q = 0.25;  j = 3: q = 0.8
PROBS = [[0.2, 0.4, 0.4], [0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.8, 0.1, 0.1]]
Q = [None, 0.5, 0.25, 0.8]
CE = [None, math.log(2.0), math.log(4.0), math.log(1.25)]


def _block(mask=(1, 1, 1, 1), labels=(0, 0, 0, 0), dtype=torch.float64):
    logits = torch.log(torch.tensor([PROBS], dtype=dtype))  # [1, 4, 3]
    return logits, torch.tensor([labels]), torch.tensor([mask], dtype=torch.bool)


def _small_block_loss(name):
    """Registry loss for B = 4 (no DFlash default gamma exists for that size)."""
    return make_loss(name, gamma=3.0) if name == "dflash" else make_loss(name)


def _close(actual, expected, tol=1e-12):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


# ------------------------------------------------------------------ block_cross_entropy


def test_block_ce_values_and_zero_at_anchor():
    ce = block_cross_entropy(*_block())
    _close(ce, [[0.0, CE[1], CE[2], CE[3]]])
    assert ce.dtype == torch.float64


def test_block_ce_matches_log_softmax_and_keeps_dtype():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=gen)
    labels = torch.randint(0, 7, (3, 5), generator=gen)
    mask = torch.ones(3, 5)
    ce = block_cross_entropy(logits, labels, mask)
    expected = -torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    expected[:, 0] = 0.0
    torch.testing.assert_close(ce, expected)
    assert ce.dtype == torch.float32


def test_invalid_labels_at_masked_positions_are_harmless():
    logits, _, mask = _block(mask=(0, 1, 0, 1))
    labels = torch.tensor([[-100, 0, -100, 0]])
    ce = block_cross_entropy(logits, labels, mask)
    _close(ce, [[0.0, CE[1], 0.0, CE[3]]])
    for name in LOSSES:
        assert torch.isfinite(_small_block_loss(name)(logits, labels, mask))


# ------------------------------------------------------------------ D-PACE hand values

# alpha = 0.5: q~ = 0.5 q + 0.5 = (0.75, 0.625, 0.9)
#   P = (0.75, 0.46875, 0.421875)
#   dpace  w = suffix sums of P = (1.640625, 0.890625, 0.421875)
#   dpace_f f = w / P = (2.1875, 1.9, 1.0)   [e.g. f_1 = 1 + 0.625 + 0.625 * 0.9]
HAND_FULL = {
    "dpace": [0.0, 1.640625, 0.890625, 0.421875],
    "dpace_p": [0.0, 0.75, 0.46875, 0.421875],
    "dpace_f": [0.0, 2.1875, 1.9, 1.0],
}
# mask j = 2 off: q~ = (0.75, 1, 0.9) -> P = (0.75, 0.75, 0.675)
#   dpace w_1 = 0.75 + 0.675, w_3 = 0.675; dpace_f f_1 = 1 + 0.9, f_3 = 1
HAND_MIDDLE_MASKED = {
    "dpace": [0.0, 1.425, 0.0, 0.675],
    "dpace_p": [0.0, 0.75, 0.0, 0.675],
    "dpace_f": [0.0, 1.9, 0.0, 1.0],
}
# alpha = 0: q~ = q = (0.5, 0.25, 0.8) -> P = (0.5, 0.125, 0.1)
#   dpace w = (0.725, 0.225, 0.1); dpace_f f_1 = 1 + 0.25 + 0.25 * 0.8, f_2 = 1 + 0.8
HAND_ALPHA0 = {
    "dpace": [0.0, 0.725, 0.225, 0.1],
    "dpace_p": [0.0, 0.5, 0.125, 0.1],
    "dpace_f": [0.0, 1.45, 1.8, 1.0],
}
# alpha = 1: q~ = 1 everywhere -> P = 1, w_j = number of valid k >= j
HAND_ALPHA1 = {
    "dpace": [0.0, 3.0, 2.0, 1.0],
    "dpace_p": [0.0, 1.0, 1.0, 1.0],
    "dpace_f": [0.0, 3.0, 2.0, 1.0],
}
CASES = [
    ((1, 1, 1, 1), 0.5, HAND_FULL),
    ((1, 1, 0, 1), 0.5, HAND_MIDDLE_MASKED),
    ((1, 1, 1, 1), 0.0, HAND_ALPHA0),
    ((1, 1, 1, 1), 1.0, HAND_ALPHA1),
]


@pytest.mark.parametrize("variant", ["dpace", "dpace_p", "dpace_f"])
@pytest.mark.parametrize("mask,alpha,table", CASES)
def test_dpace_weights_by_hand(variant, mask, alpha, table):
    logits, labels, m = _block(mask=mask)
    ce = block_cross_entropy(logits, labels, m)
    expected = [table[variant]]
    _close(dpace_weights(ce, m, alpha=alpha, variant=variant), expected)
    _close(dpace_weights_reference(ce, m, alpha=alpha, variant=variant), expected)


@pytest.mark.parametrize("variant", ["dpace", "dpace_p", "dpace_f"])
@pytest.mark.parametrize("mask,alpha,table", CASES)
def test_dpace_loss_by_hand(variant, mask, alpha, table):
    logits, labels, m = _block(mask=mask)
    w = table[variant]
    expected = sum(CE[j] * w[j] for j in range(1, 4) if mask[j])  # batch_size = N = 1
    _close(dpace_loss(logits, labels, m, alpha=alpha, variant=variant), expected)
    via_registry = make_loss(variant, alpha=alpha)(logits, labels, m)
    _close(via_registry, expected)


def test_dpace_loss_batch_size_divides():
    logits, labels, m = _block()
    one = dpace_loss(logits, labels, m)
    _close(dpace_loss(logits, labels, m, batch_size=4), one / 4)
    # two identical blocks with the default batch_size = N = 2 give the single-block value
    two = dpace_loss(logits.repeat(2, 1, 1), labels.repeat(2, 1), m.repeat(2, 1))
    _close(two, one)


def test_anchor_excluded_even_when_mask_is_one():
    logits, labels, _ = _block()
    on = torch.tensor([[1, 1, 1, 1]], dtype=torch.bool)
    off = torch.tensor([[0, 1, 1, 1]], dtype=torch.bool)
    odd = logits.clone()
    odd[0, 0] = torch.tensor([30.0, -30.0, 5.0])  # anchor logits: very wrong for label 0
    for name in LOSSES:
        loss = _small_block_loss(name)
        _close(loss(logits, labels, on), loss(logits, labels, off))
        _close(loss(odd, labels, on), loss(logits, labels, off))
    _close(dpace_weights(block_cross_entropy(logits, labels, on), on)[:, 0], [0.0])


def test_anchor_gets_no_gradient():
    logits, labels, mask = _block()
    logits.requires_grad_(True)
    dpace_loss(logits, labels, mask).backward()
    assert torch.all(logits.grad[:, 0] == 0)
    assert torch.any(logits.grad[:, 1:] != 0)


def test_all_masked_block_gives_zero():
    logits, labels, _ = _block()
    mask = torch.zeros(1, 4, dtype=torch.bool)
    for variant in ("dpace", "dpace_p", "dpace_f"):
        _close(dpace_loss(logits, labels, mask, variant=variant), 0.0)
    _close(dflash_loss(logits, labels, mask, gamma=4.0), 0.0)


def test_float_mask_accepted():
    logits, labels, _ = _block(mask=(1, 1, 0, 1))
    fmask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    _close(
        dpace_loss(logits, labels, fmask),
        sum(CE[j] * HAND_MIDDLE_MASKED["dpace"][j] for j in (1, 3)),
    )


# ------------------------------------------------------------------ gradient


@pytest.mark.parametrize("variant", ["dpace", "dpace_p", "dpace_f"])
def test_weights_carry_no_gradient(variant):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 6, (3, 5), generator=gen)
    mask = torch.rand(3, 5, generator=gen) > 0.2
    loss = dpace_loss(logits, labels, mask, variant=variant, alpha=0.3, batch_size=2)
    (grad,) = torch.autograd.grad(loss, logits)

    # manual: weights computed once as constants, then a plain weighted CE
    with torch.no_grad():
        logp = torch.log_softmax(logits, -1)
        q = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1).exp()
    w = _manual_weights(q.tolist(), mask.tolist(), 0.3, variant)
    leaf = logits.detach().clone().requires_grad_(True)
    ce = -torch.log_softmax(leaf, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    manual = (ce * torch.tensor(w, dtype=torch.float64)).sum() / 2
    (expected,) = torch.autograd.grad(manual, leaf)
    torch.testing.assert_close(loss.detach(), manual.detach())
    torch.testing.assert_close(grad, expected)


def _manual_weights(q, mask, alpha, variant):
    """Independent restatement of the weights from the probabilities (not from CE)."""
    out = []
    for q_row, m_row in zip(q, mask, strict=True):
        b = len(q_row)
        valid = [j > 0 and m_row[j] for j in range(b)]
        qt = [(1 - alpha) * q_row[j] + alpha if valid[j] else 1.0 for j in range(b)]
        p = [math.prod(qt[1 : j + 1]) for j in range(b)]
        row = []
        for j in range(b):
            if not valid[j]:
                row.append(0.0)
            elif variant == "dpace_p":
                row.append(p[j])
            elif variant == "dpace":
                row.append(sum(p[k] for k in range(j, b) if valid[k]))
            else:
                row.append(sum(math.prod(qt[j + 1 : k + 1]) for k in range(j, b) if valid[k]))
        out.append(row)
    return out


def test_dpace_weights_are_detached():
    ce = torch.rand(2, 4, requires_grad=True)
    w = dpace_weights(ce, torch.ones(2, 4))
    assert not w.requires_grad


# ------------------------------------------------------------------ reference parity


def _random_case(seed, n, b):
    gen = torch.Generator().manual_seed(seed)
    # CE in [0, 12]: spans q from 1 down to ~6e-6 so products get small
    ce = torch.rand(n, b, generator=gen, dtype=torch.float64) * 12
    mask = torch.rand(n, b, generator=gen) > 0.3
    if n > 1:
        mask[0] = False  # one all-masked block
    return ce, mask


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 4),
    b=st.integers(1, 9),
    alpha=st.floats(0.0, 1.0),
    variant=st.sampled_from(["dpace", "dpace_p", "dpace_f"]),
)
def test_reference_matches_vectorised(seed, n, b, alpha, variant):
    ce, mask = _random_case(seed, n, b)
    fast = dpace_weights(ce, mask, alpha=alpha, variant=variant)
    slow = dpace_weights_reference(ce, mask, alpha=alpha, variant=variant)
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("seed", range(10))
def test_dpace_is_p_times_f(seed):
    ce, mask = _random_case(seed, 3, 8)
    w = dpace_weights(ce, mask, alpha=0.4, variant="dpace")
    p = dpace_weights(ce, mask, alpha=0.4, variant="dpace_p")
    f = dpace_weights(ce, mask, alpha=0.4, variant="dpace_f")
    torch.testing.assert_close(w, p * f)


def test_dpace_f_finite_when_prefix_underflows():
    ce = torch.tensor([[0.0, 1e4, 1e4, 0.5]], dtype=torch.float64)  # q ~ 0 at j = 1, 2
    mask = torch.ones(1, 4, dtype=torch.bool)
    f = dpace_weights(ce, mask, alpha=0.0, variant="dpace_f")
    # f_1 = 1 + q_2 + q_2 q_3 ~ 1; f_2 = 1 + q_3; f_3 = 1
    _close(f, [[0.0, 1.0, 1.0 + math.exp(-0.5), 1.0]])


# ------------------------------------------------------------------ DFlash


def test_dflash_by_hand():
    logits, labels, mask = _block()
    gamma = 7.0
    w = [math.exp(-(k - 1) / gamma) for k in range(1, 4)]  # 1, e^{-1/7}, e^{-2/7}
    expected = sum(c * wk for c, wk in zip(CE[1:], w, strict=True)) / sum(w)
    _close(dflash_loss(logits, labels, mask, gamma=gamma), expected)


def test_dflash_by_hand_masked_middle():
    logits, labels, mask = _block(mask=(1, 1, 0, 1))
    gamma = 2.0
    w1, w3 = 1.0, math.exp(-2 / gamma)
    expected = (CE[1] * w1 + CE[3] * w3) / (w1 + w3)
    _close(dflash_loss(logits, labels, mask, gamma=gamma), expected)


def test_dflash_infinite_gamma_is_plain_mean():
    logits, labels, mask = _block()
    _close(dflash_loss(logits, labels, mask, gamma=math.inf), sum(CE[1:]) / 3)


def test_default_gamma():
    assert default_gamma(16) == 7
    assert default_gamma(10) == 5
    assert default_gamma(8) == 4
    with pytest.raises(ValueError, match="pass gamma"):
        default_gamma(12)


def test_dflash_registry_default_gamma_uses_block_size():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 8, 5, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 5, (2, 8), generator=gen)
    mask = torch.ones(2, 8)
    _close(make_loss("dflash")(logits, labels, mask), dflash_loss(logits, labels, mask, gamma=4.0))
    with pytest.raises(ValueError, match="pass gamma"):
        make_loss("dflash")(logits[:, :5], labels[:, :5], mask[:, :5])


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_decreases_toward_labels(name):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 8, 10, generator=gen)
    labels = torch.randint(0, 10, (4, 8), generator=gen)
    mask = torch.ones(4, 8)
    loss_fn = make_loss(name)
    nudge = F.one_hot(labels, 10).float()
    before = loss_fn(logits, labels, mask)
    after = loss_fn(logits + 2.0 * nudge, labels, mask)
    assert after < before


# ------------------------------------------------------------------ registry and errors


def test_registry_names_and_types():
    assert set(LOSSES) == {"dpace", "dpace_p", "dpace_f", "dflash"}
    assert make_loss("dpace_f", alpha=0.3) == DPaceLoss(alpha=0.3, variant="dpace_f")
    assert make_loss("dflash", gamma=5.0) == DFlashLoss(gamma=5.0)
    with pytest.raises(AttributeError):
        DPaceLoss().alpha = 0.1  # frozen


def test_unknown_loss_lists_names():
    with pytest.raises(ValueError, match="dpace_p"):
        make_loss("focal")


def test_bad_registry_params():
    with pytest.raises(ValueError, match="allowed"):
        make_loss("dpace", gamma=3.0)
    with pytest.raises(ValueError, match="allowed"):
        make_loss("dflash", alpha=0.5)


@pytest.mark.parametrize("alpha", [-0.1, 1.5, math.nan])
def test_alpha_out_of_range(alpha):
    logits, labels, mask = _block()
    with pytest.raises(ValueError, match="alpha"):
        dpace_loss(logits, labels, mask, alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        dpace_weights(torch.zeros(1, 4), mask, alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        make_loss("dpace", alpha=alpha)


def test_unknown_variant():
    logits, labels, mask = _block()
    with pytest.raises(ValueError, match="variant"):
        dpace_loss(logits, labels, mask, variant="dpace_q")
    with pytest.raises(ValueError, match="variant"):
        dpace_weights_reference(torch.zeros(1, 4), mask, variant="x")


@pytest.mark.parametrize("gamma", [0.0, -1.0, math.nan])
def test_bad_gamma(gamma):
    logits, labels, mask = _block()
    with pytest.raises(ValueError, match="gamma"):
        dflash_loss(logits, labels, mask, gamma=gamma)
    with pytest.raises(ValueError, match="gamma"):
        make_loss("dflash", gamma=gamma)


@pytest.mark.parametrize("batch_size", [0, -2, 1.5, True])
def test_bad_batch_size(batch_size):
    logits, labels, mask = _block()
    with pytest.raises(ValueError, match="batch_size"):
        dpace_loss(logits, labels, mask, batch_size=batch_size)


def test_shape_mismatches():
    logits = torch.zeros(2, 4, 3)
    labels = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.ones(2, 4)
    with pytest.raises(ValueError, match="labels"):
        block_cross_entropy(logits, labels[:, :3], mask)
    with pytest.raises(ValueError, match="mask"):
        dpace_loss(logits, labels, mask[:1])
    with pytest.raises(ValueError, match="logits"):
        dflash_loss(logits[0], labels, mask, gamma=4.0)
    with pytest.raises(ValueError, match="integer"):
        block_cross_entropy(logits, labels.float(), mask)
    with pytest.raises(ValueError, match="mask"):
        dpace_weights(torch.zeros(2, 4), torch.ones(2, 5))
    with pytest.raises(ValueError, match="ce"):
        dpace_weights(torch.zeros(2, 4, 1), torch.ones(2, 4, 1))
