"""Training losses for parallel block drafters (DFlash-style).

What this module is: pure-tensor loss functions for a drafter that predicts a
block of ``B`` positions at once, plus ``LOSSES``, their catalog, to build them by name.

* DFlash baseline -- a per-position CE with exponentially decaying weights
  (DFlash, arXiv 2602.06036; reference code z-lab/dflash).
* D-PACE and its two ablations ``dpace_p`` / ``dpace_f`` -- a CE weighted by a
  (detached) estimate of how much each position contributes to the expected
  accepted length (D-PACE, arXiv 2605.18810; reference code Lucas-TY/D-PACE).

What it is not: no model, no data loading, no anchor sampling, no optimiser,
no distributed code. Callers hand in logits already laid out as blocks.

Terms, defined once and used throughout:

* ``N`` -- number of blocks in the batch; ``B`` -- block size; ``V`` -- vocab.
* ``logits`` [N, B, V] -- drafter outputs; ``labels`` [N, B] long -- target
  token ids (any value, e.g. -100, at invalid positions).
* ``mask`` [N, B] bool/float -- non-zero marks a valid position. Column ``j = 0``
  is the *anchor* (the last verified token, already known) and is always
  excluded, whatever the mask says. A float mask is binarised (``!= 0``); it is
  not used as a soft weight.
* ``CE_j`` -- cross entropy of the label at block position ``j``.
* ``q_j = exp(-CE_j)`` -- the draft probability of the label token.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.catalog import Catalog, Entry

__all__ = [
    "DPACE_VARIANTS",
    "DFlashLoss",
    "DPaceLoss",
    "LOSSES",
    "block_cross_entropy",
    "default_gamma",
    "dflash_loss",
    "dflash_weights",
    "dpace_loss",
    "dpace_weights",
    "dpace_weights_reference",
    "make_loss",
]

DPACE_VARIANTS = ("dpace", "dpace_p", "dpace_f")

# DFlash paper defaults: decay gamma per block size.
_DEFAULT_GAMMAS = {16: 7.0, 10: 5.0, 8: 4.0}


# --------------------------------------------------------------------------- checks


def _check_block_shapes(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> None:
    if logits.dim() != 3:
        raise ValueError(f"logits must be [N, B, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating tensor, got dtype {logits.dtype}")
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must be [N, B] = {tuple(logits.shape[:2])} to match logits "
            f"{tuple(logits.shape)}, got {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(f"labels must hold integer token ids, got dtype {labels.dtype}")
    if mask.shape != labels.shape:
        raise ValueError(
            f"mask must have the labels' shape {tuple(labels.shape)}, got {tuple(mask.shape)}"
        )


def _check_ce_mask(ce: torch.Tensor, mask: torch.Tensor) -> None:
    if ce.dim() != 2:
        raise ValueError(f"ce must be [N, B], got shape {tuple(ce.shape)}")
    if mask.shape != ce.shape:
        raise ValueError(
            f"mask must have the ce's shape {tuple(ce.shape)}, got {tuple(mask.shape)}"
        )


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:  # also rejects NaN
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")


def _check_variant(variant: str) -> None:
    if variant not in DPACE_VARIANTS:
        raise ValueError(f"unknown D-PACE variant {variant!r}; expected one of {DPACE_VARIANTS}")


def _check_gamma(gamma: float) -> None:
    if not gamma > 0:  # also rejects NaN; math.inf is allowed (uniform weights)
        raise ValueError(f"gamma must be > 0, got {gamma}")


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


# --------------------------------------------------------------------------- shared pieces


def _valid_positions(mask: torch.Tensor) -> torch.Tensor:
    """Boolean validity [N, B]: ``mask != 0`` with the anchor column forced off."""
    valid = mask != 0  # valid: [N, B] bool
    valid[:, :1] = False  # j = 0 is the anchor, never scored
    return valid


def block_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-position cross entropy ``CE_j = -log softmax(logits_j)[labels_j]``.

    Returns ``ce`` [N, B] in the logits' dtype, with 0 at invalid positions and
    at the anchor column ``j = 0``. Labels at invalid positions are replaced by
    0 before the gather, so out-of-range values such as -100 are harmless.
    """
    _check_block_shapes(logits, labels, mask)
    n, b, v = logits.shape
    valid = _valid_positions(mask)  # valid: [N, B]
    safe_labels = torch.where(valid, labels, torch.zeros_like(labels))  # [N, B]
    ce = F.cross_entropy(
        logits.reshape(n * b, v), safe_labels.reshape(n * b).long(), reduction="none"
    ).reshape(n, b)  # ce: [N, B]
    return torch.where(valid, ce, torch.zeros_like(ce))


