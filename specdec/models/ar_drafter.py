"""An autoregressive draft LM that shares the target's tokenizer.

It drafts one token per forward pass with its own KV cache, and reports its last hidden state
for each drafted token (the state that predicted it), which PACER's pre-verifier reads. The
target itself can serve as its own drafter: a useful check, since it then accepts every token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from specdec.algorithms.sampling import Sampling, choose
from specdec.models.drafter import DraftBlock
from specdec.models.kv import cached_forward, crop_cache, new_cache
from specdec.models.sources import parse_device, parse_dtype, resolve


@dataclass
class ARDraftState:
    cache: DynamicCache
    committed: list[int]  # verified tokens of the request
    draft: list[int] = field(default_factory=list)  # this round's draft so far
    cached: list[int] = field(default_factory=list)  # tokens whose keys/values are in the cache


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ARDrafter:
    needs_target_features = False
    max_draft_len = None

    def __init__(self, model):
        self.model = model.eval()
        self.hidden_size = model.config.hidden_size
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = getattr(model.config, "max_position_embeddings", None) or 2048

    @classmethod
    def from_pretrained(cls, ref: str, dtype="float32", device="cpu") -> ARDrafter:
        model = AutoModelForCausalLM.from_pretrained(
            resolve(ref), dtype=parse_dtype(dtype), use_safetensors=True
        ).to(parse_device(device))
        return cls(model)

    def start(self, prompt_ids: list[int], features=None) -> ARDraftState:
        return ARDraftState(cache=new_cache(self.model.config), committed=list(prompt_ids))

    @torch.inference_mode()
    def propose(self, state: ARDraftState, n: int, sampling: Sampling) -> DraftBlock:
        tokens, hidden, probs = [], [], []
        for _ in range(n):
            seq = state.committed + state.draft
            if len(seq) >= self.max_length:
                break
            logits, h = self._step(state, seq)
            token, p = choose(logits[None], sampling)
            state.draft.append(int(token))
            tokens.append(token)
            hidden.append(h)
            if p is not None:
                probs.append(p)
        if not tokens:
            return DraftBlock.empty(self.hidden_size)
        return DraftBlock(torch.cat(tokens), torch.stack(hidden).float().cpu(),
                          torch.cat(probs) if probs else None)

    def _step(self, state: ARDraftState, seq: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the tokens of seq not yet cached; return the last logits [V] and hidden [D]."""
        new = seq[len(state.cached):]
        out = cached_forward(self.model, new, state.cache, hidden=True)
        state.cached = list(seq)
        return out.logits[0, -1], out.hidden_states[-1][0, -1]

    def commit(self, state: ARDraftState, tokens: list[int], features=None) -> None:
        base = len(state.committed)  # the cache agrees with the committed tokens up to here
        state.committed.extend(tokens)
        state.draft = []
        keep = base + common_prefix(state.cached[base:], tokens)
        if keep < len(state.cached):
            crop_cache(state.cache, keep)
            state.cached = state.cached[:keep]
