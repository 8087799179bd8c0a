"""What the runtime's forward needs from a model: its shape, its RoPE table and its weights.

``unsupported(config)`` says why an HF config is outside the Llama family this runtime runs
(None when it is inside): Llama / SmolLM2, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm), SiLU MLP,
full attention in every layer, RoPE of type default, linear or llama3. ``Weights.from_hf`` takes
the tensors of a loaded transformers model (the loader and the test reference; its forward never
runs here) and fuses q/k/v and gate/up (the HF modules then hold views of the fused tensors, so
the weights are not stored twice). Layout, by measurement (bench/runtime.py and
docs/BENCHMARKS.md):
- float32, on the AMD EPYC (AVX2), where MKL's ``F.linear`` over a few rows costs 2-3x one row
  (it repacks the weight on every call): a pass of one row (a decode step, a prefill's lm_head)
  runs ``x @ wt`` on a pre-transposed contiguous ``[in, out]`` copy (GEMV, about 1.4x (layers)
  to 2x (lm_head) faster than ``F.linear``); a pass of several rows runs oneDNN's linear on a
  copy of the weight reordered once, at load, into oneDNN's blocked layout (``packed``): the
  linears of 8 rows cost about 1.2x one row's instead of 2.5x.
- bfloat16 runs every pass, one row or many, on the ``packed`` copy: on the 2-core AMX Xeon
  (2026-12-02) the linears of a SmolLM2-135M pass took 12.7 / 12.7 / 16.4 / 25.8 ms at 1 / 4 /
  32 / 100 rows against ``F.linear``'s 19.1 / 19.6 / 23.0 / 39.7 (which reorders the weight on
  every call), with bitwise the same outputs: in pieces of up to 32 rows each row's are its
  outputs alone, and a 64- to 200-token prompt chunk's logits were equal. ``x @ wt`` was 6-9x
  slower than ``F.linear`` in bfloat16, so it keeps no ``[in, out]`` copy.
- float32 on an x86 CPU with AVX-512 (where the extension builds, ``panels.usable``): only the
  panel kernel's copy (``specdec.runtime.panels``), for every pass, in place of both copies above.
  On the 2-core Xeon without AMX (2026-12-04) it took a whole pass of 8 decodes from 48.1 to
  41.0 ms and left one decode as it was, 25.6 against 25.4 ms (docs/benchmarks/panels/); and each
  row's outputs are then its outputs alone, in any batch.
- float32 with the GGUF's quantized blocks beside the weights (``specdec.models.gguf_blocks``,
  the named sources) and the panel kernel: also the panels' codes (``specdec.runtime.qpanels``),
  each checked at load to decode bitwise to its float32 weight, for passes of a few rows; their
  outputs are bitwise the float32 panels', so which of the two a pass runs on never shows.
- float32 with those blocks on a CPU with AVX-512 VNNI (``linears: auto`` or ``int8``): only
  the codes, laid out for the int8 kernel (``specdec.runtime.int8``), which quantizes each row
  to int8 per block and multiplies in integers, as llama.cpp does: other numerics than float32's
  (logits move by up to about 1), every row's outputs its outputs alone. On the 2-core AMD EPYC
  (2026-12-04) the projections of a SmolLM2-135M pass took 3.2 / 6.2 / 20.8 / 76.2 ms at
  1 / 8 / 32 / 128 rows, the float32 panels' 12.8 / 14.8 / 32.6 / 114.0.
``packed_weight`` needs oneDNN (CPU only; bfloat16 also where oneDNN runs it here,
``can_pack``). The ``[out, in]`` weight itself stays for everything else (float64, GPUs, and
the HF model, which shares its storage).

RoPE follows transformers' definition exactly, float32 arithmetic included (its cos/sin are
computed in float32 whatever the model dtype, then cast): ``inv_freq_i = 1 / theta^(2i/d)``,
divided by ``factor`` (linear) or smoothly rescaled by wavelength (llama3, Meta's Llama 3.1).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.models.gguf_blocks import Blocks
from specdec.runtime import int8 as int8_kernel
from specdec.runtime import panels as panel_kernel
from specdec.runtime import qpanels

log = logging.getLogger(__name__)

FAMILY = ("llama", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")
SINGLE_ROW_COPY = {torch.float32: True, torch.bfloat16: False, torch.float64: False}
PACK = {torch.float32: True, torch.bfloat16: True, torch.float64: False}
PANELS = {torch.float32: True}  # where the panel kernel runs (``panels.usable``), it replaces both
LINEARS = ("auto", "int8", "quantized", "panels", "torch")  # a config's choice (``linear_flags``)


def linear_flags(linears: str, blocks: bool = False) -> dict:
    """``Weights.from_hf``'s ``panels``, ``quantized`` and ``int8`` for a config's ``linears``,
    ``blocks`` saying whether the model has its GGUF's blocks beside it.

    - auto: where there are blocks, the int8 kernel where it runs here (AVX-512 VNNI), else the
      quantized panels; without blocks the float32 panels; for float32 where the kernels run
      here, else torch's linears (None: as measured fastest).
    - int8, quantized and panels: those, or an error saying why they cannot run here.
    - torch: oneDNN's and MKL's linears.

    int8 (GGUF codes times int8 rows, ``specdec.runtime.int8``, as llama.cpp computes a GGUF
    model) are other numerics than float32's, which quantized and panels compute bitwise."""
    if linears not in LINEARS:
        raise ValueError(f"linears must be one of {list(LINEARS)}, not {linears!r}")
    kernel = {"int8": int8_kernel, "quantized": panel_kernel, "panels": panel_kernel}.get(linears)
    reason = kernel.unavailable() if kernel else None
    if reason:
        raise ValueError(f"linears: {linears} cannot run here: {reason}")
    if linears in ("int8", "quantized") and not blocks:
        raise ValueError(f"linears: {linears} needs the model's GGUF blocks "
                         "(a named source keeps them), and this model has none")
    if linears == "auto":
        int8 = int8_rows(blocks, linears)
        return dict(panels=None, quantized=blocks and not int8, int8=int8)
    return {"int8": dict(panels=True, quantized=False, int8=True),
            "quantized": dict(panels=True, quantized=True, int8=False),
            "panels": dict(panels=True, quantized=False, int8=False),
            "torch": dict(panels=False, quantized=False, int8=False)}[linears]


