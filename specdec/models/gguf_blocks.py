"""The quantized blocks of a GGUF file's linears, kept beside a named source's float32 cache.

A named source is built from a GGUF file whose linears are quantized (SmolLM2-135M's: Q4_1, its
embedding, tied as the lm_head, Q8_0); transformers dequantizes them to the float32 weights the
cache holds. ``write`` keeps the blocks themselves too, by the HF parameter name, in
``quantized.safetensors`` (with each tensor's format in its metadata), so the runtime can run
the linears from them (``specdec.runtime.x86.qpanels``) and stream a fraction of the bytes. Rows are
ordered as transformers orders the dequantized weights: Llama's q and k rows un-permuted from
GGUF's RoPE layout, as its loader does. The runtime checks the blocks against the float32
weights bitwise before it uses them, so a file that disagrees is never run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SIDECAR = "quantized.safetensors"
FORMATS = ("Q4_1", "Q8_0")  # the block formats the runtime decodes (``runtime.x86.qpanels``)
BLOCK = 32  # inputs a block covers
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}  # a block: float16 d (and m for Q4_1), then the codes
LAYER_LINEARS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
WHOLE_MODEL = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}


@dataclass(frozen=True)
class Blocks:
    """One weight [out, in] as GGUF holds it: ``data`` uint8 [out, in / 32 * block bytes]."""

    format: str  # one of FORMATS
    data: torch.Tensor

    def by_block(self, out: int, rows: int | None = None) -> torch.Tensor:
        """The blocks as uint8 [rows, in / 32, block bytes], rows past ``out`` zero (padding to
        a kernel's panels); ``rows`` None: ``out``."""
        data = self.data.reshape(out, -1, BLOCK_BYTES[self.format])
        if rows is None or rows == out:
            return data
        full = data.new_zeros(rows, *data.shape[1:])
        full[:out] = data
        return full

    def codes(self, out: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The weight's integer codes int64 [out, in] and per block its d and m (zero for Q8_0),
        float32 [out, in / 32]: the weight is d * q (+ m)."""
        data = self.by_block(out)
        d = halves(data, 0).float()
        if self.format == "Q4_1":
            qs = data[..., 4:].long()  # byte i: input i (low nibble) and i + 16 (high)
            q = torch.cat([qs & 0xF, qs >> 4], dim=-1).reshape(out, -1)
            return q, d, halves(data, 2).float()
        q = data[..., 2:].contiguous().view(torch.int8).long().reshape(out, -1)
        return q, d, torch.zeros_like(d)

    def dequantized(self, out: int) -> torch.Tensor:
        """The float32 weight [out, in] as GGUF defines it: d * q, then + m (two roundings), the
        values transformers loads."""
        q, d, m = self.codes(out)
        w = d.repeat_interleave(BLOCK, dim=1) * q.float()
        return w + m.repeat_interleave(BLOCK, dim=1) if self.format == "Q4_1" else w

    def decode_to(self, weight: torch.Tensor) -> bool:
        """Whether the blocks decode bitwise to ``weight`` [out, in] (signed zeros included)."""
        got = self.dequantized(weight.shape[0])
        return got.shape == weight.shape and torch.equal(got.view(torch.int32),
                                                         weight.contiguous().view(torch.int32))


def halves(data: torch.Tensor, at: int) -> torch.Tensor:
    """The float16 at byte ``at`` of every block of ``data`` [..., block bytes]: [...]."""
    return data[..., at:at + 2].contiguous().view(torch.float16)[..., 0]


def hf_name(gguf_name: str) -> str | None:
    """The HF parameter a GGUF tensor becomes, for the linears and the embedding; else None."""
    if gguf_name in WHOLE_MODEL:
        return WHOLE_MODEL[gguf_name]
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if match and match[2] in LAYER_LINEARS:
        return f"model.layers.{match[1]}.{LAYER_LINEARS[match[2]]}.weight"
    return None


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a Llama q or k weight from GGUF's RoPE order back to HF's (transformers' GGUF
    loader does the same to the dequantized weight): within each head, the interleaved halves
    made contiguous again."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def write(gguf_path: Path, config, out: Path) -> int:
    """Write the blocks of every linear of ``gguf_path`` in one of ``FORMATS`` to ``out``;
    returns how many. ``config``: the HF config the file was loaded as (its heads, its type)."""
    import gguf
    from safetensors.torch import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    tensors, formats = {}, {}
    for t in reader.tensors:
        name, kind = hf_name(t.name), t.tensor_type.name
        if name is None or kind not in FORMATS:
            continue
        rows = np.asarray(t.data)
        if config.model_type == "llama" and ".attn_q." in t.name:
            rows = unpermute(rows, config.num_attention_heads)
        elif config.model_type == "llama" and ".attn_k." in t.name:
            rows = unpermute(rows, config.num_key_value_heads)
        tensors[name] = torch.from_numpy(np.array(rows))  # a copy: the reader maps the file read-only
        formats[name] = kind
    tmp = out.with_name(out.name + ".tmp")
    save_file(tensors, str(tmp), metadata=formats)
    tmp.rename(out)
    return len(tensors)


def present(directory: str | Path) -> bool:
    """Whether a model directory keeps its GGUF blocks (without reading them)."""
    return (Path(directory) / SIDECAR).is_file()


def load(directory: str | Path) -> dict[str, Blocks] | None:
    """The blocks kept in a model directory, by HF parameter name; None when it keeps none."""
    path = Path(directory) / SIDECAR
    if not path.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        formats = f.metadata() or {}
        return {name: Blocks(formats[name], f.get_tensor(name)) for name in f.keys()
                if formats.get(name) in FORMATS}