def _weight_dtype(dtype: torch.dtype) -> torch.dtype:
    """Weights are computed in at least float32 (cumulative products of bf16 drift)."""
    return torch.promote_types(dtype, torch.float32)


# --------------------------------------------------------------------------- DFlash


def default_gamma(block_size: int) -> float:
    """DFlash decay constant for ``block_size``: 7 for B=16, 5 for B=10, 4 for B=8.

    These are the three sizes the DFlash paper reports. No rule is given for
    other sizes, so they raise; pass ``gamma`` explicitly instead.
    """
    if block_size not in _DEFAULT_GAMMAS:
        raise ValueError(
            f"no default DFlash gamma for block size {block_size}; known sizes are "
            f"{sorted(_DEFAULT_GAMMAS)} -- pass gamma explicitly"
        )
    return _DEFAULT_GAMMAS[block_size]


def dflash_weights(block_size: int, *, gamma: float) -> torch.Tensor:
    """DFlash position weights [B]: ``w_k = exp(-(k - 1) / gamma)`` for k >= 1, ``w_0 = 0``.

    The first draft position (k = 1) has weight 1; later positions decay,
    since an error there only matters if every earlier position was accepted.
    """
    _check_gamma(gamma)
    k = torch.arange(block_size, dtype=torch.float64)  # k: [B]
    w = torch.exp(-(k - 1) / gamma)  # w: [B]
    w[:1] = 0.0  # anchor
    return w


def dflash_loss(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, *, gamma: float
) -> torch.Tensor:
    """DFlash baseline loss (arXiv 2602.06036): decay-weighted mean CE.

    ``L = sum_{n, k} CE[n, k] * w_k * m[n, k] / sum_{n, k} w_k * m[n, k]`` with
    ``w_k = exp(-(k - 1) / gamma)`` and ``m`` the validity mask (anchor off).
    Returns a scalar; 0 (still differentiable) when nothing is valid.
    """
    _check_gamma(gamma)
    ce = block_cross_entropy(logits, labels, mask)  # ce: [N, B]
    valid = _valid_positions(mask)  # valid: [N, B]
    w = dflash_weights(ce.shape[1], gamma=gamma).to(ce.device, _weight_dtype(ce.dtype))  # w: [B]
    wm = w.unsqueeze(0) * valid.to(w.dtype)  # wm: [N, B]
    total = (ce * wm).sum()  # scalar
    norm = wm.sum().clamp_min(torch.finfo(wm.dtype).tiny)  # scalar, > 0
    return (total / norm).to(ce.dtype)


# --------------------------------------------------------------------------- D-PACE


def _suffix_sum(x: torch.Tensor) -> torch.Tensor:
    """``out[..., j] = sum_{k >= j} x[..., k]`` along the last dim."""
    return torch.flip(torch.cumsum(torch.flip(x, dims=[-1]), dim=-1), dims=[-1])


