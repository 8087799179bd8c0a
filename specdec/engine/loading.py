"""Build an engine's parts from references: the target, the drafter, the pre-verifier.

Drafter references are the entries of ``specdec.models.drafters.DRAFTERS``: ``none`` (plain
autoregressive decoding), ``ngram`` (prompt lookup), ``suffix`` (SuffixDecoding; its index and
tree bounds in a ``SuffixConfig``), ``hybrid`` (suffix or the block drafter ``block_drafter``
with its pre-verifier, per round), ``self`` (the target as its own AR drafter, a check that
accepts everything), a block-drafter checkpoint directory, or the path / hub id of an
autoregressive draft LM. Pre-verifier and acceptance-model references: a checkpoint
directory, or ``untrained`` (random weights: PACER runs, but its scores mean nothing until it is
trained). With an acceptance model the target taps what it reads (``acceptance_taps``), and
only then.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.models.acceptance import AcceptanceModel, acceptance_taps, load_acceptance
from specdec.models.drafter import Drafter
from specdec.models.drafters import DRAFTERS, DrafterArgs, build_drafter, drafter_taps
from specdec.models.preverifier import PreVerifier, load_preverifier, untrained_preverifier
from specdec.models.suffix import SuffixConfig
from specdec.models.target import TargetModel, dtype_name
from specdec.models.target_parts import TargetParts

__all__ = ["ModelPair", "load_acceptance", "load_drafter", "load_drafter_side", "load_pair",
           "load_preverifier", "load_target", "target_taps", "untrained_preverifier"]


@dataclass
class ModelPair:
    target: TargetModel
    drafter: Drafter | None
    preverifier: PreVerifier | None
    acceptance: AcceptanceModel | None = None


def load_pair(target_ref: str, drafter_ref: str = "none", preverifier_ref: str | None = None,
              dtype: str = "float32", device: str = "cpu", suffix: SuffixConfig | None = None,
              block_drafter: str | None = None, acceptance_ref: str | None = None,
              **runtime) -> ModelPair:
    """The target (``runtime``: ``load_target``'s knobs of its plan), its drafter, the
    pre-verifier and the acceptance model (``acceptance_ref``: a directory or ``untrained``)."""
    on = bool(acceptance_ref) and drafter_ref != "none"
    target = load_target(target_ref, drafter_ref, dtype, device, block_drafter=block_drafter,
                         acceptance=on, **runtime)
    drafter = load_drafter(drafter_ref, target, dtype, suffix, block_drafter, preverifier_ref)
    kind = DRAFTERS.resolve(drafter_ref).name
    return ModelPair(target, drafter, load_preverifier(preverifier_ref, drafter),
                     load_acceptance(acceptance_ref if on else None, kind, drafter, target))


def target_taps(drafter_ref: str, block_drafter: str | None = None) -> tuple[int, ...]:
    """Target layers whose outputs the drafter reads (only block drafters read any), from the
    drafter kind's catalog entry: a checkpoint's config file, never its weights."""
    return drafter_taps(DrafterArgs(drafter_ref, block_drafter=block_drafter))


def load_target(target_ref: str, drafter_ref: str = "none", dtype: str = "float32",
                device: str = "cpu", kv_slots: int = 8,
                block_drafter: str | None = None, attention: str = "auto",
                linears: str = "auto", kv_cache_dtype: str = "auto",
                max_model_len: int | None = None, backend: str = "auto",
                omp_wait_policy: str = "auto", isa: str = "auto",
                threads_by_load: str = "auto", acceptance: bool = False) -> TargetModel:
    """The target, tapping the layers that ``drafter_ref`` needs as features (and, with an
    ``acceptance`` model, the layer it reads: ``acceptance_taps``); on the runtime
    as the plan of its knobs says (``specdec.runtime.RuntimeConfig``: ``kv_slots`` requests of
    ``max_model_len`` positions at once, ``backend`` torch or x86, its linears, attention, KV
    dtype and x86 kernels' ``isa``, the OpenMP wait policy its process started with, and
    ``threads_by_load``)."""
    taps = target_taps(drafter_ref, block_drafter)
    if acceptance:
        from transformers import AutoConfig

        from specdec.models.sources import resolve

        layers = AutoConfig.from_pretrained(resolve(target_ref)).num_hidden_layers
        taps = acceptance_taps(layers, taps)
    return TargetModel.from_pretrained(target_ref, dtype=dtype, tap_layers=taps, device=device,
                                       pool_size=kv_slots, attention=attention, linears=linears,
                                       kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len,
                                       runtime_backend=backend,
                                       omp_wait_policy=omp_wait_policy, isa=isa,
                                       threads_by_load=threads_by_load)


def load_drafter_side(drafter_ref: str, target_ref: str, dtype: str = "float32",
                      device: str = "cpu", suffix: SuffixConfig | None = None,
                      block_drafter: str | None = None,
                      preverifier_ref: str | None = None) -> Drafter | None:
    """The drafter alone, for a process that does not run the target: of the target it reads
    only what the drafter kind needs -- a block drafter's embedding and lm_head (``TargetParts``,
    from the target's safetensors, in the dtype and on the device the target would hold them),
    the whole language model for ``self``, the vocabulary size for the n-gram and suffix
    drafters. It never builds a ``TargetModel`` (nor its KV pool)."""
    needs = DRAFTERS.resolve(drafter_ref).needs
    parts, vocab_size = None, None
    if "target_weights" in needs:
        parts = TargetParts.load(target_ref, dtype, device)
        vocab_size = parts.vocab_size
    elif "vocab" in needs:
        from transformers import AutoConfig

        from specdec.models.sources import resolve

        vocab_size = AutoConfig.from_pretrained(resolve(target_ref)).vocab_size
    return build_drafter(DrafterArgs(drafter_ref, vocab_size, dtype, device,
                                     suffix or SuffixConfig(), block_drafter, preverifier_ref),
                         parts)


def load_drafter(ref: str, target: TargetModel, dtype: str = "float32",
                 suffix: SuffixConfig | None = None, block_drafter: str | None = None,
                 preverifier_ref: str | None = None) -> Drafter | None:
    """The drafter ``ref`` for ``target`` (its vocabulary, device and, for some kinds, weights);
    dtype auto: the target's, as its plan resolved it."""
    if dtype == "auto":
        dtype = dtype_name(target.dtype)
    args = DrafterArgs(ref, target.vocab_size, dtype, target.device, suffix or SuffixConfig(),
                       block_drafter, preverifier_ref)
    return build_drafter(args, target)
