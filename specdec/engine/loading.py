"""Build an engine's parts from references: the target, the drafter, the pre-verifier.

Drafter references: ``none`` (plain autoregressive decoding), ``ngram`` (prompt lookup),
``suffix`` (SuffixDecoding; its index and tree bounds in a ``SuffixConfig``), ``hybrid`` (suffix
or the block drafter ``block_drafter`` with its pre-verifier, per round), ``self`` (the target as
its own AR drafter, a check that accepts everything), a block-drafter checkpoint directory, or
the path / hub id of an autoregressive draft LM. Pre-verifier
references: a checkpoint directory, or ``untrained`` (random weights: PACER runs, but its
scores mean nothing until it is trained).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.models.ar_drafter import ARDrafter
from specdec.models.block_drafter import BlockDrafter
from specdec.models.drafter import Drafter
from specdec.models.hybrid import HybridDrafter
from specdec.models.ngram import NgramDrafter
from specdec.models.preverifier import PreVerifier, PreVerifierConfig
from specdec.models.registry import resolve_model_ref
from specdec.models.suffix import SuffixConfig, SuffixDrafter
from specdec.models.target import TargetModel


@dataclass
class ModelPair:
    target: TargetModel
    drafter: Drafter | None
    preverifier: PreVerifier | None


def load_pair(target_ref: str, drafter_ref: str = "none", preverifier_ref: str | None = None,
              dtype: str = "float32", device: str = "cpu", suffix: SuffixConfig | None = None,
              block_drafter: str | None = None) -> ModelPair:
    target = load_target(target_ref, taps_ref(drafter_ref, block_drafter), dtype, device)
    drafter = load_drafter(drafter_ref, target, dtype, suffix, block_drafter, preverifier_ref)
    return ModelPair(target, drafter, load_preverifier(preverifier_ref, drafter))


def taps_ref(drafter_ref: str, block_drafter: str | None = None) -> str:
    """The reference whose tap layers the target must run: the hybrid's block drafter."""
    if drafter_ref != "hybrid":
        return drafter_ref
    if not block_drafter:
        raise ValueError("drafter hybrid needs a block drafter checkpoint (block_drafter)")
    return resolve_model_ref(block_drafter)


def target_taps(drafter_ref: str) -> tuple[int, ...]:
    """Target layers whose outputs the drafter reads (only block drafters read any)."""
    if BlockDrafter.is_checkpoint(drafter_ref):
        return BlockDrafter.read_config(drafter_ref)[0].tap_layers
    return ()


def load_target(target_ref: str, drafter_ref: str = "none", dtype: str = "float32",
                device: str = "cpu", kv_slots: int = 8) -> TargetModel:
    """The target, tapping the layers that ``drafter_ref`` needs as features; on the runtime it
    holds at most ``kv_slots`` requests' KV caches at once."""
    return TargetModel.from_pretrained(target_ref, dtype=dtype, tap_layers=target_taps(drafter_ref),
                                       device=device, pool_size=kv_slots)


def load_preverifier(ref: str | None, drafter: Drafter | None) -> PreVerifier | None:
    if not ref or getattr(drafter, "pacer_inside", False):  # the hybrid holds its own
        return None
    if ref == "untrained":
        return untrained_preverifier(drafter) if drafter is not None else None
    preverifier = PreVerifier.load(ref)
    if drafter is not None and preverifier.c.input_size != drafter.hidden_size:
        raise ValueError(f"pre-verifier {ref} reads {preverifier.c.input_size}-wide "
                         f"states; the drafter's are {drafter.hidden_size}-wide")
    return preverifier


def load_drafter_side(drafter_ref: str, target_ref: str, dtype: str = "float32",
                      device: str = "cpu", suffix: SuffixConfig | None = None,
                      block_drafter: str | None = None,
                      preverifier_ref: str | None = None) -> Drafter | None:
    """The drafter alone, for a process that does not run the target: the target is loaded
    only when the drafter borrows its weights (a block drafter's embedding and lm_head, or
    ``self``); the n-gram and suffix drafters need only the target's vocabulary size."""
    if drafter_ref == "none":
        return None
    if drafter_ref in ("ngram", "suffix"):
        from transformers import AutoConfig

        from specdec.models.sources import resolve

        vocab_size = AutoConfig.from_pretrained(resolve(target_ref)).vocab_size
        if drafter_ref == "suffix":
            return SuffixDrafter.load(vocab_size, suffix or SuffixConfig())
        return NgramDrafter(vocab_size)
    if drafter_ref in ("self", "hybrid") or BlockDrafter.is_checkpoint(drafter_ref):
        target = load_target(target_ref, taps_ref(drafter_ref, block_drafter), dtype, device)
        return load_drafter(drafter_ref, target, dtype, suffix, block_drafter, preverifier_ref)
    return ARDrafter.from_pretrained(drafter_ref, dtype=dtype, device=device)


def load_drafter(ref: str, target: TargetModel, dtype: str = "float32",
                 suffix: SuffixConfig | None = None, block_drafter: str | None = None,
                 preverifier_ref: str | None = None) -> Drafter | None:
    if ref == "none":
        return None
    if ref == "ngram":
        return NgramDrafter(target.vocab_size)
    if ref == "suffix":
        return SuffixDrafter.load(target.vocab_size, suffix or SuffixConfig())
    if ref == "hybrid":
        return load_hybrid(target, suffix or SuffixConfig(), taps_ref(ref, block_drafter),
                           preverifier_ref)
    if ref == "self":
        return ARDrafter(target.model)
    if BlockDrafter.is_checkpoint(ref):
        return BlockDrafter.load(ref, target)
    return ARDrafter.from_pretrained(ref, dtype=dtype, device=target.device)


def load_hybrid(target: TargetModel, suffix: SuffixConfig, block_ref: str,
                preverifier_ref: str | None) -> HybridDrafter:
    if not preverifier_ref:
        raise ValueError("drafter hybrid needs a pre-verifier (its PACER estimate picks the draft)")
    if not BlockDrafter.is_checkpoint(block_ref):
        raise FileNotFoundError(f"hybrid: {block_ref} is not a block-drafter checkpoint")
    block = BlockDrafter.load(block_ref, target)
    preverifier = load_preverifier(resolve_model_ref(preverifier_ref), block)
    return HybridDrafter(SuffixDrafter.load(target.vocab_size, suffix), block, preverifier)


def untrained_preverifier(drafter: Drafter, seed: int = 0) -> PreVerifier:
    """A randomly initialised pre-verifier for a drafter: it runs, it just knows nothing yet."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return PreVerifier(PreVerifierConfig(input_size=drafter.hidden_size)).eval()