def int8_rows(blocks: bool, linears: str) -> bool:
    """Whether a float32 model with (or without) its GGUF blocks runs int8 rows on them under
    ``linears`` (auto: where the int8 kernel runs here; int8: asked for, checked at load)."""
    return blocks and (linears == "int8" or linears == "auto" and int8_kernel.unavailable() is None)


def can_pack(w: torch.Tensor) -> bool:
    """Whether oneDNN can hold ``w`` packed here (a CPU float32 weight, or a bfloat16 one where
    oneDNN runs bfloat16)."""
    if w.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    if w.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return w.dtype == torch.float32


def packed_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` [out, in] reordered into oneDNN's layout, for ``packed_linear``."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] -> [..., out] through oneDNN's linear on a ``packed_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


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
    """The sin table with its first half negated, for ``specdec.runtime.model.rope``."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


@dataclass(frozen=True)
class Proj:
    """One (fused) linear projection."""

    w: torch.Tensor  # [out, in], for F.linear
    wt: torch.Tensor | None  # [in, out] contiguous copy for single-row passes (float32), or None
    bias: torch.Tensor | None  # [out] (Qwen2's q/k/v)
    # oneDNN-packed w: float32's multi-row passes, bfloat16's every pass (CPU; module docstring)
    packed: torch.Tensor | None = None
    panels: torch.Tensor | None = None  # w as the panel kernel's panels: float32's every pass
    codes: qpanels.QPanels | None = None  # w's GGUF codes as panels, beside ``panels``
    int8: int8_kernel.Codes | None = None  # w's GGUF codes for int8 rows, alone

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]: the int8 kernel where w has its codes; the panel kernel on
        the codes for passes of at most ``qpanels.ROWS`` rows and on the panels for longer ones
        (bitwise the same outputs), where w has them; else oneDNN's linear on the packed copy
        where there is one, else ``F.linear`` (one call, whatever the number of rows)."""
        if self.int8 is not None:
            return int8_kernel.linear(x, self.int8, self.bias)
        if self.codes is not None and x.numel() <= qpanels.ROWS * x.shape[-1]:
            return qpanels.linear(x, self.codes, self.w.shape[0], self.bias)
        if self.panels is not None:
            return panel_kernel.linear(x, self.panels, self.w.shape[0], self.bias)
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias)
        return F.linear(x, self.w, self.bias)

    @classmethod
    def of(cls, w: torch.Tensor, bias: torch.Tensor | None, layout: Layout,
           blocks: Blocks | None = None, name: str = "") -> Proj:
        """``blocks``: w as its GGUF holds it, run as codes where the layout says so and they
        decode bitwise to w (``name`` says which weight in the log when they do not)."""
        if layout.int8 and w.dtype == torch.float32 and w.device.type == "cpu" and \
                checked(w, blocks, name):
            return cls(w, None, bias, int8=int8_kernel.pack(blocks, w.shape[0]))
        if layout.panels and panel_kernel.usable(w):
            codes = None
            if layout.quantized and checked(w, blocks, name):
                codes = qpanels.pack(blocks, w.shape[0])
            return cls(w, None, bias, panels=panel_kernel.pack(w), codes=codes)
        return cls(w, w.t().contiguous() if layout.single_row_copy else None, bias,
                   packed_weight(w) if layout.pack and can_pack(w) else None)


def checked(w: torch.Tensor, blocks: Blocks | None, name: str) -> bool:
    """Whether there are GGUF blocks of w that decode bitwise to it; logged when not (w then
    runs on float32 panels)."""
    if blocks is None:
        log.warning("%s has no GGUF blocks: it runs on float32 panels", name)
        return False
    if not blocks.decode_to(w):
        log.warning("%s: its GGUF blocks do not decode to its weight: it runs on float32 panels",
                    name)
        return False
    return True


@dataclass(frozen=True)
class Layout:
    """Which extra copies of each weight the forward keeps (see the module docstring); None:
    as measured fastest for the dtype (``SINGLE_ROW_COPY``, ``PACK``)."""

    single_row_copy: bool  # the [in, out] copy for single-row passes
    pack: bool  # the oneDNN-packed copy (where ``can_pack``)
    panels: bool = False  # the panel kernel's copy in place of both (where ``panels.usable``)
    quantized: bool = False  # with ``panels``: the GGUF codes in place of the float32 panels
    int8: bool = False  # the GGUF codes times int8 rows (``int8_kernel``), where w has them

    @classmethod
    def for_dtype(cls, dtype: torch.dtype, single_row_copy: bool | None = None,
                  pack: bool | None = None, panels: bool | None = None,
                  quantized: bool = False, int8: bool = False) -> Layout:
        def pick(table, flag):
            return table.get(dtype, False) if flag is None else flag
        return cls(pick(SINGLE_ROW_COPY, single_row_copy), pick(PACK, pack), pick(PANELS, panels),
                   quantized, int8)


@dataclass(frozen=True)
class Layer:
    attn_norm: torch.Tensor  # [H]
    qkv: Proj  # H -> (h + 2 kvh) * d
    q_norm: torch.Tensor | None  # [d] (Qwen3)
    k_norm: torch.Tensor | None  # [d]
    o: Proj  # h * d -> H
    mlp_norm: torch.Tensor  # [H]
    gate_up: Proj  # H -> 2 I
    down: Proj  # I -> H


@dataclass(frozen=True)
class Weights:
    shape: Shape
    embed: torch.Tensor  # [V, H]
    layers: tuple[Layer, ...]
    norm: torch.Tensor  # [H]
    lm_head: Proj  # H -> V (w is the embedding itself when tied)
    cos: torch.Tensor  # [max_len, d]
    sin_signed: torch.Tensor  # [max_len, d]: sin, its first half negated (``signed``)

    @classmethod
    def from_hf(cls, model, single_row_copy: bool | None = None, pack: bool | None = None,
                panels: bool | None = None, quantized: bool = False, int8: bool = False,
                blocks: dict[str, Blocks] | None = None) -> Weights:
        """The flags pick the extra weight copies (``Layout``); None: as measured fastest.
        ``blocks``: the GGUF blocks of the model's linears by parameter name, which
        ``quantized`` and ``int8`` run."""
        config = model.config
        reason = unsupported(config)
        if reason:
            raise ValueError(f"the runtime cannot run this model: {reason}")
        shape = Shape.from_config(config)
        dtype = next(model.parameters()).dtype
        layout = Layout.for_dtype(dtype, single_row_copy, pack, panels, quantized, int8)
        linears = Linears(layout, blocks or {}, {m: n for n, m in model.named_modules()})
        layers = tuple(hf_layer(block, linears) for block in model.model.layers)
        cos, sin = rope_table(config, shape.head_dim, shape.max_len, dtype)
        device = model.model.embed_tokens.weight.device
        return cls(shape, model.model.embed_tokens.weight.detach(), layers,
                   model.model.norm.weight.detach(), linears.head(model),
                   cos.to(device), signed(sin).to(device))


    def projections(self) -> list[Proj]:
        """Every layer's four projections, then the lm_head: a pass's linears, in order."""
        return [p for layer in self.layers
                for p in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [self.lm_head]


@dataclass(frozen=True)
class Linears:
    """How ``Weights.from_hf`` builds a model's projections: the layout, the GGUF blocks by
    parameter name, and each module's name."""

    layout: Layout
    blocks: dict[str, Blocks]
    names: dict  # module -> its name in the model

    def fuse(self, modules) -> Proj:
        """Concatenate the outputs of ``modules`` into one projection (their blocks' rows too);
        the modules keep views of it."""
        with torch.no_grad():
            w = torch.cat([m.weight.detach() for m in modules]).contiguous()  # [out, in]
            for m, part in zip(modules, w.split([m.out_features for m in modules]), strict=True):
                m.weight.data = part  # the HF model shares the fused storage
        bias = None if modules[0].bias is None else torch.cat([m.bias.detach() for m in modules])
        names = [f"{self.names[m]}.weight" for m in modules]
        return Proj.of(w, bias, self.layout, self.joined(names), " + ".join(names))

    def joined(self, names: list[str]) -> Blocks | None:
        """The blocks of these weights stacked by rows, or None unless all have them in one
        format."""
        parts = [self.blocks.get(n) for n in names]
        runs_codes = self.layout.quantized or self.layout.int8
        if not runs_codes or None in parts or len({p.format for p in parts}) != 1:
            return None
        return Blocks(parts[0].format, torch.cat([p.data for p in parts]))

    def head(self, model) -> Proj:
        """The lm_head (tied: the embedding, and the embedding's blocks)."""
        w = model.get_output_embeddings().weight.detach()
        tied = w.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        name = "model.embed_tokens.weight" if tied else "lm_head.weight"
        return Proj.of(w, None, self.layout, self.joined([name]), name)


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
