"""The Parquet files the jobs hand each other: their schemas, the tokenizer a corpus was made
with, and the prompts of a corpus file.

- ``CORPUS_SCHEMA``: a tokenised corpus (``pipelines.corpus``, and ``pipelines.responses``, which
  writes the target's own answers in the same schema). Its file metadata names the target and
  the tokenizer fingerprint (``specdec.tokenizer``), which ``check_tokenizer`` compares.
- ``STEPS_SCHEMA``: the SD simulation, one row per drafted token (``pipelines.simulate``; read by
  ``pipelines.train_preverifier``).
Column meanings in docs/PIPELINES.md.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa

from pipelines.common.tables import metadata, read_table

CORPUS_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("source", pa.string()),  # "sharegpt" | "humaneval"
    ("split", pa.string()),  # "train" | "dev" | "benchmark"
    ("prompt_ids", pa.list_(pa.int32())),  # chat template with the generation prompt
    ("input_ids", pa.list_(pa.int32())),  # prompt + response (the prompt alone for HumanEval)
    ("prompt_len", pa.int32()),
])

STEPS_SCHEMA = pa.schema([
    ("request", pa.string()),  # corpus row id
    ("step", pa.int32()),  # round index within the request
    ("position", pa.int32()),  # position in the draft, 0-based
    ("block", pa.int32()),  # PACER block index = position // pacer_block
    ("token", pa.int32()),  # drafted token x_i
    ("greedy", pa.int32()),  # target's greedy token y*_i
    ("regret", pa.float32()),  # z_i(y*_i) - z_i(x_i), raw logits
    ("accepted", pa.int8()),  # 1 = accepted by the configured verifier
    ("hidden", pa.list_(pa.float32())),  # [D] drafter hidden state, or [2H + D] acceptance features
])
# STEPS_SCHEMA metadata of rows that hold the acceptance model's features: JSON {"drafter": its
# kind, "root_size": H} (the signals' width D is the rest of a row's hidden)
ACCEPTANCE_META = "specdec.acceptance"


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary: corpora and targets must agree on it."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha1(json.dumps(vocab).encode()).hexdigest()[:16]


def check_tokenizer(path: str | Path, target: str, what: str) -> None:
    """A corpus file must have been tokenised with ``target``'s tokenizer (same vocabulary)."""
    from transformers import AutoTokenizer

    from specdec.models.sources import resolve

    meta = metadata(path)
    want = meta.get("specdec.tokenizer")
    got = tokenizer_fingerprint(AutoTokenizer.from_pretrained(resolve(target)))
    if want and want != got:
        raise ValueError(f"{what}: {path} was tokenised for {meta.get('specdec.target')!r} "
                         f"(tokenizer {want}); target {target!r} has tokenizer {got}")


def load_prompts(path: str, limit: int | None, what: str, per_source: bool = False) -> list[dict]:
    """The first ``limit`` rows of a corpus file (of each source, with ``per_source``) as
    ``{"id", "prompt_ids"}``, those with at least two prompt tokens (``what`` names the config
    key in errors)."""
    table = read_table(path, CORPUS_SCHEMA, what)
    rows = table.select(["id", "source", "prompt_ids"]).to_pylist()
    taken: dict[str | None, int] = {}
    out = []
    for r in rows:
        source = r.pop("source")
        key = source if per_source else None
        if limit is None or taken.get(key, 0) < limit:
            taken[key] = taken.get(key, 0) + 1
            out.append(r)
    return [r for r in out if len(r["prompt_ids"]) >= 2]
