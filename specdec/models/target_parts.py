"""The target's embedding and lm_head alone, read by name from its safetensors.

A block drafter borrows two tensors of the target: the input embedding (it embeds the anchor
token) and the lm_head (it turns its hidden states into draft logits). A process that drafts
without running the target (the drafter actor) reads just those, with ``safetensors.safe_open``,
in the dtype and on the device the target itself would have them, instead of building a second
target with its own KV pool. ``TargetParts`` answers what ``BlockDrafter.load`` asks of a target
(``device``, ``dtype``, ``vocab_size``, ``embedding_weight()``, ``lm_head_weight()``).

Which names hold them comes from the architecture itself, built on the ``meta`` device (no
memory, no weights): the parameters behind ``get_input_embeddings`` and
``get_output_embeddings``. Tied embeddings (``tie_word_embeddings``, as SmolLM2's) read the
embedding once and use it as the lm_head too, as transformers does.

What it is not: no forward, no tokenizer, no KV cache (``specdec.models.target``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.models.sources import parse_device, parse_dtype, resolve

INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class TargetParts:
    embedding: torch.Tensor  # [V, H] the target's input embedding
    lm_head: torch.Tensor  # [V, H] its output projection (the embedding itself when tied)
    ref: str  # the target's local directory

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.dtype

    @property
    def vocab_size(self) -> int:
        return self.lm_head.shape[0]

    def embedding_weight(self) -> torch.Tensor:
        return self.embedding

    def lm_head_weight(self) -> torch.Tensor:
        return self.lm_head

    @classmethod
    def load(cls, ref: str, dtype: str | torch.dtype = "float32",
             device: str | torch.device = "cpu") -> TargetParts:
        """The embedding and lm_head of the target ``ref``, as ``TargetModel.from_pretrained``
        would hold them for ``dtype`` and ``device`` (``target_dtype``)."""
        directory = local_directory(ref)
        torch_dtype, where = target_dtype(directory, dtype, device), parse_device(device)
        embedding_name, head_name = embedding_names(directory)
        files = weight_files(directory)

        def read(name: str) -> torch.Tensor:
            if name not in files:
                raise KeyError(f"target {ref!r}: no tensor {name!r} in its safetensors")
            from safetensors import safe_open

            with safe_open(str(directory / files[name]), framework="pt") as f:
                return f.get_tensor(name).to(where, torch_dtype)

        embedding = read(embedding_name)
        lm_head = embedding if head_name is None else read(head_name)
        return cls(embedding, lm_head, str(directory))


def local_directory(ref: str) -> Path:
    """The target's directory: a named source or a path (``sources.resolve``), or a hub id's
    configs and safetensors downloaded."""
    path = Path(resolve(ref))
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(path), allow_patterns=["*.json", "*.safetensors"]))


def target_dtype(directory: Path, dtype: str | torch.dtype,
                 device: str | torch.device) -> torch.dtype:
    """The dtype ``TargetModel.from_pretrained`` gives the target with its default knobs
    (``target.load_plan``, ``load_dtype``: from its config alone)."""
    if dtype != "auto":
        return parse_dtype(dtype)
    from transformers import AutoConfig

    from specdec.models.target import load_dtype, load_plan

    plan = load_plan(directory, AutoConfig.from_pretrained(directory), dtype,
                     parse_device(device), present=False, max_model_len=1)
    return load_dtype(plan, dtype)


def embedding_names(directory: Path) -> tuple[str, str | None]:
    """(the embedding's parameter name, the lm_head's or None when tied to the embedding), from
    the architecture built on the ``meta`` device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    names = dict(model.named_parameters(remove_duplicate=False))
    embedding_name = next(n for n, p in names.items() if p is embedding)
    if head is embedding:
        return embedding_name, None
    return embedding_name, next(n for n, p in names.items() if p is head)


def weight_files(directory: Path) -> dict[str, str]:
    """Tensor name -> the safetensors file holding it (one file, or a sharded index)."""
    index = directory / INDEX_FILE
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    if not (directory / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{directory} holds no {WEIGHTS_FILE} nor {INDEX_FILE}")
    from safetensors import safe_open

    with safe_open(str(directory / WEIGHTS_FILE), framework="pt") as f:
        return dict.fromkeys(f.keys(), WEIGHTS_FILE)
