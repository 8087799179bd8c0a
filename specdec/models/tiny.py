"""Tiny random models for tests and smoke runs, built offline from configs.

``make_tiny_models(out)`` writes a target, an autoregressive draft LM and a block drafter that
share one byte-level tokenizer (every string round-trips, no merges, no hub). The models are
random: their output is meaningless text, but every speculative path must still reproduce the
target's greedy output exactly, which is what the tests check.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen3Config

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_VOCAB = 320  # 256 bytes + 3 specials, padded to a multiple of 64


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with no merges: one token per byte, plus ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", bos_token="<|endoftext|>",
        pad_token="<|endoftext|>", additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(arch: str = "llama", layers: int = 4, hidden: int = 64, eos_token_id: int = 258):
    common = dict(
        vocab_size=TINY_VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, eos_token_id=eos_token_id, bos_token_id=256,
        pad_token_id=256, tie_word_embeddings=False,
        # A wide init keeps random models out of short loops and far from argmax near-ties.
        initializer_range=0.2,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen3":
        return Qwen3Config(head_dim=hidden // 4, **common)
    raise ValueError(f"unknown tiny architecture {arch!r}; choose llama or qwen3")


def make_tiny_lm(out: Path, arch: str, layers: int, hidden: int, seed: int) -> Path:
    tokenizer = byte_tokenizer()
    torch.manual_seed(seed)
    config = tiny_config(arch, layers, hidden, eos_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def make_tiny_models(out: str | Path, arch: str = "llama", seed: int = 0) -> dict[str, Path]:
    """Write ``target/``, ``drafter/`` (AR draft LM) and ``block-drafter/`` under ``out``."""
    from specdec.models.block_drafter import BlockDrafter, BlockDrafterConfig
    from specdec.models.target import TargetModel

    out = Path(out)
    paths = {
        "target": make_tiny_lm(out / "target", arch, layers=4, hidden=64, seed=seed),
        "drafter": make_tiny_lm(out / "drafter", arch, layers=1, hidden=32, seed=seed + 1),
    }
    target = TargetModel.from_pretrained(str(paths["target"]))
    config = BlockDrafterConfig.for_target(target, block_size=8, num_layers=1, num_taps=2)
    torch.manual_seed(seed + 2)
    drafter = BlockDrafter.initialise(config, target, target_ref=str(paths["target"]))
    paths["block-drafter"] = drafter.save(out / "block-drafter")
    return paths
