"""The runtime's forward: one pass of a Llama-family decoder over a ragged batch of requests.

A batch is a list of ``Row``s, each (KV slot, new token ids, optional ancestor mask among the
new ids). Every row's new keys/values are written into its slot first; then each new token
attends to its slot's cached prefix and to the new tokens it may see (all earlier ones, or with
an ancestor mask only its ancestors and itself: tree verification). Rows are padded to the
longest new length ``T`` and the longest context ``C`` in the batch; an explicit boolean mask
``[B, 1, T, C]`` goes to SDPA. Logits come back only for the positions a row asks for (a
prefill asks for its last), and the tapped layers' outputs (the block drafter's features) for
the positions it asks for. Terms: ``H`` hidden size, ``h`` / ``kvh`` query / key-value heads,
``d`` head dim, ``V`` vocabulary.

It is not a model zoo: ``weights.py`` says which configs it runs; the rest stay on transformers.
Arithmetic follows transformers' eager Llama (RMSNorm in float32, RoPE tables in float32), so
in float64 it equals the reference to ~1e-12.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.runtime.pool import KVPool
from specdec.runtime.weights import Layer, Proj, Weights, packed_linear


@dataclass(frozen=True)
class Row:
    slot: int
    ids: Sequence[int]  # [n] new token ids, appended after the slot's cached prefix
    logits_at: Sequence[int]  # indices into ids whose next-token logits to return
    taps_at: Sequence[int] = ()  # indices into ids whose tapped-layer outputs to return
    # [n, n] bool: ancestors[i, j] = new token i sees new token j (j == i and j's ancestors);
    # None = causal. Ancestors come first (lower triangular); a node sits at depth = row sum - 1.
    ancestors: torch.Tensor | None = None

    def __post_init__(self):
        if not self.ids:
            raise ValueError("a row needs at least one new token")
        n = len(self.ids)
        bad = [i for i in (*self.logits_at, *self.taps_at) if not 0 <= i < n]
        if bad:
            raise ValueError(f"positions {bad} are outside the row's {n} new tokens")
        a = self.ancestors
        if a is not None:
            if a.shape != (n, n) or a.dtype != torch.bool:
                raise ValueError(f"the ancestor mask must be a [{n}, {n}] bool tensor")
            if not bool(a.diagonal().all()) or bool(a.triu(1).any()):
                raise ValueError("the ancestor mask must see itself and only earlier tokens")


@dataclass(frozen=True)
class RowOutput:
    logits: torch.Tensor  # [len(logits_at), V]
    taps: torch.Tensor | None  # [len(taps_at), n_taps * H]; None when none asked for


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Transformers' RMSNorm: normalise in float32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def positions_and_mask(rows: Sequence[Row], lengths: Sequence[int], device):
    """pos: [B, T] absolute positions (depth in a tree); mask: [B, 1, T, C] keys each query sees."""
    T = max(len(r.ids) for r in rows)
    C = max(c + len(r.ids) for r, c in zip(rows, lengths, strict=True))
    pos = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, C, dtype=torch.bool)
    mask[:, :, 0] = True  # padded queries see one key, so no softmax row is empty
    for b, (row, c) in enumerate(zip(rows, lengths, strict=True)):
        n = len(row.ids)
        seen = row.ancestors if row.ancestors is not None else torch.ones(n, n, dtype=torch.bool).tril()
        pos[b, :n] = c + seen.sum(-1) - 1
        mask[b, :n, :c] = True
        mask[b, :n, c:c + n] = seen
    return pos.to(device), mask.unsqueeze(1).to(device)


class Forward:
    """The decoder over a ``Weights`` and a ``KVPool``; ``__call__`` runs one ragged batch."""

    def __init__(self, weights: Weights, pool: KVPool, tap_layers: Sequence[int] = ()):
        self.w, self.pool, self.tap_layers = weights, pool, tuple(tap_layers)
        s = weights.shape
        self.q_size, self.kv_size = s.heads * s.head_dim, s.kv_heads * s.head_dim

    @staticmethod
    def linear(x: torch.Tensor, p: Proj) -> torch.Tensor:
        """x: [..., in] -> [..., out]; a single row uses the [in, out] copy and several rows the
        oneDNN-packed weight, where the layout has them (see ``weights``)."""
        if x.numel() == x.shape[-1]:
            if p.wt is not None:
                y = x @ p.wt
                return y if p.bias is None else y + p.bias
        elif p.packed is not None:
            return packed_linear(x, p.packed, p.bias)
        return F.linear(x, p.w, p.bias)

    @torch.inference_mode()
    def __call__(self, rows: Sequence[Row]) -> list[RowOutput]:
        pool, s = self.pool, self.w.shape
        lengths = [pool.lengths[r.slot] for r in rows]
        if len({r.slot for r in rows}) != len(rows):
            raise ValueError("two rows of one batch share a KV slot")
        for r, c in zip(rows, lengths, strict=True):
            if c + len(r.ids) > pool.max_len:
                raise ValueError(f"sequence of {c + len(r.ids)} tokens exceeds the KV slot's "
                                 f"{pool.max_len} positions")
        device = self.w.embed.device
        pos, mask = positions_and_mask(rows, lengths, device)
        B, T = pos.shape
        ids = torch.zeros(B, T, dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, :len(r.ids)] = torch.as_tensor(list(r.ids), dtype=torch.long)
        cos, sin = self.w.cos[pos].unsqueeze(1), self.w.sin[pos].unsqueeze(1)  # [B, 1, T, d]
        C = mask.shape[-1]
        if len(rows) > 1:  # only a padded batch reads past a slot's end
            for r in rows:
                pool.ensure_clean(r.slot, C)
        if T == 1 and B == 1:
            mask = None  # one query that sees every cached key: SDPA's unmasked path
        x = self.w.embed[ids.to(device)]  # [B, T, H]
        taps = {}  # layer -> its output [B, T, H], for the tapped layers only
        for i, layer in enumerate(self.w.layers):
            x = x + self.attention(i, layer, rms_norm(x, layer.attn_norm, s.eps), rows, lengths,
                                   cos, sin, mask, C)
            x = x + self.mlp(layer, rms_norm(x, layer.mlp_norm, s.eps))
            if i in self.tap_layers:  # the last layer's output is read after the final norm, as
                taps[i] = x if i < s.layers - 1 else rms_norm(x, self.w.norm, s.eps)  # in HF
        for r in rows:
            pool.advance(r.slot, len(r.ids))
        return self.outputs(rows, T, x, taps)

    def attention(self, i: int, layer: Layer, x, rows, lengths, cos, sin, mask, C: int) -> torch.Tensor:
        """x: [B, T, H] normed; mask: [B, 1, T, C] or None (one query seeing all C keys)."""
        s, pool = self.w.shape, self.pool
        B, T, _ = x.shape
        qkv = self.linear(x, layer.qkv)  # [B, T, (h + 2 kvh) d]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(B, T, s.heads, s.head_dim)
        k = k.view(B, T, s.kv_heads, s.head_dim)
        if layer.q_norm is not None:  # Qwen3: RMSNorm over each head before RoPE
            q, k = rms_norm(q, layer.q_norm, s.eps), rms_norm(k, layer.k_norm, s.eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, h | kvh, T, d]
        v = v.view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        for b, (r, c) in enumerate(zip(rows, lengths, strict=True)):
            n = len(r.ids)
            pool.write(i, r.slot, c, k[b, :, :n], v[b, :, :n])
        if B == 1:  # a view of the slot, no copy: [1, kvh, C, d]
            keys = pool.k[i][rows[0].slot, :, :C].unsqueeze(0)
            values = pool.v[i][rows[0].slot, :, :C].unsqueeze(0)
        else:
            slots = torch.tensor([r.slot for r in rows], device=q.device)
            keys, values = pool.k[i][slots, :, :C], pool.v[i][slots, :, :C]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                             scale=s.head_dim ** -0.5,
                                             enable_gqa=s.heads != s.kv_heads)  # [B, h, T, d]
        return self.linear(out.transpose(1, 2).reshape(B, T, self.q_size), layer.o)

    def mlp(self, layer: Layer, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.linear(x, layer.gate_up).chunk(2, dim=-1)
        return self.linear(F.silu(gate) * up, layer.down)

    def outputs(self, rows, T: int, x: torch.Tensor, taps: dict) -> list[RowOutput]:
        """Final norm + lm_head only at the asked-for positions; taps = outputs of layer l."""
        flat = x.reshape(-1, x.shape[-1])  # [B * T, H]
        at = [b * T + i for b, r in enumerate(rows) for i in r.logits_at]
        index = torch.tensor(at, dtype=torch.long, device=x.device)
        logits = self.linear(rms_norm(flat[index], self.w.norm, self.w.shape.eps), self.w.lm_head)
        out, start = [], 0
        for b, r in enumerate(rows):
            row_logits = logits[start:start + len(r.logits_at)]
            start += len(r.logits_at)
            tapped = None
            if r.taps_at and self.tap_layers:
                where = torch.tensor(list(r.taps_at), dtype=torch.long, device=x.device)
                tapped = torch.cat([taps[layer][b, where] for layer in self.tap_layers], dim=-1)
            out.append(RowOutput(row_logits, tapped))
        return out
