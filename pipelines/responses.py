"""Job: the target's own greedy responses to the training prompts, as a corpus (Parquet).

A drafter is only useful on the text its target generates. Trained on human replies (ShareGPT's
``gpt`` turns), even with self-distilled labels, block position j >= 2 learns the target's
prediction after a *human* token, a chain the target never produces when it decodes; measured
on the first default pair: in-training accepted-length estimate 1.86, real generations 1.26
(docs/DRAFTER-NOTES.md). This job replaces each response by the target's greedy continuation
of the prompt, so training text and labels are exactly what speculative decoding will verify.

Output: the corpus schema (``pipelines.common.formats.CORPUS_SCHEMA``), ``input_ids`` =
prompt + greedy response (EOS kept, the drafter should learn to predict it), the same ids and splits as the
input; ``train_drafter`` reads it as its ``corpus`` (use ``anchors: response``).

Generation runs in a pool of target-holding Ray actors over a Ray Dataset of prompts
(``pipelines.common.pools``), on GPUs when ``actors.num_gpus > 0``, batched with left padding, shortest
prompts first so a batch pads little. Runs as
``python -m pipelines.responses --config configs/train/responses.yaml`` (logs to MLflow), or with
``--offline`` in this process alone, on the GPU when torch sees one, with no Ray or MLflow (a
bare GPU machine, ``pipelines/train_default_gpu.sh``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Literal

import pyarrow as pa
import torch
from pydantic import Field, model_validator
from tqdm import tqdm

from pipelines.common.config import MlflowSettings, Strict, default_output, load_config
from pipelines.common.formats import CORPUS_SCHEMA, check_tokenizer, tokenizer_fingerprint
from pipelines.common.pools import ActorSettings, map_prompts
from pipelines.common.tables import read_table, write_table


class ResponsesConfig(Strict):
    target: str = "smollm2-135m"
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    corpus: str  # input: a corpus Parquet (its prompts are used, its responses dropped)
    out: str | None = None  # default $SPECDEC_HOME/pipelines/responses/train.parquet
    max_prompt_tokens: int = Field(256, ge=1)  # longer prompts are skipped
    max_new_tokens: int = Field(192, ge=1)
    # positions a request's KV slot holds (the target's plan); None: the prompt and answer limits
    max_model_len: int | None = Field(None, ge=1)
    limit: int | None = Field(None, ge=1)  # the first N prompts (by corpus order)
    # a pool of target-holding actors (on the GPU when num_gpus > 0); batch_size = prompts per
    # generate call. Offline runs use the GPU when torch sees one.
    actors: ActorSettings = ActorSettings(batch_size=64)
    mlflow: MlflowSettings = MlflowSettings()

    def output(self) -> Path:
        return Path(self.out) if self.out else default_output("responses") / "train.parquet"

    @model_validator(mode="after")
    def _context(self):
        if self.max_model_len is not None and \
                self.max_model_len < self.max_prompt_tokens + self.max_new_tokens:
            raise ValueError(f"max_model_len {self.max_model_len} is below max_prompt_tokens + "
                             f"max_new_tokens ({self.max_prompt_tokens + self.max_new_tokens})")
        return self

    @property
    def context(self) -> int:
        """The target's max_model_len: the config's, else the longest prompt and answer."""
        return self.max_model_len or self.max_prompt_tokens + self.max_new_tokens


def cut_at_eos(tokens: list[int], eos: frozenset[int], pad: int) -> list[int]:
    """A generated row -> the response: up to and including the first EOS; trailing pads (which
    ``generate`` appends after a finished row) dropped when no EOS came."""
    for i, tok in enumerate(tokens):
        if tok in eos:
            return tokens[: i + 1]
    while tokens and tokens[-1] == pad:
        tokens = tokens[:-1]
    return tokens


def left_pad(prompts: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def greedy_responses(target, prompts: list[list[int]], max_new_tokens: int, batch_size: int,
                     progress: bool = True) -> list[list[int]]:
    """The target's greedy continuation of every prompt (``target``: a ``TargetModel``), in the
    order given; batches are formed over prompts sorted by length. On the runtime backend a
    batch is one ragged pass per step (no padding); on transformers, ``generate`` over a
    left-padded batch."""
    batch = runtime_greedy if target.backend == "runtime" else generate_greedy
    if target.runtime is not None:
        batch_size = min(batch_size, target.runtime.pool.slots)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    bar = tqdm(total=len(prompts), desc="responses", disable=not progress, mininterval=5)
    for at in range(0, len(order), batch_size):
        rows = order[at: at + batch_size]
        for row, tokens in zip(rows, batch(target, [prompts[i] for i in rows], max_new_tokens),
                               strict=True):
            out[row] = tokens
        bar.update(len(rows))
    bar.close()
    return out


def runtime_greedy(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of a batch on the runtime: one ragged prefill, then one pass a step over
    the rows still running (a row stops at EOS, at ``max_new_tokens`` or at the context's end)."""
    eos = target.eos_token_ids
    states = [target.new_state() for _ in prompts]
    try:
        firsts = target.forward_batch(states, prompts, last_logits_only=True)
        out = [[int(o.logits[-1].argmax())] for o in firsts]  # argmax: the first maximum on ties
        while live := [i for i, toks in enumerate(out) if toks[-1] not in eos
                       and len(toks) < max_new_tokens and states[i].length < target.max_length]:
            steps = target.forward_batch([states[i] for i in live], [[out[i][-1]] for i in live])
            for i, step in zip(live, steps, strict=True):
                out[i].append(int(step.logits[-1].argmax()))
    finally:
        for state in states:
            target.release(state)
    return out


