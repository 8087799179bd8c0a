"""Job: the suffix drafter's offline index from the target's own responses (MLflow registry).

Reads the Parquet that ``pipelines.responses`` writes (prompt + the target's greedy response
per row) as a Ray Dataset, keeps each row's response only (SuffixDecoding's global tree holds
responses, never prompts), and writes a ``specdec.models.suffix_index`` directory: the token
sequences in corpus order plus the build config. It logs the index as an MLflow artifact and
registers it as ``<target>-suffix-index`` (alias ``champion`` when the config asks), which
serving loads as ``models:/<target>-suffix-index@champion``. It also builds the drafter's tree
from the index once and logs its memory (resident-set growth) per million indexed tokens.

    python -m pipelines.suffix_index --config configs/train/suffix_index.yaml

It trains nothing and loads no weights: only the responses' token ids and the target's
vocabulary size (from its config).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from pipelines.common.config import MlflowSettings, Strict, cli_config, default_output, target_name
from pipelines.common.formats import CORPUS_SCHEMA
from pipelines.common.tables import check_table, metadata, read_dataset


class SuffixIndexConfig(Strict):
    target: str = "smollm2-135m"
    responses: str  # the Parquet that pipelines.responses wrote
    out: str | None = None  # default $SPECDEC_HOME/pipelines/suffix_index/index
    limit: int | None = Field(None, ge=1)  # the first N responses (corpus order)
    min_tokens: int = Field(2, ge=1)  # shorter responses teach the tree nothing
    max_depth: int = Field(64, ge=1)  # for the memory measurement (the serving tree's depth)
    mlflow: MlflowSettings = MlflowSettings()

    def output(self) -> Path:
        return Path(self.out) if self.out else default_output("suffix_index") / "index"


def responses_of(batch: dict) -> dict:
    """A batch of corpus rows -> their responses (input_ids after prompt_len)."""
    out = [list(ids[int(n):]) for ids, n in zip(batch["input_ids"], batch["prompt_len"], strict=True)]
    return {"id": list(batch["id"]), "response": out}


def read_responses(cfg: SuffixIndexConfig) -> list[list[int]]:
    import ray.data

    from pipelines.common.pools import ensure_ray

    check_table(cfg.responses, CORPUS_SCHEMA, "suffix_index.responses")  # before Ray starts
    ensure_ray()
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    ds = read_dataset(cfg.responses).select_columns(["id", "input_ids", "prompt_len"])
    rows = ds.map_batches(responses_of, batch_format="numpy").take_all()
    seqs = [[int(t) for t in r["response"]] for r in rows]
    seqs = [s for s in seqs if len(s) >= cfg.min_tokens]
    return seqs[:cfg.limit]


def vocab_size_of(cfg: SuffixIndexConfig) -> int:
    """The target model's vocabulary (its config: a model may emit ids past its tokenizer's
    size, as the tiny random ones do); the responses must have been written for it."""
    from transformers import AutoConfig

    from specdec.models.sources import resolve

    meta = metadata(cfg.responses)
    if "specdec.vocab_size" not in meta:
        raise ValueError(f"suffix_index.responses: {cfg.responses} has no specdec.vocab_size "
                         "metadata (was it written by pipelines.responses?)")
    return AutoConfig.from_pretrained(resolve(cfg.target)).vocab_size


def resident_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tree_memory(index, max_depth: int) -> dict:
    """Build the serving tree from ``index`` once; its resident-set growth."""
    from specdec.models.suffix import SuffixConfig, SuffixDrafter

    before = resident_bytes()
    drafter = SuffixDrafter(index.vocab_size, SuffixConfig(max_depth=max_depth), index)
    grown = resident_bytes() - before
    tokens = max(index.num_tokens, 1)
    return {"tree_rss_mb": grown / 2**20, "tree_mb_per_million_tokens": grown / 2**20 * 1e6 / tokens,
            "cached_responses": drafter.cached_responses}


def run(cfg: SuffixIndexConfig) -> dict:
    import mlflow

    from pipelines.common.tracking import log_params, register, start_run
    from specdec.models.suffix_index import SuffixIndex

    vocab_size = vocab_size_of(cfg)
    with start_run(cfg.mlflow, "suffix_index") as run_:
        log_params(cfg.model_dump())
        seqs = read_responses(cfg)
        if not seqs:
            raise ValueError(f"suffix_index.responses: {cfg.responses} holds no response of "
                             f">= {cfg.min_tokens} tokens")
        index = SuffixIndex(tuple(tuple(s) for s in seqs), cfg.target, vocab_size,
                            {"source": Path(cfg.responses).name, "max_depth": cfg.max_depth})
        path = index.save(cfg.output())
        memory = tree_memory(index, cfg.max_depth)
        metrics = {"sequences": len(seqs), "tokens": index.num_tokens, **memory}
        mlflow.log_metrics(metrics)
        mlflow.log_artifacts(str(path), artifact_path="suffix_index")
        uri = register(cfg.mlflow, f"{target_name(cfg.target)}-suffix-index", run_, "suffix_index")
    return {"index": str(path), "model_uri": uri, **metrics, "run_id": run_.info.run_id}


def main(argv=None) -> None:
    out = run(cli_config(SuffixIndexConfig, argv, "Build the suffix drafter's offline index."))
    print("\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
