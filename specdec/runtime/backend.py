"""The seam between the forward and the hardware: what a backend gives the forward, and the
``torch`` backend, which runs on any device torch runs on (CUDA, any CPU, ``meta``).

A backend supplies, once at load:
- ``linear(w, bias, blocks, name)``: one (fused) projection as a ``Linear``, whose class is its
  variant; the hot path calls it and never re-decides;
- ``attention``: how short rows attend (``Attention``: padded groups through SDPA by default;
  a backend may attend them from a table instead, or make them batch invariant);
- the element-wise steps: ``norm`` (RMSNorm), ``silu_mul``, and optionally ``rope_write``
  (RoPE fused with the KV write);
- ``rows``: batch invariance by pieces (the linears take at most this many rows at once), or
  None.

The ``torch`` backend is the reference: transformers' eager arithmetic (RMSNorm in float32,
RoPE tables in float32), one ``[out, in]`` weight per projection and nothing else, SDPA. It is
not batch invariant (a multi-row kernel may round otherwise than a one-row one). The x86
backend (``specdec.runtime.x86``) is the other; ``plan.resolve_plan`` picks one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.runtime.batch import padding_cost


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Transformers' RMSNorm: normalise in float32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [N, heads, d]: transformers' ``x * cos + rotate_half(x) * sin``,
    bitwise, with ``rotate_half(x) * sin`` as x's halves swapped times ``sin_signed`` (sin, its
    first half negated: -a * b is a * -b exactly), two fewer passes over x."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [N, 2I] -> silu(gate) * up [N, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Linear:
    """One (fused) projection x [..., in] -> [..., out]: ``F.linear`` on the ``[out, in]``
    weight. Subclasses are the other variants; each keeps ``w`` (the model's own storage)."""

    kind = "torch"

    def __init__(self, w: torch.Tensor, bias: torch.Tensor | None):
        self.w, self.bias = w, bias  # [out, in], [out] (Qwen2's q/k/v) or None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w, self.bias)


class Attention:
    """How the short rows of a pass attend: padded groups through SDPA, with the bool mask of
    ``batch.positions_and_mask``. Not batch invariant."""

    kind = "sdpa"
    key_block: int | None = None  # batch invariant: keys read in whole blocks of this many
    table = False  # short rows attend from one table (``attend_table``), unpadded

    def cost(self, B: int, T: int, C: int) -> float:
        """A group's cost, which ``batch.split_short`` minimises."""
        return padding_cost(B, T, C)

    def lay_out(self, mask: torch.Tensor, kv_heads: int, per_kv: int,
                dtype: torch.dtype) -> torch.Tensor | None:
        """A group's bool mask [B, 1, T, C] as ``attend`` reads it (None: as it is)."""
        return None

    def attend(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        """queries [B, T, h, d] against keys / values [B, kvh, C, d]; ``mask`` as laid out (or
        the group's bool mask). Returns [B, T, h, d]."""
        h, kvh = queries.shape[2], keys.shape[1]
        return F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values,
                                              attn_mask=mask, scale=scale,
                                              enable_gqa=h != kvh).transpose(1, 2)

    def attend_table(self, q, k_cache, v_cache, table, scale) -> torch.Tensor:
        raise NotImplementedError(f"{self.kind} attention has no table")


class Backend:
    """The torch backend (module docstring); the base the x86 backend refines."""

    name = "torch"
    rows: int | None = None  # batch invariance by pieces of at most this many rows (None: off)
    reads_float16_caches = False  # float32 passes may keep float16 KV caches
    runs_codes = False  # its linears run the GGUF's blocks (``linear``'s ``blocks``)

    def __init__(self, attention: Attention | None = None):
        self.attention = attention or Attention()

    def linear(self, w: torch.Tensor, bias: torch.Tensor | None, blocks=None,
               name: str = "") -> Linear:
        """The projection of weight ``w`` (``blocks``: its GGUF blocks, which only the x86
        backend runs; ``name``: the weight's, for its log lines)."""
        return Linear(w, bias)

    def prepare(self, weights) -> None:
        """Whatever the backend measures on the loaded weights (the x86 backend's invariance
        probe); nothing here."""

    def norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, w, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_mul(gate_up)

    def fuses_rope(self, head_dim: int) -> bool:
        """Whether ``rope_write`` runs RoPE and the KV write in one call for this head dim."""
        return False

    def rope_write(self, qkv, cos, sin_signed, k_cache, v_cache, slots, positions,
                   heads: int) -> torch.Tensor:
        raise NotImplementedError("the torch backend writes keys and values through the pool")
