"""The suffix index: the token sequences a suffix drafter's global tree starts from, on disk.

An index is a directory with two files:

- ``suffix_index.json``: the config (format version, the target it was built for and its
  vocabulary size, where the sequences came from, how many sequences and tokens);
- ``tokens.safetensors``: the sequences flattened, ``tokens`` [N] int32, and ``offsets``
  [S + 1] int64 (sequence i is ``tokens[offsets[i]:offsets[i + 1]]``).

No pickle is ever read. ``SuffixIndex.load`` accepts a directory or a ``models:/NAME@ALIAS``
registry reference and fails with a message that names the file and what is wrong. The index
holds only the target's *responses*, never prompts (SuffixDecoding's global tree). It is built
by ``pipelines.suffix_index``; it is not a tree: the drafter builds its tree at start-up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

FORMAT = 1
CONFIG_FILE = "suffix_index.json"
TOKENS_FILE = "tokens.safetensors"


@dataclass(frozen=True)
class SuffixIndex:
    sequences: tuple[tuple[int, ...], ...]  # S responses of target token ids, oldest first
    target: str  # the target these are the outputs of
    vocab_size: int
    meta: dict = field(default_factory=dict)  # provenance: source table, build config

    def __post_init__(self):
        if self.vocab_size < 1:
            raise ValueError(f"suffix index: vocab_size must be >= 1, got {self.vocab_size}")
        for i, seq in enumerate(self.sequences):
            bad = [t for t in seq if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"suffix index: sequence {i} has token ids {bad[:5]} outside "
                                 f"the vocabulary of {self.vocab_size}")

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.sequences)

    def config(self) -> dict:
        return {"format": FORMAT, "target": self.target, "vocab_size": self.vocab_size,
                "sequences": len(self.sequences), "tokens": self.num_tokens, **self.meta}

    def save(self, out: str | Path) -> Path:
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        lengths = torch.tensor([len(s) for s in self.sequences], dtype=torch.int64)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        flat = torch.tensor([t for s in self.sequences for t in s], dtype=torch.int32)
        save_file({"tokens": flat, "offsets": offsets}, str(out / TOKENS_FILE))
        (out / CONFIG_FILE).write_text(json.dumps(self.config(), indent=1) + "\n")
        return out

    @staticmethod
    def load(ref: str | Path) -> SuffixIndex:
        """Read an index directory or registry reference; raise a clear error if it is not one."""
        from specdec.models.registry import resolve_model_ref

        path = Path(resolve_model_ref(str(ref)))
        config = read_config(path)
        tokens, offsets = read_tensors(path / TOKENS_FILE)
        if offsets.numel() != config["sequences"] + 1 or int(offsets[-1]) != tokens.numel():
            raise ValueError(f"suffix index {path}: {TOKENS_FILE} holds {offsets.numel() - 1} "
                             f"sequences of {tokens.numel()} tokens, but {CONFIG_FILE} says "
                             f"{config['sequences']}")
        flat, cuts = tokens.tolist(), offsets.tolist()
        sequences = tuple(tuple(flat[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True))
        meta = {k: v for k, v in config.items()
                if k not in ("format", "target", "vocab_size", "sequences", "tokens")}
        return SuffixIndex(sequences, config["target"], config["vocab_size"], meta)


def read_config(path: Path) -> dict:
    if not path.is_dir():
        raise FileNotFoundError(f"suffix index {path} is not a directory")
    file = path / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"suffix index {path} has no {CONFIG_FILE}")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"suffix index {file} is not valid JSON: {err}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ValueError(f"suffix index {file}: expected format {FORMAT}, got "
                         f"{config.get('format') if isinstance(config, dict) else config!r}")
    for key, kind in (("target", str), ("vocab_size", int), ("sequences", int)):
        if not isinstance(config.get(key), kind):
            raise ValueError(f"suffix index {file}: {key!r} is missing or not {kind.__name__}")
    return config


def read_tensors(file: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise FileNotFoundError(f"suffix index {file.parent} has no {TOKENS_FILE}")
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise ValueError(f"suffix index {file} is not a safetensors file: {err}") from None
    tokens, offsets = tensors.get("tokens"), tensors.get("offsets")
    if tokens is None or offsets is None or tokens.dim() != 1 or offsets.dim() != 1:
        raise ValueError(f"suffix index {file} must hold 1-d 'tokens' and 'offsets'")
    if offsets.numel() < 1 or int(offsets[0]) != 0 or bool((offsets.diff() < 0).any()):
        raise ValueError(f"suffix index {file}: 'offsets' must start at 0 and never decrease")
    return tokens, offsets
