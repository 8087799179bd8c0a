"""Stage (c) of the GPU check, with the time left: ``responses`` (the target answers the train
prompts greedily, batched, for a share of the time left: a corpus), ``drafter``
(``pipelines.train_drafter.run_offline`` trains a fresh drafter shaped like the committed one on
them, its steps fitted to the time left) and ``compare`` (both drafters' mean accepted length,
fixed window of a block, strict greedy, on the benchmark prompts). Not a training run of record:
the numbers say what a GPU minute buys.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from bench.gpu_check import prompts
from bench.gpu_check.report import Context
from bench.gpu_check.tiny import corpus_file


def committed_drafter(ctx: Context) -> str:
    if ctx.args.tiny:
        return ctx.keep["tiny"]["block-drafter"]
    return str(Path(ctx.args.committed) / "drafter")


def responses(ctx: Context) -> dict:
    """The train prompts answered as ``pipelines.responses`` answers them on transformers."""
    from pipelines.responses import generate_greedy
    from specdec.models.target import TargetModel

    path, a = ctx.keep["target"], ctx.args
    target = TargetModel.from_pretrained(path, "float32", device=a.device, backend="transformers")
    todo = prompts.token_ids(target.tokenizer, prompts.load(a.prompts)["train"])
    stop_at = time.monotonic() + a.response_share * ctx.left_s()
    rows, start = [], time.monotonic()
    for at in range(0, len(todo), a.response_batch):
        if time.monotonic() > stop_at:
            break
        batch = todo[at: at + a.response_batch]
        rows += zip(batch, generate_greedy(target, batch, a.response_tokens), strict=True)
    seconds = time.monotonic() - start
    made = sum(len(r) for _, r in rows)
    ctx.keep["corpus"] = corpus_file(ctx, path, rows, "responses.parquet")
    return {"responses": len(rows), "of": len(todo), "tokens": made,
            "seconds": round(seconds, 1), "tokens_per_s": round(made / max(seconds, 1e-9), 1)}


def drafter(ctx: Context) -> dict:
    from pipelines.train_drafter import TrainDrafterConfig, run_offline
    from specdec.models.block_drafter import BlockDrafter

    a = ctx.args
    shape, _ = BlockDrafter.read_config(committed_drafter(ctx))
    cfg = TrainDrafterConfig.model_validate({
        "target": ctx.keep["target"], "corpus": ctx.keep["corpus"],
        "run_dir": str(ctx.out / "train-drafter"), "anchors": "response",
        "steps": a.train_steps, "batch_size": a.train_batch, "max_seq_len": a.train_seq_len,
        "checkpoint_every": a.train_steps, "eval_every": a.train_steps,
        "drafter": {"block_size": shape.block_size, "num_layers": shape.num_layers,
                    "num_taps": len(shape.tap_layers),
                    "draft_vocab_size": shape.draft_vocab_size},
        "scaling": {"torch_threads": torch.get_num_threads()}})
    minutes = max(0.0, ctx.left_s() - a.compare_s) / 60
    done = run_offline(cfg, minutes)
    ctx.keep["trained"] = str(Path(done["checkpoint"]) / "drafter")
    return {"minutes": round(minutes, 2), **done}


def compare(ctx: Context) -> dict:
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_pair
    from specdec.engine.settings import GenerationParams, SpecSettings

    out = {}
    for name, ref in (("trained", ctx.keep["trained"]), ("committed", committed_drafter(ctx))):
        pair = load_pair(ctx.keep["target"], ref, dtype="float32", device=ctx.args.device)
        engine = Engine(pair.target, pair.drafter)
        params = GenerationParams(max_new_tokens=ctx.args.max_new_tokens, spec=SpecSettings(
            "fixed", gamma=pair.drafter.max_draft_len))
        bench = prompts.token_ids(pair.target.tokenizer,
                                  prompts.load(ctx.args.prompts)["benchmark"])
        stats = [engine.generate(ids, params).stats
                 for ids in bench[: ctx.args.benchmark_prompts]]
        out[name] = {"drafter": ref, "gamma": pair.drafter.max_draft_len,
                     "mean_accepted_length": round(sum(s.committed for s in stats)
                                                   / max(1, sum(s.rounds for s in stats)), 3)}
    out["trained_vs_committed"] = round(out["trained"]["mean_accepted_length"]
                                        / out["committed"]["mean_accepted_length"], 3)
    return out
