"""A DFlash-style parallel block drafter (arXiv 2602.06036; layout confirmed from z-lab/dflash).

One forward pass drafts a whole block. Context: the outputs of n tapped target layers for every
verified position, ``fc: Linear(n*F -> H)`` then RMSNorm. Each draft layer is a Qwen3-style
decoder layer (q/k RMSNorm, RoPE at absolute positions) whose queries come from the block and
whose keys/values are the same k/v projections applied to [context features ; block states].
Attention is non-causal: full over the context, bidirectional inside the block. The block input
is [embedding of the last verified token (the anchor), MASK x (B-1)]; the frozen target lm_head
turns the outputs at positions 1..B-1 into B-1 draft tokens. Output j predicts the token at
position anchor + j; output 0 (the anchor) is never used.

The target's embedding and lm_head are borrowed, frozen, and never saved with the drafter; an
optional reduced draft vocabulary (top-N target tokens, as EAGLE-3 does) cuts the lm_head cost.
Per request, the drafter caches the context keys/values of every verified position; a round's
draft never enters that cache, so nothing needs cropping after a round.

Batching (issue 17): ``prepare`` runs the block pass of many requests in ONE forward, their
contexts right-padded to the longest and masked out past each one's length (``pad_context``);
``commit_batch`` projects every request's new context rows in one pass. Each request's token
choice still happens in its own ``propose``, with its own sampling and generator, so a request's
draft is the same alone or in any batch (up to float rounding of the batched matmuls).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from specdec.algorithms.sampling import Sampling, choose
from specdec.models.drafter import DraftBlock
from specdec.models.target import TargetModel, evenly_spaced_taps
from specdec.models.target_parts import TargetParts

CONFIG_FILE = "block_drafter.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class BlockDrafterConfig:
    hidden_size: int  # H, equal to the target's (the lm_head and embedding are the target's)
    feature_size: int  # F, the target's hidden size (each tap is F wide)
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int  # B: one pass drafts B - 1 tokens
    tap_layers: tuple[int, ...]
    vocab_size: int  # the target's
    draft_vocab_size: int | None = None  # reduced vocabulary size, None = full
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6

    def __post_init__(self):
        object.__setattr__(self, "tap_layers", tuple(self.tap_layers))
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + drafts), got {self.block_size}")

    @classmethod
    def for_target(cls, target: TargetModel, block_size=8, num_layers=1, num_taps=3, **kw):
        cfg = target.model.config
        heads = cfg.num_attention_heads
        rope = getattr(cfg, "rope_parameters", None) or {}  # RoPE and norm eps as the target's
        kw.setdefault("rope_theta", rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        kw.setdefault("rms_eps", getattr(cfg, "rms_norm_eps", 1e-6))
        return cls(
            hidden_size=target.hidden_size, feature_size=target.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=num_layers, num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", heads),
            head_dim=getattr(cfg, "head_dim", None) or target.hidden_size // heads,
            block_size=block_size, tap_layers=evenly_spaced_taps(target.num_layers, num_taps),
            vocab_size=target.vocab_size, **kw,
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [..., T, heads, d], pos: [..., T] absolute positions; rotate-half convention."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = pos[..., None].double() * inv_freq  # [..., T, d/2]
    cos = torch.cat([angles.cos()] * 2, -1)[..., None, :].to(x.dtype)  # [..., T, 1, d]
    sin = torch.cat([angles.sin()] * 2, -1)[..., None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DraftLayer(nn.Module):
    def __init__(self, c: BlockDrafterConfig):
        super().__init__()
        self.c = c
        h, d = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(h, c.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, c.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, c.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(c.num_heads * d, h, bias=False)
        self.q_norm, self.k_norm = RMSNorm(d, c.rms_eps), RMSNorm(d, c.rms_eps)
        self.input_norm, self.post_norm = RMSNorm(h, c.rms_eps), RMSNorm(h, c.rms_eps)
        self.gate = nn.Linear(h, c.intermediate_size, bias=False)
        self.up = nn.Linear(h, c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, h, bias=False)

    def keys_values(self, x: torch.Tensor, pos: torch.Tensor):
        """x: [..., T, H] -> k, v: [..., T, kv_heads, d] (k normalised and rotated)."""
        shape = (*x.shape[:-1], self.c.num_kv_heads, self.c.head_dim)
        k = apply_rope(self.k_norm(self.k_proj(x).view(shape)), pos, self.c.rope_theta)
        return k, self.v_proj(x).view(shape)

    def forward(self, h, pos, ctx_k, ctx_v, ctx_mask=None):
        """h: [N, B, H], pos: [N, B]; ctx_k/v: [N or 1, T, kv_heads, d]; ctx_mask: [N, T] bool."""
        n, b, _ = h.shape
        x = self.input_norm(h)
        q = self.q_norm(self.q_proj(x).view(n, b, self.c.num_heads, self.c.head_dim))
        q = apply_rope(q, pos, self.c.rope_theta)
        k_blk, v_blk = self.keys_values(x, pos)
        k = torch.cat([ctx_k.expand(n, -1, -1, -1), k_blk], dim=1)  # [N, T + B, kvh, d]
        v = torch.cat([ctx_v.expand(n, -1, -1, -1), v_blk], dim=1)
        mask = None
        if ctx_mask is not None:  # context rows a block may see; the block sees all of itself
            full = torch.ones(n, b, dtype=torch.bool, device=h.device)
            mask = torch.cat([ctx_mask, full], dim=1)[:, None, None, :]  # [N, 1, 1, T + B]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            enable_gqa=self.c.num_heads != self.c.num_kv_heads,
        )  # [N, heads, B, d]
        h = h + self.o_proj(out.transpose(1, 2).reshape(n, b, -1))
        x = self.post_norm(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


class BlockDrafterModel(nn.Module):
    """The trainable part: fc + norm over taps, draft layers, final norm, MASK embedding."""

    def __init__(self, c: BlockDrafterConfig):
        super().__init__()
        self.c = c
        self.fc = nn.Linear(len(c.tap_layers) * c.feature_size, c.hidden_size, bias=False)
        self.ctx_norm = RMSNorm(c.hidden_size, c.rms_eps)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_layers))
        self.final_norm = RMSNorm(c.hidden_size, c.rms_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(c.hidden_size))
        vocab = c.draft_vocab_size or c.vocab_size
        self.register_buffer("draft_to_target", torch.arange(vocab, dtype=torch.long))

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """features: [..., T, n_taps * F] -> context features [..., T, H]."""
        return self.ctx_norm(self.fc(features))

    def forward(self, block_embeds, block_pos, ctx_kv, ctx_mask=None):
        """block_embeds: [N, B, H] ([anchor, MASK...] embeddings), block_pos: [N, B];
        ctx_kv: per layer (k, v) of the context, [N or 1, T, kvh, d] -> hidden [N, B, H]."""
        h = block_embeds
        for layer, (k, v) in zip(self.layers, ctx_kv, strict=True):
            h = layer(h, block_pos, k, v, ctx_mask)
        return self.final_norm(h)

    def context_kv(self, ctx: torch.Tensor, pos: torch.Tensor):
        """ctx: [..., T, H], pos: [..., T] -> per layer (k, v): [..., T, kvh, d]."""
        return [layer.keys_values(ctx, pos) for layer in self.layers]


def pad_context(contexts: list[list[tuple[torch.Tensor, torch.Tensor]]]):
    """Per request, per layer (k, v) [1, T_i, kvh, d] -> per layer (k, v) [N, T, kvh, d] with
    T = max T_i, each request's rows first and zeros after, and ctx_mask [N, T] (True: a real
    row) -- None when no row is padding, so a batch of one is exactly the unbatched forward."""
    lengths = [kv[0][0].shape[1] for kv in contexts]
    t = max(lengths)
    layers = []
    for per_request in zip(*contexts, strict=True):  # one layer's (k, v) of every request
        k = torch.cat([F.pad(k, (0, 0, 0, 0, 0, t - k.shape[1])) for k, _ in per_request])
        v = torch.cat([F.pad(v, (0, 0, 0, 0, 0, t - v.shape[1])) for _, v in per_request])
        layers.append((k, v))
    if min(lengths) == t:
        return layers, None
    device = contexts[0][0][0].device
    mask = torch.arange(t, device=device)[None] < torch.tensor(lengths, device=device)[:, None]
    return layers, mask


@dataclass
class BlockDraftState:
    committed: list[int]
    ctx_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [1, T, kvh, d]; T = len(committed) - 1
    # this round's block pass before any token choice: hidden [B-1, H], draft logits [B-1, V_draft]
    forward: tuple[torch.Tensor, torch.Tensor] | None = None
    block: DraftBlock | None = None  # this round's full block, handed out piece by piece
    handed: int = 0


class BlockDrafter:
    """The Drafter-protocol wrapper: per-request context cache, one pass per round."""

    needs_target_features = True

    def __init__(self, net: BlockDrafterModel, embedding: torch.Tensor, lm_head: torch.Tensor,
                 target_ref: str | None = None):
        c = net.c
        if embedding.shape[0] != c.vocab_size or lm_head.shape[0] != c.vocab_size:
            raise ValueError(f"block drafter expects a target vocabulary of {c.vocab_size}, "
                             f"got {embedding.shape[0]}")
        self.net, self.config, self.target_ref = net.eval(), c, target_ref
        self.embedding, self.lm_head = embedding.detach(), lm_head.detach()
        self.device = self.embedding.device
        self.head = lm_head.detach()[net.draft_to_target.to(lm_head.device)]  # [V_draft, H]
        self.draft_to_target = net.draft_to_target.cpu()  # choices come back on the CPU
        self.hidden_size, self.vocab_size = c.hidden_size, c.vocab_size
        self.max_draft_len = c.block_size - 1

    # ---- construction and persistence -------------------------------------------------------
    @classmethod
    def initialise(cls, config: BlockDrafterConfig, target: TargetModel, target_ref=None):
        net = BlockDrafterModel(config).to(target.device, target.dtype)
        for p in net.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)
        norm = target.final_norm()
        if norm is not None and norm.weight.shape[0] == config.hidden_size:
            net.final_norm.weight.data.copy_(norm.weight.data)
        return cls(net, target.embedding_weight(), target.lm_head_weight(), target_ref)

    def with_vocabulary(self, draft_to_target: torch.Tensor) -> BlockDrafter:
        """This drafter drafting only the target tokens ``draft_to_target`` (sorted ids)."""
        ids = draft_to_target.to(torch.long).cpu()
        if ids.dim() != 1 or not (0 <= int(ids.min()) and int(ids.max()) < self.vocab_size):
            raise ValueError(f"a draft vocabulary is a 1-d tensor of ids in [0, {self.vocab_size})")
        self.net.c = replace(self.config, draft_vocab_size=ids.shape[0])
        self.net.draft_to_target = ids.to(self.net.draft_to_target.device)
        return BlockDrafter(self.net, self.embedding, self.lm_head, self.target_ref)

    def save(self, out: str | Path) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"config": asdict(self.config), "target": self.target_ref}
        (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
        state = {k: v.contiguous() for k, v in self.net.state_dict().items()}
        save_file(state, out / WEIGHTS_FILE)
        return out

    @staticmethod
    def read_config(path: str | Path) -> tuple[BlockDrafterConfig, str | None]:
        meta = json.loads((Path(path) / CONFIG_FILE).read_text())
        return BlockDrafterConfig(**meta["config"]), meta.get("target")

    @classmethod
    def load(cls, path: str | Path, target: TargetModel | TargetParts) -> BlockDrafter:
        """The checkpoint at ``path``, on ``target``'s device and dtype, borrowing its embedding
        and lm_head (a ``TargetModel``, or just its ``TargetParts`` on a drafter-only process)."""
        config, target_ref = cls.read_config(path)
        state = load_file(Path(path) / WEIGHTS_FILE)
        vocab = state["draft_to_target"].shape[0]
        net = BlockDrafterModel(config)
        if vocab != net.draft_to_target.shape[0]:
            net.draft_to_target = torch.zeros(vocab, dtype=torch.long)
        net.load_state_dict(state)
        net.to(target.device, target.dtype)
        return cls(net, target.embedding_weight(), target.lm_head_weight(), target_ref)

    @staticmethod
    def is_checkpoint(path: str | Path) -> bool:
        return (Path(path) / CONFIG_FILE).is_file()

    # ---- the Drafter protocol ---------------------------------------------------------------
    def start(self, prompt_ids: list[int], features: torch.Tensor | None) -> BlockDraftState:
        empty = torch.zeros(1, 0, len(self.config.tap_layers) * self.config.feature_size)
        nowhere = torch.zeros(1, 0, dtype=torch.long, device=self.device)
        state = BlockDraftState(committed=[], ctx_kv=self._kv(empty, nowhere))
        self.commit(state, list(prompt_ids), features)
        return state

    @torch.inference_mode()
    def propose(self, state: BlockDraftState, n: int, sampling: Sampling) -> DraftBlock:
        if state.block is None:
            state.block = self._draft_block(state, sampling)
        lo, hi = state.handed, min(state.handed + n, len(state.block))
        state.handed = hi
        b = state.block
        return DraftBlock(b.tokens[lo:hi], b.hidden[lo:hi], None if b.probs is None else b.probs[lo:hi])

    def commit(self, state: BlockDraftState, tokens: list[int], features: torch.Tensor | None):
        self.commit_batch([(state, tokens, features)])

    # ---- batching: optional Drafter parts ---------------------------------------------------
    @torch.inference_mode()
    def prepare(self, requests: list[tuple[BlockDraftState, int]]) -> None:
        """Run this round's block pass of every (state, n) in ONE forward; n, the size of the
        round's first ``propose``, only says whether it proposes at all (one pass drafts the
        whole block). The token choice is left to ``propose``: it alone touches the request's
        generator, so preparing a request changes none of its results."""
        states = [s for s, n in requests if n > 0 and s.block is None and s.forward is None]
        if states:
            self._forward(states)

    @torch.inference_mode()
    def commit_batch(self, requests: list[tuple[BlockDraftState, list[int], torch.Tensor | None]]):
        """``commit`` for many requests: the new context rows of all of them go through the
        context projection and k/v in one pass (every op there is per row: fc, norms, RoPE at
        each row's own position), then each request's rows extend its own cache. Every request
        is checked before any state changes, so one bad request leaves all of them as they were."""
        starts = [self._first_new(state, tokens, features) for state, tokens, features in requests]
        rows = []  # (state, features [t, n*F], start) of the requests with new rows
        for (state, tokens, features), start in zip(requests, starts, strict=True):
            state.committed.extend(tokens)
            state.forward, state.block, state.handed = None, None, 0
            if features.shape[0]:
                rows.append((state, features, start))
        if not rows:
            return
        pos = torch.cat([torch.arange(start, start + f.shape[0]) for _, f, start in rows])
        new = self._kv(torch.cat([f for _, f, _ in rows])[None], pos[None].to(self.device))
        sizes = [f.shape[0] for _, f, _ in rows]
        pieces = [(k.split(sizes, 1), v.split(sizes, 1)) for k, v in new]  # per layer
        for i, (state, _, _) in enumerate(rows):
            state.ctx_kv = [(torch.cat([k0, ks[i]], 1), torch.cat([v0, vs[i]], 1))
                            for (k0, v0), (ks, vs) in zip(state.ctx_kv, pieces, strict=True)]

    # ---- internals --------------------------------------------------------------------------
    @staticmethod
    def _first_new(state: BlockDraftState, tokens: list[int], features: torch.Tensor | None) -> int:
        """The first context position that committing ``tokens`` adds; checks that ``features``
        has one row per added position (all committed tokens but the new last one)."""
        start = state.ctx_kv[0][0].shape[1]
        new = len(state.committed) + len(tokens) - 1 - start
        if features is None or features.shape[0] != new:
            got = None if features is None else features.shape[0]
            raise ValueError(f"block drafter needs target features for {new} new positions, "
                             f"got {got}")
        return start

    def _kv(self, features: torch.Tensor, pos: torch.Tensor):
        """features: [1, t, n*F] at positions pos [1, t] -> per layer (k, v) [1, t, kvh, d]."""
        features = features.to(self.device, self.embedding.dtype)
        return self.net.context_kv(self.net.context(features), pos)

    def _forward(self, states: list[BlockDraftState]) -> None:
        """One block pass for all ``states``: input [anchor, MASK x (B-1)] at positions
        anchor..anchor+B-1 of each, keys over its own (padded, masked) context; stores each
        state's hidden [B-1, H] and draft logits [B-1, V_draft]."""
        b = self.config.block_size
        anchors = torch.tensor([len(s.committed) - 1 for s in states], device=self.device)  # [N]
        last = torch.tensor([s.committed[-1] for s in states], device=self.device)  # [N]
        embeds = self.net.mask_embedding.expand(len(states), b, -1).clone()  # [N, B, H]
        embeds[:, 0] = self.embedding[last]
        pos = anchors[:, None] + torch.arange(b, device=self.device)  # [N, B]
        ctx_kv, ctx_mask = pad_context([s.ctx_kv for s in states])
        hidden = self.net(embeds, pos, ctx_kv, ctx_mask)[:, 1:]  # [N, B-1, H]
        logits = hidden @ self.head.T  # [N, B-1, V_draft]
        for state, h, z in zip(states, hidden, logits, strict=True):
            state.forward = (h, z)

    def _draft_block(self, state: BlockDraftState, sampling: Sampling) -> DraftBlock:
        if state.forward is None:  # not prepared: a batch of one
            self._forward([state])
        (hidden, logits), state.forward = state.forward, None
        choice, probs = choose(logits, sampling)
        tokens = self.draft_to_target[choice]
        if probs is not None and probs.shape[-1] != self.vocab_size:  # scatter to the full vocab
            full = probs.new_zeros(probs.shape[0], self.vocab_size)
            probs = full.index_copy_(1, self.draft_to_target, probs)
        return DraftBlock(tokens, hidden.float().cpu(), probs)
