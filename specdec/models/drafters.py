"""The drafter catalog: every kind of drafter, how to load it, and what it needs.

A drafter reference names an entry (``none``, ``ngram``, ``suffix``, ``hybrid``, ``self``) or is
claimed by one: a block-drafter checkpoint directory (``block``), else the path or hub id of an
autoregressive draft LM (``ar``, tried last). Each entry's builder takes ``(args, target)``:
the ``DrafterArgs`` it is loaded from and the target: the ``TargetModel`` where the target
runs, its ``TargetParts`` on a drafter-only process, None there for the kinds that do not need
the target's weights.

What each kind needs (``Entry.needs``):
- ``vocab``: only the target's vocabulary size (n-gram, suffix);
- ``target_weights``: the target's weights: the block drafter shares its embedding and lm_head
  (on a drafter-only process, ``TargetParts`` reads just those), ``self`` drafts with the whole
  language model (loaded as an ``ARDrafter`` there); a ``TargetModel`` is never built for them;
- ``target_features``: the target's hidden states at its ``tap_layers``, which ``tap_layers``
  reads from the checkpoint's config file alone, so the target side never loads a drafter's
  weights to learn them;
- ``preverifier``: a pre-verifier reference (the hybrid runs PACER itself);
- ``suffix``: the suffix tree's options and offline index (``SuffixConfig``).

A kind with per-request options names their config (``Entry.config``): the suffix drafter's
``SuffixOptions`` and the hybrid's ``HybridOptions``, sections of a request's ``SpecSettings``.

What it is not: no drafting (the drafters' own modules), no target loading (``specdec.engine
.loading``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.catalog import Catalog, Entry
from specdec.models.ar_drafter import ARDrafter
from specdec.models.block_drafter import BlockDrafter
from specdec.models.drafter import Drafter
from specdec.models.hybrid import HybridDrafter, HybridOptions
from specdec.models.ngram import NgramDrafter
from specdec.models.preverifier import load_preverifier
from specdec.models.registry import resolve_model_ref
from specdec.models.suffix import SuffixConfig, SuffixDrafter, SuffixOptions
from specdec.models.target import TargetModel
from specdec.models.target_parts import TargetParts

Target = TargetModel | TargetParts  # what a builder is given of the target


@dataclass(frozen=True)
class DrafterArgs:
    """What a drafter is loaded from: its reference and the options some kinds read."""

    ref: str
    vocab_size: int | None = None  # the target's; None where no kind that needs it is built
    dtype: str = "float32"
    device: str = "cpu"
    suffix: SuffixConfig = field(default_factory=SuffixConfig)  # suffix, hybrid
    block_drafter: str | None = None  # hybrid: its block-drafter checkpoint
    preverifier: str | None = None  # hybrid: its pre-verifier

    def hybrid_block(self) -> str:
        """The hybrid's block-drafter checkpoint, resolved to a local directory."""
        if not self.block_drafter:
            raise ValueError("drafter hybrid needs a block drafter checkpoint (block_drafter)")
        return resolve_model_ref(self.block_drafter)


def block_taps(ref: str) -> tuple[int, ...]:
    """The target layers a block-drafter checkpoint reads: its config file, no weights."""
    return BlockDrafter.read_config(ref)[0].tap_layers


def load_hybrid(args: DrafterArgs, target: Target) -> HybridDrafter:
    if not args.preverifier:
        raise ValueError("drafter hybrid needs a pre-verifier (its PACER estimate picks the draft)")
    block_ref = args.hybrid_block()
    if not BlockDrafter.is_checkpoint(block_ref):
        raise FileNotFoundError(f"hybrid: {block_ref} is not a block-drafter checkpoint")
    block = BlockDrafter.load(block_ref, target)
    preverifier = load_preverifier(resolve_model_ref(args.preverifier), block)
    return HybridDrafter(SuffixDrafter.load(target.vocab_size, args.suffix), block, preverifier)


def self_drafter(target: Target) -> ARDrafter:
    """The target's language model as its own drafter: the running target's, or on a
    drafter-only process the same checkpoint loaded as a plain LM (no KV pool)."""
    if isinstance(target, TargetModel):
        return ARDrafter(target.model)
    return ARDrafter.from_pretrained(target.ref, dtype=target.dtype, device=target.device)


DRAFTERS = Catalog(
    "drafter",
    Entry("none", lambda args, target: None, "no drafter: plain autoregressive decoding"),
    Entry("ngram", lambda args, target: NgramDrafter(args.vocab_size), "n-gram prompt lookup",
          needs=frozenset({"vocab"})),
    Entry("suffix", lambda args, target: SuffixDrafter.load(args.vocab_size, args.suffix),
          "SuffixDecoding over the request and the target's earlier responses",
          needs=frozenset({"vocab", "suffix"}), config=SuffixOptions),
    Entry("hybrid", load_hybrid, "per round the suffix draft or the block drafter's PACER draft",
          needs=frozenset({"target_weights", "target_features", "preverifier", "suffix"}),
          tap_layers=lambda args: block_taps(args.hybrid_block()), config=HybridOptions),
    Entry("self", lambda args, target: self_drafter(target),
          "the target drafts for itself (a check that accepts everything)",
          needs=frozenset({"target_weights"})),
    Entry("block", lambda args, target: BlockDrafter.load(args.ref, target),
          "a block-drafter checkpoint directory (DFlash-style, trained with D-PACE)",
          needs=frozenset({"target_weights", "target_features"}),
          tap_layers=lambda args: block_taps(args.ref), claims=BlockDrafter.is_checkpoint),
    Entry("ar", lambda args, target: ARDrafter.from_pretrained(args.ref, dtype=args.dtype,
                                                               device=args.device),
          "an autoregressive draft LM: a path or hub id sharing the target's tokenizer",
          claims=lambda ref: True),
)


MODEL_FREE = frozenset({"ngram", "suffix"})  # kinds that draft by lookup, with no forward


def runs_no_model(ref: str) -> bool:
    """Whether the drafter ``ref`` drafts by lookup alone (no forward): it can run on the
    target's own thread at almost no cost."""
    return DRAFTERS.resolve(ref).name in MODEL_FREE


def drafter_taps(args: DrafterArgs) -> tuple[int, ...]:
    """Target layers whose outputs the drafter ``args`` reads (only block drafters read any)."""
    return DRAFTERS.resolve(args.ref).tap_layers(args)


def build_drafter(args: DrafterArgs, target: Target | None) -> Drafter | None:
    """The drafter ``args`` names; ``target`` may be None unless its kind needs target_weights."""
    entry = DRAFTERS.resolve(args.ref)
    if "target_weights" in entry.needs and target is None:
        raise ValueError(f"drafter {args.ref!r} ({entry.name}) needs the target's weights")
    return entry.builder()(args, target)
