"""The runtime's forward: one pass of a Llama-family decoder over a ragged batch of requests.

Every row's new keys/values are written into its KV slot first; then each new token attends to
its slot's cached prefix and to the new tokens it may see (all earlier ones, or with an
ancestor mask only its ancestors and itself: tree verification). ``batch.plan_groups`` lays the
batch out; the ``Backend`` computes it (linears, attention, element-wise steps). This module
never meets a kernel: which ones run is the backend's, chosen once by the plan.

*Batch invariance* (where the plan says so): a token's outputs are bitwise the same whatever
else its pass holds -- alone as a decode, inside a k-token verify, next to other requests -- so
greedy speculative decoding commits exactly the tokens plain decoding does. A backend gives it
by kernels that compute each row alone, or by pieces: the linears over at most ``backend.rows``
rows at a time (``parts``), keys read in whole blocks. A long prompt chunk (``Row.chunk``) only
needs computing the same way every time it comes: the scheduler cuts prompts at fixed points,
so its linears take it whole and it attends through SDPA's own causal attention.

Logits come back only for the positions a row asks for (a prefill asks for its last), and the
tapped layers' outputs (the block drafter's features) for the positions it asks for. Terms:
``H`` hidden size, ``h`` / ``kvh`` query / key-value heads, ``d`` head dim, ``V`` vocabulary.
Arithmetic follows transformers' eager Llama, so in float64 it equals the reference to ~1e-12.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from specdec.runtime.backend import Backend, Linear, rms_norm, rope
from specdec.runtime.batch import Group, Row, RowOutput, plan_groups
from specdec.runtime.pool import KVPool
from specdec.runtime.threads import ThreadGovernor
from specdec.runtime.weights import Layer, Weights


class Forward:
    """The decoder over a ``Weights`` (its linears built by ``backend``) and a ``KVPool``;
    ``__call__`` runs one ragged batch (on the threads its ``governor`` picks, if it has one)."""

    def __init__(self, weights: Weights, pool: KVPool, backend: Backend,
                 tap_layers: Sequence[int] = (), governor: ThreadGovernor | None = None):
        self.w, self.pool, self.backend, self.tap_layers = weights, pool, backend, tuple(tap_layers)
        self.governor = governor  # threads by load (None: the process's threads, always)
        s = weights.shape
        self.q_size, self.kv_size = s.heads * s.head_dim, s.kv_heads * s.head_dim
        dtype = weights.embed.dtype
        if pool.dtype != dtype and not (pool.dtype == torch.float16 and dtype == torch.float32
                                        and backend.reads_float16_caches):
            raise ValueError(f"a {pool.dtype} KV pool needs {dtype} passes that read float16 "
                             f"caches ({backend.name} backend, {backend.attention.kind} attention)")
        if pool.max_len > weights.cos.shape[0]:
            raise ValueError(f"the KV pool's {pool.max_len} positions exceed the RoPE table's "
                             f"{weights.cos.shape[0]}")
        self.attention = backend.attention
        self.rows = backend.rows  # batch invariance by pieces (None: off)
        self.fused_rope = backend.fuses_rope(s.head_dim)

    @property
    def key_block(self) -> int | None:
        return self.attention.key_block

    def linear(self, x: torch.Tensor, p: Linear, parts: list[int] | None = None) -> torch.Tensor:
        """x: [N, in] -> [N, out]. Batch invariant by pieces: one call of the projection per
        part of the flat axis (``parts``; None: ``self.rows`` rows at a time)."""
        if self.rows is None:
            return p(x)
        pieces = x.split(parts or self.rows)
        if len(pieces) == 1:
            return p(x)
        return torch.cat([p(piece) for piece in pieces])

    def parts(self, groups: list[Group]) -> list[int] | None:
        """Batch invariant by pieces: how the linears cut the flat tokens -- each run of groups
        that are not long prompt chunks in pieces of at most ``self.rows`` (each row's outputs
        are then what they are alone, whatever its piece holds), a long prompt chunk whole (it
        always comes whole). None otherwise."""
        if self.rows is None:
            return None
        out, run = [], 0  # run: rows of the groups since the last prompt chunk
        for g in groups:
            if g.whole:  # a long prompt chunk
                out += self._pieces(run) + [g.size]
                run = 0
            else:
                run += g.size
        return out + self._pieces(run)

    def _pieces(self, rows: int) -> list[int]:
        """``rows`` consecutive rows cut into pieces of at most ``self.rows``."""
        whole, rest = divmod(rows, self.rows)
        return [self.rows] * whole + ([rest] if rest else [])

    def check(self, rows: Sequence[Row], lengths: Sequence[int]) -> None:
        if len({r.slot for r in rows}) != len(rows):
            raise ValueError("two rows of one batch share a KV slot")
        for r, c in zip(rows, lengths, strict=True):
            if c + len(r.ids) > self.pool.max_len:
                raise ValueError(f"sequence of {c + len(r.ids)} tokens exceeds the KV slot's "
                                 f"{self.pool.max_len} positions (max_model_len)")

    def __call__(self, rows: Sequence[Row]) -> list[RowOutput]:
        if self.governor is None:
            return self.run(rows)
        return self.governor.run(sum(len(r.ids) for r in rows), lambda: self.run(rows))

    @torch.inference_mode()
    def run(self, rows: Sequence[Row]) -> list[RowOutput]:
        pool, s = self.pool, self.w.shape
        lengths = [pool.lengths[r.slot] for r in rows]
        self.check(rows, lengths)
        device = self.w.embed.device
        groups, offsets, pos = plan_groups(rows, lengths, device, self.key_block, pool.max_len,
                                           self.attention.table, self.attention.cost)
        order = [b for g in groups for b in g.rows]
        ids = torch.tensor([t for b in order for t in rows[b].ids], dtype=torch.long, device=device)
        # where each flat token's key / value goes: its slot, at its index after the cache
        write_slots = torch.tensor([rows[b].slot for b in order for _ in rows[b].ids], device=device)
        write_at = torch.tensor([lengths[b] + t for b in order for t in range(len(rows[b].ids))],
                                device=device)
        cos, sin_signed = (t[pos].unsqueeze(1) for t in (self.w.cos, self.w.sin_signed))  # [N, 1, d]
        for g in groups:
            padded_read = g.table is None and (len(g.rows) > 1 or self.key_block)
            if padded_read and not g.whole:  # a padded group reads past a slot's end
                for b in g.rows:
                    pool.ensure_clean(rows[b].slot, g.C)
            if g.table is None and not g.whole and g.mask is not None:
                g.head_mask = self.attention.lay_out(g.mask, s.kv_heads, s.heads // s.kv_heads,
                                                     self.w.embed.dtype)
        parts = self.parts(groups)
        x = self.w.embed[ids]  # [N, H]
        taps = {}  # layer -> its output [N, H], for the tapped layers only
        for i, layer in enumerate(self.w.layers):
            x = x + self.attend(i, layer, self.norm(x, layer.attn_norm), groups,
                                (cos, sin_signed), (write_slots, write_at), parts)
            x = x + self.mlp(layer, self.norm(x, layer.mlp_norm), parts)
            if i in self.tap_layers:  # the last layer's output is read after the final norm, as
                taps[i] = x if i < s.layers - 1 else self.norm(x, self.w.norm)  # in HF
        for r in rows:
            pool.advance(r.slot, len(r.ids))
        return self.outputs(rows, offsets, x, taps)

    def attend(self, i: int, layer: Layer, x, groups: list[Group],
               rotary: tuple[torch.Tensor, torch.Tensor],
               write: tuple[torch.Tensor, torch.Tensor],
               parts: list[int] | None = None) -> torch.Tensor:
        """x: [N, H] normed flat tokens; rotary: each token's (cos, sin_signed) rows for
        ``rope``; write: (slot, position) of each token's key / value; parts: the linears' cuts
        (``parts``). Every new key / value goes into the caches first; then each group attends
        on its own."""
        s = self.w.shape
        N = x.shape[0]
        qkv = self.linear(x, layer.qkv, parts)  # [N, (h + 2 kvh) d]
        if self.fused_rope and layer.q_norm is None:  # RoPE and the KV write in one call
            q = self.backend.rope_write(qkv, *rotary, self.pool.k[i], self.pool.v[i], *write,
                                        s.heads)
        else:
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            qk = qk.view(N, s.heads + s.kv_heads, s.head_dim)
            if layer.q_norm is not None:  # Qwen3: RMSNorm over each head before RoPE
                qk = torch.cat([rms_norm(qk[:, :s.heads], layer.q_norm, s.eps),
                                rms_norm(qk[:, s.heads:], layer.k_norm, s.eps)], dim=1)
            q, k = rope(qk, *rotary).split([s.heads, s.kv_heads], dim=1)  # q's, k's heads at once
            self.pool.write(i, *write, k, v.view(N, s.kv_heads, s.head_dim))
        outs = [self._attend_group(i, g, q[g.start:g.start + g.size]) for g in groups]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return self.linear(out, layer.o, parts)

    def _attend_group(self, i: int, g: Group, q: torch.Tensor) -> torch.Tensor:
        """One group's queries [n, h, d] against its slots' caches; returns [n, h * d]."""
        s, pool = self.w.shape, self.pool
        scale = s.head_dim ** -0.5
        if g.table is not None:
            return self.attention.attend_table(q, pool.k[i], pool.v[i], g.table, scale)
        B, T = len(g.rows), g.T
        if g.where is None:
            queries = q.view(B, T, s.heads, s.head_dim)
        else:
            queries = q.new_zeros(B, T, s.heads, s.head_dim)
            queries[g.where] = q
        lo, hi = g.span  # a view of the slots, no copy: [B, kvh, C, d]
        keys, values = pool.k[i][lo:hi, :, :g.C], pool.v[i][lo:hi, :, :g.C]
        if keys.dtype != q.dtype:  # float16 caches of float32 passes (a long prompt chunk)
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        if g.whole or g.causal or g.head_mask is None and g.mask is None:
            out = F.scaled_dot_product_attention(  # a prompt chunk, or one unpadded row
                queries.transpose(1, 2), keys, values, attn_mask=g.mask, is_causal=g.causal,
                scale=scale, enable_gqa=s.heads != s.kv_heads).transpose(1, 2)
        else:
            mask = g.mask if g.head_mask is None else g.head_mask
            out = self.attention.attend(queries, keys, values, mask, scale)
        if g.where is not None:  # out: [B, T, h, d]
            out = out[g.where]  # [n, h, d]: the real tokens only
        return out.reshape(-1, self.q_size)

    def norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The RMSNorm of x [N, H]."""
        return self.backend.norm(x, w, self.w.shape.eps)

    def mlp(self, layer: Layer, x: torch.Tensor, parts: list[int] | None = None) -> torch.Tensor:
        gate_up = self.linear(x, layer.gate_up, parts)
        return self.linear(self.backend.silu_mul(gate_up), layer.down, parts)

    def outputs(self, rows, offsets: list[int], x: torch.Tensor, taps: dict) -> list[RowOutput]:
        """Final norm + lm_head only at the asked-for positions; taps = outputs of layer l."""
        at = [offsets[b] + i for b, r in enumerate(rows) for i in r.logits_at]
        index = torch.tensor(at, dtype=torch.long, device=x.device)
        logits = self.linear(self.norm(x[index], self.w.norm), self.w.lm_head)
        out, start = [], 0
        for b, r in enumerate(rows):
            row_logits = logits[start:start + len(r.logits_at)]
            start += len(r.logits_at)
            tapped = None
            if r.taps_at and self.tap_layers:
                where = torch.tensor([offsets[b] + i for i in r.taps_at], dtype=torch.long,
                                     device=x.device)
                tapped = torch.cat([taps[layer][where] for layer in self.tap_layers], dim=-1)
            out.append(RowOutput(row_logits, tapped))
        return out
