"""The target model: an HF causal LM behind a small, explicit KV-cache API.

Per-request state lives in a ``TargetState`` that the caller owns (the engine, or a serving
actor keyed by request id); ``TargetModel`` itself is stateless between calls, so one model
serves many interleaved requests. The adapter can return the outputs of chosen layers ("taps"),
the context features a DFlash-style block drafter reads.

It knows nothing about drafting or verification.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from specdec.models.kv import cached_forward, crop_cache, new_cache
from specdec.models.sources import parse_device, parse_dtype, resolve


@dataclass
class TargetState:
    """One request's KV cache. ``length`` tokens are cached (positions 0..length-1)."""

    cache: DynamicCache
    length: int = 0


@dataclass(frozen=True)
class TargetOutput:
    logits: torch.Tensor  # [k, V] raw logits; row i predicts the token after input i
    # (only the last row, [1, V], from a forward with last_logits_only: a prefill)
    taps: torch.Tensor | None  # [k, n_taps * H] outputs of the tapped layers, concatenated


def evenly_spaced_taps(num_layers: int, n: int) -> tuple[int, ...]:
    """n layer indices evenly spaced between layer 1 and L-3 (DFlash's choice); 30 layers, 3 -> 1, 14, 27."""
    if n < 1:
        raise ValueError("need at least one tapped layer")
    lo, hi = 1, max(1, num_layers - 3)
    if n == 1:
        return (hi,)
    return tuple(round(lo + i * (hi - lo) / (n - 1)) for i in range(n))


class TargetModel:
    """Prefill, extend by k tokens, crop; logits and hidden-state taps of every new position."""

    def __init__(self, model, tokenizer, tap_layers: tuple[int, ...] = ()):
        self.model = model.eval()
        self.tokenizer = tokenizer
        config = model.config
        self.num_layers = config.num_hidden_layers
        self.hidden_size = config.hidden_size
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = getattr(config, "max_position_embeddings", None) or 2048
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        bad = [layer for layer in tap_layers if not 0 <= layer < self.num_layers]
        if bad:
            raise ValueError(f"tap layers {bad} outside 0..{self.num_layers - 1}")
        self.tap_layers = tuple(tap_layers)

    @classmethod
    def from_pretrained(cls, ref: str, dtype="float32", tap_layers: tuple[int, ...] = (),
                        device="cpu"):
        path = resolve(ref)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=parse_dtype(dtype), use_safetensors=True
        ).to(parse_device(device))
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(model, tokenizer, tap_layers)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        ids = self.model.generation_config.eos_token_id
        if ids is None:
            ids = self.tokenizer.eos_token_id
        if ids is None:
            return frozenset()
        return frozenset([ids] if isinstance(ids, int) else ids)

    def new_state(self) -> TargetState:
        return TargetState(cache=new_cache(self.model.config))

    @torch.inference_mode()
    def forward(self, state: TargetState, ids: list[int], taps: bool = False,
                last_logits_only: bool = False) -> TargetOutput:
        """Append ``ids`` to the request's cache; return logits (and taps) for the new positions.
        ``last_logits_only`` skips the lm_head for all but the last position (a prefill, whose
        logits nobody reads: for a 150-token prompt that is 4 GFLOP saved)."""
        if not ids:
            raise ValueError("forward needs at least one token")
        if state.length + len(ids) > self.max_length:
            raise ValueError(f"sequence of {state.length + len(ids)} tokens exceeds the "
                             f"model's context of {self.max_length}")
        out = cached_forward(self.model, ids, state.cache, hidden=taps and bool(self.tap_layers),
                             **({"logits_to_keep": 1} if last_logits_only else {}))
        state.length += len(ids)
        tapped = None
        if taps and self.tap_layers:
            # hidden_states[0] is the embedding output; the output of layer l is hidden_states[l + 1]
            tapped = torch.cat([out.hidden_states[layer + 1][0] for layer in self.tap_layers], dim=-1)
        return TargetOutput(logits=out.logits[0], taps=tapped)

    def crop(self, state: TargetState, length: int) -> None:
        """Drop cached positions >= length (rejected draft tokens)."""
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot crop a cache of {state.length} tokens to {length}")
        crop_cache(state.cache, length)
        state.length = length

    def embedding_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight  # [V, H]

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight  # [V, H]

    def final_norm(self) -> torch.nn.Module | None:
        return getattr(getattr(self.model, "model", None), "norm", None)
