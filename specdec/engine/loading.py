"""Build an engine's parts from references: the target, the drafter, the pre-verifier.

Drafter references: ``none`` (plain autoregressive decoding), ``ngram`` (prompt lookup),
``self`` (the target as its own AR drafter, a check that accepts everything), a block-drafter
checkpoint directory, or the path / hub id of an autoregressive draft LM.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.models.ar_drafter import ARDrafter
from specdec.models.block_drafter import BlockDrafter
from specdec.models.drafter import Drafter
from specdec.models.ngram import NgramDrafter
from specdec.models.preverifier import PreVerifier
from specdec.models.target import TargetModel


@dataclass
class ModelPair:
    target: TargetModel
    drafter: Drafter | None
    preverifier: PreVerifier | None


def load_pair(target_ref: str, drafter_ref: str = "none", preverifier_ref: str | None = None,
              dtype: str = "float32") -> ModelPair:
    taps: tuple[int, ...] = ()
    if BlockDrafter.is_checkpoint(drafter_ref):
        taps = BlockDrafter.read_config(drafter_ref)[0].tap_layers
    target = TargetModel.from_pretrained(target_ref, dtype=dtype, tap_layers=taps)
    drafter = load_drafter(drafter_ref, target, dtype)
    preverifier = None
    if preverifier_ref:
        preverifier = PreVerifier.load(preverifier_ref)
        if drafter is not None and preverifier.c.input_size != drafter.hidden_size:
            raise ValueError(f"pre-verifier {preverifier_ref} reads {preverifier.c.input_size}-wide "
                             f"states; the drafter's are {drafter.hidden_size}-wide")
    return ModelPair(target, drafter, preverifier)


def load_drafter(ref: str, target: TargetModel, dtype: str = "float32") -> Drafter | None:
    if ref == "none":
        return None
    if ref == "ngram":
        return NgramDrafter(target.vocab_size)
    if ref == "self":
        return ARDrafter(target.model)
    if BlockDrafter.is_checkpoint(ref):
        return BlockDrafter.load(ref, target)
    return ARDrafter.from_pretrained(ref, dtype=dtype)


def untrained_preverifier(drafter: Drafter, seed: int = 0) -> PreVerifier:
    """A randomly initialised pre-verifier for a drafter: it runs, it just knows nothing yet."""
    import torch

    from specdec.models.preverifier import PreVerifierConfig

    torch.manual_seed(seed)
    return PreVerifier(PreVerifierConfig(input_size=drafter.hidden_size)).eval()
