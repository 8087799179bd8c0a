"""Job: simulate speculative decoding over prompts and record every drafted token (Parquet).

A Ray Data actor pool (each actor holds the target and the drafter; ``num_gpus`` from config)
runs ``specdec.training.simulation.simulate_request`` over the prompts of a corpus split and
writes one row per drafted token: the drafter's hidden state, the position in the draft, the
PACER block index, the target's greedy token, the regret, and the label (accepted or not under
the configured verifier). ``pipelines.train_preverifier`` trains on it. Schema:
``pipelines.common.formats.STEPS_SCHEMA`` (docs/PIPELINES.md).

The drafter is a block-drafter checkpoint (rows for PACER's pre-verifier) or a drafter without
a model, ``ngram`` or ``suffix`` (its offline index: ``suffix_index``). With ``acceptance`` (the
default for those two) the rows' ``hidden`` is the acceptance model's features instead
(``specdec.models.acceptance``) and the file's metadata ``specdec.acceptance`` says so (the
drafter kind and the parts' widths): ``train_preverifier`` then trains an acceptance model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pyarrow as pa
from pydantic import Field, model_validator

from pipelines.common.config import Device, MlflowSettings, Strict, cli_config, default_output
from pipelines.common.formats import ACCEPTANCE_META, STEPS_SCHEMA, check_tokenizer, load_prompts
from pipelines.common.pools import ActorSettings, map_prompts
from pipelines.common.settings import VerifierSettings
from pipelines.common.tables import write_table


class SimulateConfig(Strict):
    target: str = "smollm2-135m"
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    device: Device = "cpu"  # each actor's (actors.num_gpus > 0: its GPU is cuda)
    # positions a request's KV slot holds (the target's plan); None: what memory allows
    max_model_len: int | None = Field(None, ge=1)
    drafter: str  # block-drafter directory or models:/NAME@ALIAS, or ngram | suffix
    suffix_index: str | None = None  # drafter suffix: its offline index (directory or models:/)
    # record the acceptance model's features (None: for ngram and suffix, not for a block drafter)
    acceptance: bool | None = None
    prompts: str  # a corpus split (Parquet)
    limit: int | None = None  # prompts to use
    per_source: bool = False  # limit counts each source's prompts (humaneval, sharegpt) apart
    max_new_tokens: int = Field(64, ge=1)
    draft_len: int | None = Field(None, ge=1)  # default: the block drafter's block; else 16
    pacer_block: int = Field(4, ge=1)
    verifier: VerifierSettings = VerifierSettings()
    actors: ActorSettings = ActorSettings()
    out: str | None = None  # default $SPECDEC_HOME/pipelines/simulate/steps.parquet
    mlflow: MlflowSettings = MlflowSettings()

    def output(self) -> Path:
        return Path(self.out) if self.out else default_output("simulate") / "steps.parquet"

    @property
    def model_free(self) -> bool:
        from specdec.models.drafters import MODEL_FREE

        return self.drafter in MODEL_FREE

    @property
    def records_acceptance(self) -> bool:
        return self.model_free if self.acceptance is None else self.acceptance

    @model_validator(mode="after")
    def _suffix_index(self):
        if self.suffix_index and self.drafter != "suffix":
            raise ValueError("simulate.suffix_index is only read with drafter suffix")
        return self


class Simulator:
    """A Ray Data callable class: holds the pair, simulates SD for each prompt in a batch."""

    def __init__(self, config: dict, drafter_dir: str, suffix_index: str | None = None):
        import torch

        from specdec.algorithms.verify import make_verifier
        from specdec.engine.loading import load_pair
        from specdec.models.acceptance import UNTRAINED
        from specdec.models.suffix import SuffixConfig

        self.cfg = SimulateConfig.model_validate(config)
        torch.set_num_threads(self.cfg.actors.torch_threads)
        # an untrained acceptance model: its features are recorded, its weights never run
        self.pair = load_pair(self.cfg.target, drafter_dir, dtype=self.cfg.dtype,
                              device=self.cfg.device, max_model_len=self.cfg.max_model_len,
                              suffix=SuffixConfig(index=suffix_index),
                              acceptance_ref=UNTRAINED if self.cfg.records_acceptance else None)
        self.verifier = make_verifier(self.cfg.verifier.name, **self.cfg.verifier.params())

    def __call__(self, batch: pa.Table) -> pa.Table:
        from specdec.algorithms.policies import PacerConfig
        from specdec.training.simulation import simulate_request

        cfg, rows = self.cfg, []
        draft_len = cfg.draft_len or self.pair.drafter.max_draft_len or PacerConfig().max_len
        for rid, prompt in zip(batch.column("id").to_pylist(),
                               batch.column("prompt_ids").to_pylist(), strict=True):
            records = simulate_request(self.pair.target, self.pair.drafter, self.verifier,
                                       prompt, cfg.max_new_tokens, draft_len, cfg.pacer_block,
                                       self.pair.acceptance)
            rows += [dict(request=rid, **r.__dict__) for r in records]
        return pa.Table.from_pylist(rows, schema=STEPS_SCHEMA)


def acceptance_meta(cfg: SimulateConfig) -> dict[str, str]:
    """The file's ``specdec.acceptance`` metadata: the drafter kind its rows' features are of
    and the parts' widths (the target's hidden size, the drafter's signals); {} for rows of a
    pre-verifier."""
    if not cfg.records_acceptance:
        return {}
    from transformers import AutoConfig

    from specdec.models.drafters import DRAFTERS
    from specdec.models.sources import resolve

    kind = DRAFTERS.resolve(cfg.drafter).name
    hidden = AutoConfig.from_pretrained(resolve(cfg.target)).hidden_size
    return {ACCEPTANCE_META: json.dumps({"drafter": kind, "root_size": hidden})}


def run(cfg: SimulateConfig) -> Path:
    import mlflow

    from pipelines.common.tracking import log_params, log_plan, start_run
    from specdec.models.block_drafter import BlockDrafter
    from specdec.models.registry import resolve_model_ref
    from specdec.runtime import RuntimeConfig

    # fails fast on a bad file
    prompts = load_prompts(cfg.prompts, cfg.limit, "simulate.prompts", cfg.per_source)
    check_tokenizer(cfg.prompts, cfg.target, "simulate.prompts")
    drafter_dir = cfg.drafter if cfg.model_free else resolve_model_ref(cfg.drafter,
                                                                        cfg.mlflow.tracking_uri)
    if not cfg.model_free and not BlockDrafter.is_checkpoint(drafter_dir):
        raise FileNotFoundError(f"simulate.drafter {cfg.drafter!r} is not a block-drafter "
                                f"checkpoint, nor ngram or suffix")
    index = resolve_model_ref(cfg.suffix_index, cfg.mlflow.tracking_uri)
    with start_run(cfg.mlflow, "simulate"):
        log_params(cfg.model_dump())
        log_plan(cfg.target, RuntimeConfig(cfg.device, cfg.dtype, max_model_len=cfg.max_model_len))
        actor = {"config": cfg.model_dump(), "drafter_dir": drafter_dir, "suffix_index": index}
        table = map_prompts(prompts, Simulator, actor, cfg.actors, STEPS_SCHEMA)
        verifier = cfg.verifier.params() | {"name": cfg.verifier.name}
        meta = {"specdec.drafter": cfg.drafter, "specdec.verifier": json.dumps(verifier),
                **acceptance_meta(cfg)}
        path = write_table(table, cfg.output(), meta)
        accepted = table.column("accepted").to_pylist()
        mlflow.log_metrics({"prompts": len(prompts), "drafted_tokens": table.num_rows,
                            "acceptance_rate": sum(accepted) / max(1, len(accepted))})
    return path


def main(argv=None) -> None:
    print(run(cli_config(SimulateConfig, argv, "Simulate SD and label drafted tokens.")))


if __name__ == "__main__":
    main()