def generate_greedy(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of a batch with transformers ``generate`` (left padding)."""
    eos = target.eos_token_ids
    pad = target.tokenizer.pad_token_id
    pad = pad if pad is not None else min(eos, default=0)
    ids, mask = left_pad(prompts, pad, target.device)
    gen = target.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                max_new_tokens=max_new_tokens, pad_token_id=pad,
                                eos_token_id=sorted(eos) or None, top_p=None, top_k=None,
                                temperature=None)
    return [cut_at_eos(tokens, eos, pad) for tokens in gen[:, ids.shape[1]:].tolist()]


class Responder:
    """A Ray Data callable class: holds the target, answers each batch of prompts greedily.
    Past ``deadline`` (epoch seconds) a batch is dropped rather than answered."""

    def __init__(self, config: dict, device: str, deadline: float | None = None):
        from specdec.models.target import TargetModel

        self.cfg = ResponsesConfig.model_validate(config)
        torch.set_num_threads(self.cfg.actors.torch_threads)
        self.target = TargetModel.from_pretrained(self.cfg.target, self.cfg.dtype, device=device,
                                                  pool_size=self.cfg.actors.batch_size,
                                                  max_model_len=self.cfg.context)
        self.deadline = deadline

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.deadline is not None and time.time() > self.deadline:
            return CORPUS_SCHEMA.empty_table()
        rows = batch.to_pylist()
        answers = greedy_responses(self.target, [r["prompt_ids"] for r in rows],
                                   self.cfg.max_new_tokens, len(rows), progress=False)
        out = [r | {"input_ids": list(r["prompt_ids"]) + a} for r, a in
               zip(rows, answers, strict=True)]
        return pa.Table.from_pylist(out, schema=CORPUS_SCHEMA)


def load_prompts(cfg: ResponsesConfig) -> list[dict]:
    """The prompts to answer, shortest first (a generate batch then pads little)."""
    table = read_table(cfg.corpus, CORPUS_SCHEMA, "responses.corpus")
    rows = [r for r in table.to_pylist() if r["prompt_len"] <= cfg.max_prompt_tokens]
    rows = rows[: cfg.limit] if cfg.limit else rows
    if not rows:
        raise ValueError(f"{cfg.corpus} has no prompt of at most {cfg.max_prompt_tokens} tokens")
    return sorted(rows, key=lambda r: r["prompt_len"])


def build(cfg: ResponsesConfig, rows: list[dict], offline: bool = False,
          minutes: float | None = None) -> tuple[pa.Table, dict]:
    """``rows`` (from ``load_prompts``) -> (the responses corpus, its numbers). Offline: in this
    process (GPU if any), batch by batch; else a pool of ``Responder`` actors over a Ray
    Dataset. With ``minutes``, no batch starts after that time (the first one always runs)."""
    from specdec.models.sources import parse_device

    started = time.time()
    deadline = started + minutes * 60 if minutes is not None else None
    size = cfg.actors.batch_size
    if offline:
        responder = Responder(cfg.model_dump(), str(parse_device("auto")))
        parts = []
        for at in tqdm(range(0, len(rows), size), desc="responses", mininterval=5):
            batch = pa.Table.from_pylist(rows[at: at + size], schema=CORPUS_SCHEMA)
            parts.append(responder(batch))
            responder.deadline = deadline
        table, device = pa.concat_tables(parts), str(responder.target.device)
    else:
        device = "cuda" if cfg.actors.num_gpus > 0 else "cpu"
        table = map_prompts(rows, Responder, {"config": cfg.model_dump(), "device": device,
                                              "deadline": deadline}, cfg.actors, CORPUS_SCHEMA)
    seconds = time.time() - started
    new = sum(len(r) - p for r, p in zip(table.column("input_ids").to_pylist(),
                                         table.column("prompt_len").to_pylist(), strict=True))
    stats = {"rows": table.num_rows, "skipped_for_time": len(rows) - table.num_rows,
             "new_tokens": new, "seconds": round(seconds, 1),
             "tokens_per_s": round(new / max(seconds, 1e-9), 1), "device": device}
    return table, stats


def metadata_for(cfg: ResponsesConfig) -> dict[str, str]:
    from transformers import AutoTokenizer

    from specdec.models.sources import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve(cfg.target))
    return {"specdec.target": cfg.target, "specdec.vocab_size": str(len(tokenizer)),
            "specdec.tokenizer": tokenizer_fingerprint(tokenizer),
            "specdec.responses": "target-greedy", "specdec.max_new_tokens": str(cfg.max_new_tokens)}


def run(cfg: ResponsesConfig, offline: bool = False, minutes: float | None = None) -> dict:
    """Generate, write the Parquet; log params and numbers to MLflow unless ``offline``."""
    rows = load_prompts(cfg)  # a bad file or an empty selection fails before any model loads
    check_tokenizer(cfg.corpus, cfg.target, "responses.corpus")
    if offline:
        table, stats = build(cfg, rows, offline=True, minutes=minutes)
    else:
        import mlflow

        from pipelines.common.tracking import log_params, log_plan, start_run
        from specdec.runtime import RuntimeConfig

        with start_run(cfg.mlflow, "responses"):
            log_params(cfg.model_dump())
            log_plan(cfg.target, RuntimeConfig("cuda" if cfg.actors.num_gpus > 0 else "cpu",
                                               cfg.dtype, max_model_len=cfg.context,
                                               slots=cfg.actors.batch_size))
            table, stats = build(cfg, rows, minutes=minutes)
            mlflow.log_metrics({k: v for k, v in stats.items() if isinstance(v, int | float)})
    write_table(table, cfg.output(), metadata_for(cfg))
    return {"path": str(cfg.output()), **stats}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="The target's greedy responses (Parquet).")
    parser.add_argument("--config", required=True, help="YAML file for this job")
    parser.add_argument("--offline", action="store_true", help="no MLflow (a bare GPU box)")
    parser.add_argument("--minutes", type=float, help="start no batch after this time")
    args = parser.parse_args(argv)
    out = run(load_config(ResponsesConfig, args.config), offline=args.offline,
              minutes=args.minutes)
    print("\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