def _continuation(q_tilde: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Continuation value ``f_j = sum_{k >= j} m_k prod_{j < i <= k} q~_i`` [N, B].

    Equal to ``sum_{k >= j} (P_k / P_j) m_k`` but computed without the division,
    so it stays exact when a prefix product underflows to 0 (alpha = 0).
    Cost is O(N B^2), which is small for drafter block sizes.
    """
    n, b = q_tilde.shape
    after = torch.ones(b, b, dtype=torch.bool, device=q_tilde.device).triu(1)  # after[j, i] = i > j
    # factors[n, j, i] = q~[n, i] if i > j else 1: the terms in the product for row j
    factors = torch.where(after, q_tilde.unsqueeze(1), torch.ones_like(q_tilde).unsqueeze(1))
    ratio = torch.cumprod(factors, dim=-1)  # ratio[n, j, k] = prod_{j < i <= k} q~_i: [N, B, B]
    upper = after | torch.eye(b, dtype=torch.bool, device=q_tilde.device)  # k >= j: [B, B]
    terms = ratio * (upper & valid.unsqueeze(1)).to(ratio.dtype)  # [N, B, B]
    return terms.sum(dim=-1)  # f: [N, B]


def dpace_weights(
    ce: torch.Tensor, mask: torch.Tensor, *, alpha: float = 0.5, variant: str = "dpace"
) -> torch.Tensor:
    """Detached D-PACE position weights ``w`` [N, B] (arXiv 2605.18810).

    Per block, over positions j = 1..B-1 with validity ``m_j``:

    * ``q_j = exp(-CE_j)``; smoothed ``q~_j = (1 - alpha) q_j + alpha`` (1 where invalid)
    * ``P_j = prod_{1 <= i <= j} q~_i`` -- estimated chance the draft survives to j
    * ``f_j = sum_{k >= j} (P_k / P_j) m_k`` -- expected valid positions accepted from j on
    * ``dpace``: ``w_j = P_j f_j = sum_{k >= j} P_k m_k``; ``dpace_p``: ``w_j = P_j``;
      ``dpace_f``: ``w_j = f_j``.

    Smoothing only enters the weights, never the CE. ``alpha`` must be in [0, 1]
    (the paper finds 0.3..0.7 stable and alpha = 0 collapsing). The result
    carries no gradient and is 0 at the anchor and at invalid positions.
    """
    _check_alpha(alpha)
    _check_variant(variant)
    _check_ce_mask(ce, mask)
    valid = _valid_positions(mask)  # valid: [N, B]
    with torch.no_grad():
        q = torch.exp(-ce.detach().to(_weight_dtype(ce.dtype)))  # q: [N, B]
        q_tilde = torch.where(valid, (1.0 - alpha) * q + alpha, torch.ones_like(q))  # [N, B]
        prefix = torch.cumprod(q_tilde, dim=-1)  # P: [N, B]; q~_0 = 1 so P starts at j = 1
        if variant == "dpace":
            w = _suffix_sum(prefix * valid.to(prefix.dtype))  # w_j = sum_{k>=j} P_k m_k
        elif variant == "dpace_p":
            w = prefix  # w_j = P_j
        else:
            w = _continuation(q_tilde, valid)  # w_j = f_j
        w = torch.where(valid, w, torch.zeros_like(w))  # [N, B]
    return w.to(ce.dtype)


def dpace_weights_reference(
    ce: torch.Tensor, mask: torch.Tensor, *, alpha: float = 0.5, variant: str = "dpace"
) -> torch.Tensor:
    """Slow, loop-by-loop restatement of :func:`dpace_weights` (for tests and reading).

    Same inputs, outputs and conventions; plain Python floats, one block at a time.
    """
    _check_alpha(alpha)
    _check_variant(variant)
    _check_ce_mask(ce, mask)
    ce_rows = ce.detach().to(torch.float64).tolist()
    mask_rows = (mask != 0).tolist()
    out = [_reference_block(c, m, alpha, variant) for c, m in zip(ce_rows, mask_rows, strict=True)]
    return torch.tensor(out, dtype=ce.dtype, device=ce.device).reshape(ce.shape)


def _reference_block(ce: list[float], mask: list[bool], alpha: float, variant: str) -> list[float]:
    b = len(ce)
    valid = [j > 0 and mask[j] for j in range(b)]
    q_tilde = [(1 - alpha) * math.exp(-ce[j]) + alpha if valid[j] else 1.0 for j in range(b)]
    prefix, running = [1.0] * b, 1.0
    for j in range(1, b):
        running *= q_tilde[j]
        prefix[j] = running
    weights = [0.0] * b
    for j in range(1, b):
        if not valid[j]:
            continue
        if variant == "dpace_p":
            weights[j] = prefix[j]
        elif variant == "dpace":
            weights[j] = sum(prefix[k] for k in range(j, b) if valid[k])
        else:  # dpace_f: walk forward from j, multiplying in q~ of each later position
            survive, total = 1.0, 0.0
            for k in range(j, b):
                if k > j:
                    survive *= q_tilde[k]
                if valid[k]:
                    total += survive
            weights[j] = total
    return weights


def dpace_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
    *,
    alpha: float = 0.5,
    variant: str = "dpace",
    batch_size: int | None = None,
) -> torch.Tensor:
    """D-PACE loss (arXiv 2605.18810): ``L = sum_{n, j} CE[n, j] * stopgrad(w[n, j]) / batch_size``.

    ``w`` comes from :func:`dpace_weights` (0 at the anchor and invalid
    positions). ``batch_size`` defaults to N, the number of blocks; pass the
    number of sequences to match the paper's normalisation (the reference code
    divides by the sequence batch size, each sequence holding many blocks).
    """
    _check_alpha(alpha)
    _check_variant(variant)
    if batch_size is not None:
        _check_batch_size(batch_size)
    ce = block_cross_entropy(logits, labels, mask)  # ce: [N, B]
    denom = batch_size if batch_size is not None else max(ce.shape[0], 1)  # N = 0 gives 0 / 1
    w = dpace_weights(ce, mask, alpha=alpha, variant=variant)  # w: [N, B], no grad
    return (ce * w).sum() / denom


# --------------------------------------------------------------------------- registry

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DPaceLoss:
    """A configured D-PACE loss: ``DPaceLoss(alpha=0.5)(logits, labels, mask)``."""

    alpha: float = 0.5
    variant: str = "dpace"
    batch_size: int | None = None

    def __post_init__(self) -> None:
        _check_alpha(self.alpha)
        _check_variant(self.variant)
        if self.batch_size is not None:
            _check_batch_size(self.batch_size)

    def __call__(
        self, logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        return dpace_loss(
            logits,
            labels,
            mask,
            alpha=self.alpha,
            variant=self.variant,
            batch_size=self.batch_size,
        )


@dataclass(frozen=True)
class DFlashLoss:
    """A configured DFlash loss; ``gamma=None`` means ``default_gamma(B)`` at call time."""

    gamma: float | None = None

    def __post_init__(self) -> None:
        if self.gamma is not None:
            _check_gamma(self.gamma)

    def __call__(
        self, logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        gamma = self.gamma if self.gamma is not None else default_gamma(logits.shape[1])
        return dflash_loss(logits, labels, mask, gamma=gamma)


def _dpace_family(variant: str) -> Callable[..., DPaceLoss]:
    def build(*, alpha: float = 0.5, batch_size: int | None = None) -> DPaceLoss:
        return DPaceLoss(alpha=alpha, variant=variant, batch_size=batch_size)

    build.__name__ = f"build_{variant}"
    return build


def _dflash_family(*, gamma: float | None = None) -> DFlashLoss:
    return DFlashLoss(gamma=gamma)


# The losses: each entry's builder takes the loss's keyword parameters and returns a LossFn.
LOSSES = Catalog(
    "loss",
    Entry("dpace", _dpace_family("dpace"), "D-PACE: CE weighted by expected accepted length"),
    Entry("dpace_p", _dpace_family("dpace_p"), "D-PACE ablation: w_j = P_j"),
    Entry("dpace_f", _dpace_family("dpace_f"), "D-PACE ablation: w_j = f_j"),
    Entry("dflash", _dflash_family, "DFlash: CE with exponentially decaying position weights"),
)


def make_loss(name: str, **params: object) -> LossFn:
    """Build a loss by name: ``make_loss("dpace", alpha=0.5)(logits, labels, mask)``.

    Parameters: ``dpace`` / ``dpace_p`` / ``dpace_f`` take ``alpha`` and
    ``batch_size``; ``dflash`` takes ``gamma`` (default: ``default_gamma(B)``).
    """
    return LOSSES.build(name, **params)
