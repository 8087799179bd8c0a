"""What the runtime's forward needs from a model: its shape, its RoPE table and its weights.

``unsupported(config)`` says why an HF config is outside the Llama family this runtime runs
(None when it is inside): Llama / SmolLM2, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm), SiLU MLP,
full attention in every layer, RoPE of type default, linear or llama3. ``Weights.from_hf`` takes
the tensors of a loaded transformers model (the loader and the test reference; its forward never
runs here), fuses q/k/v and gate/up (the HF modules then hold views of the fused tensors, so the
weights are not stored twice) and has the backend build each projection (``Backend.linear``).

RoPE follows transformers' definition exactly, float32 arithmetic included (its cos/sin are
computed in float32 whatever the model dtype, then cast): ``inv_freq_i = 1 / theta^(2i/d)``,
divided by ``factor`` (linear) or smoothly rescaled by wavelength (llama3, Meta's Llama 3.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.models.gguf_blocks import Blocks
from specdec.runtime.backend import Backend, Linear

FAMILY = ("llama", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")

def rope_params(config) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    if not params:  # older configs: rope_theta and rope_scaling fields
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params = dict(params)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


def unsupported(config) -> str | None:
    """Why this config cannot run on the runtime, or None when it can."""
    kind = getattr(config, "model_type", None)
    if kind not in FAMILY:
        return f"model type {kind!r} is not one of {FAMILY}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    layer_types = getattr(config, "layer_types", None) or []
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        return "sliding-window attention"
    rope = rope_params(config)
    if rope["rope_type"] not in ROPE_TYPES:
        return f"RoPE type {rope['rope_type']!r} is not one of {ROPE_TYPES}"
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        return "partial rotary embeddings"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    return None


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    max_len: int

    @classmethod
    def from_config(cls, config) -> Shape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   config.num_key_value_heads or config.num_attention_heads, head_dim,
                   config.vocab_size, config.rms_norm_eps,
                   getattr(config, "max_position_embeddings", None) or 2048)


def inv_freq(config, head_dim: int) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies, as transformers computes them."""
    rope = rope_params(config)
    base = rope["rope_theta"]
    exps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    freq = 1.0 / (base ** exps)
    if rope["rope_type"] == "linear":
        return freq / rope["factor"]
    if rope["rope_type"] == "llama3":
        return llama3_scaled(freq, rope)
    return freq


def llama3_scaled(freq: torch.Tensor, rope: dict) -> torch.Tensor:
    """Long wavelengths divided by ``factor``, short ones kept, the band between interpolated."""
    factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > old / lo, freq / factor, freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


def rope_table(config, head_dim: int, max_len: int, dtype: torch.dtype):
    """cos, sin: [max_len, head_dim] in ``dtype``, computed in float32 as transformers does."""
    freqs = torch.arange(max_len, dtype=torch.float)[:, None] * inv_freq(config, head_dim)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)  # attention_scaling is 1 for these types


def signed(sin: torch.Tensor) -> torch.Tensor:
    """The sin table with its first half negated, for ``specdec.runtime.backend.rope``."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


@dataclass(frozen=True)
class Layer:
    attn_norm: torch.Tensor  # [H]
    qkv: Linear  # H -> (h + 2 kvh) * d
    q_norm: torch.Tensor | None  # [d] (Qwen3)
    k_norm: torch.Tensor | None  # [d]
    o: Linear  # h * d -> H
    mlp_norm: torch.Tensor  # [H]
    gate_up: Linear  # H -> 2 I
    down: Linear  # I -> H


@dataclass(frozen=True)
class Weights:
    shape: Shape
    embed: torch.Tensor  # [V, H]
    layers: tuple[Layer, ...]
    norm: torch.Tensor  # [H]
    lm_head: Linear  # H -> V (w is the embedding itself when tied)
    cos: torch.Tensor  # [max_len, d]
    sin_signed: torch.Tensor  # [max_len, d]: sin, its first half negated (``signed``)

    @classmethod
    def from_hf(cls, model, backend: Backend | None = None,
                blocks: dict[str, Blocks] | None = None, max_len: int | None = None) -> Weights:
        """The model's weights, each projection built by ``backend`` (default: torch's);
        ``blocks``: the GGUF blocks of its linears by parameter name (the x86 backend runs
        them); ``max_len``: the RoPE table's positions (default: the model's context)."""
        config = model.config
        reason = unsupported(config)
        if reason:
            raise ValueError(f"the runtime cannot run this model: {reason}")
        shape = Shape.from_config(config)
        dtype = next(model.parameters()).dtype
        linears = Linears(backend or Backend(), blocks or {},
                          {m: n for n, m in model.named_modules()})
        layers = tuple(hf_layer(block, linears) for block in model.model.layers)
        cos, sin = rope_table(config, shape.head_dim, max_len or shape.max_len, dtype)
        device = model.model.embed_tokens.weight.device
        return cls(shape, model.model.embed_tokens.weight.detach(), layers,
                   model.model.norm.weight.detach(), linears.head(model),
                   cos.to(device), signed(sin).to(device))

    def projections(self) -> list[Linear]:
        """Every layer's four projections, then the lm_head: a pass's linears, in order."""
        return [p for layer in self.layers
                for p in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [self.lm_head]


@dataclass(frozen=True)
class Linears:
    """How ``Weights.from_hf`` builds a model's projections: the backend, the GGUF blocks by
    parameter name, and each module's name."""

    backend: Backend
    blocks: dict[str, Blocks]
    names: dict  # module -> its name in the model

    def fuse(self, modules) -> Linear:
        """Concatenate the outputs of ``modules`` into one projection (their blocks' rows too);
        the modules keep views of it."""
        with torch.no_grad():
            w = torch.cat([m.weight.detach() for m in modules]).contiguous()  # [out, in]
            for m, part in zip(modules, w.split([m.out_features for m in modules]), strict=True):
                m.weight.data = part  # the HF model shares the fused storage
        bias = None if modules[0].bias is None else torch.cat([m.bias.detach() for m in modules])
        names = [f"{self.names[m]}.weight" for m in modules]
        return self.backend.linear(w, bias, self.joined(names), " + ".join(names))

    def joined(self, names: list[str]) -> Blocks | None:
        """The blocks of these weights stacked by rows, or None unless all have them in one
        format."""
        parts = [self.blocks.get(n) for n in names]
        if not self.backend.runs_codes or None in parts or len({p.format for p in parts}) != 1:
            return None
        return Blocks(parts[0].format, torch.cat([p.data for p in parts]))

    def head(self, model) -> Linear:
        """The lm_head (tied: the embedding, and the embedding's blocks)."""
        w = model.get_output_embeddings().weight.detach()
        tied = w.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        name = "model.embed_tokens.weight" if tied else "lm_head.weight"
        return self.backend.linear(w, None, self.joined([name]), name)


def hf_layer(block, linears: Linears) -> Layer:
    attn, mlp = block.self_attn, block.mlp

    def norm(name):
        module = getattr(attn, name, None)
        return None if module is None else module.weight.detach()

    return Layer(block.input_layernorm.weight.detach(),
                 linears.fuse([attn.q_proj, attn.k_proj, attn.v_proj]),
                 norm("q_norm"), norm("k_norm"), linears.fuse([attn.o_proj]),
                 block.post_attention_layernorm.weight.detach(),
                 linears.fuse([mlp.gate_proj, mlp.up_proj]),
                 linears.fuse([mlp.down_proj]))
