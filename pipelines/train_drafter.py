"""Job: train the parallel block drafter (DFlash-style) with Ray Train.

Each step samples sequences from the corpus, runs the frozen target over them once to get the
tapped features (and its greedy predictions, for self-distillation labels), samples anchors per
sequence, drafts every block in one training forward and applies the selected loss (D-PACE by
default). Features are computed on the fly rather than read from a feature store: they are
n_taps x 576 floats per token for SmolLM2 (3 x 576 x 4 B = 7 KB per token, GBs for a corpus),
while recomputing them costs one no-grad target forward per step.

Runs as ``python -m pipelines.train_drafter --config configs/train/train_drafter.yaml``; Ray
Train ``TorchTrainer`` with ``ScalingConfig`` from the config (``num_workers: 0`` runs the loop
in the driver). With several workers each reads its shard of sequences and gradients are
averaged with an all-reduce.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator
from tqdm import tqdm

from pipelines import checkpoints as ckpt
from pipelines.config import (
    MlflowSettings,
    Scaling,
    Strict,
    cli_config,
    default_output,
    target_name,
)
from pipelines.corpus import SCHEMA as CORPUS_SCHEMA
from pipelines.corpus import check_tokenizer
from pipelines.tables import read_table


class LossSettings(Strict):
    name: Literal["dpace", "dpace_p", "dpace_f", "dflash"] = "dpace"
    alpha: float = Field(0.5, ge=0.0, le=1.0)  # D-PACE smoothing
    gamma: float | None = None  # DFlash decay; None: the paper's default for the block size

    def params(self) -> dict:
        return {"gamma": self.gamma} if self.name == "dflash" else {"alpha": self.alpha}


class DrafterSettings(Strict):
    block_size: int = Field(8, ge=2)
    num_layers: int = Field(1, ge=1)
    num_taps: int = Field(3, ge=1)
    init_from: str | None = None  # a block-drafter directory or models:/NAME@ALIAS
    # the N most frequent corpus tokens (EOS always included); None: the full target vocabulary
    draft_vocab_size: int | None = Field(None, ge=2)
    # start every draft layer as a copy of this target decoder layer (-1: the last); None: random
    init_layer_from_target: int | None = None


class TrainDrafterConfig(Strict):
    target: str = "smollm2-135m"
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    corpus: str  # train.parquet from pipelines.corpus
    run_dir: str | None = None  # checkpoints and outputs; default $SPECDEC_HOME/pipelines/...
    drafter: DrafterSettings = DrafterSettings()
    loss: LossSettings = LossSettings()
    labels: Literal["text", "distill"] = "distill"  # distill: the target's greedy predictions
    steps: int = Field(1000, ge=1)
    batch_size: int = Field(4, ge=1)  # sequences per step and worker
    anchors_per_sequence: int = Field(24, ge=1)
    max_seq_len: int = Field(256, ge=3)
    lr: float = 3e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = Field(100, ge=1)
    resume: bool = False  # continue from the newest checkpoint in run_dir
    fail_at_step: int | None = None  # fault injection (tests): a worker dies once at this step
    scaling: Scaling = Scaling()
    mlflow: MlflowSettings = MlflowSettings()

    def output(self) -> Path:
        return Path(self.run_dir) if self.run_dir else default_output("train_drafter")

    @model_validator(mode="after")
    def _dflash_gamma(self):
        from specdec.algorithms.losses import default_gamma

        if self.loss.name == "dflash" and self.loss.gamma is None:
            try:
                default_gamma(self.drafter.block_size)
            except ValueError as err:
                raise ValueError(f"loss.gamma must be set: {err}") from None
        return self


# ---- data ---------------------------------------------------------------------------------------

def load_sequences(cfg: TrainDrafterConfig) -> list[list[int]]:
    """Every corpus sequence of 3 or more tokens, cut to ``max_seq_len``."""
    table = read_table(cfg.corpus, CORPUS_SCHEMA, "train_drafter.corpus")
    seqs = [s[: cfg.max_seq_len] for s in table.column("input_ids").to_pylist()]
    seqs = [s for s in seqs if len(s) >= 3]
    if not seqs:
        raise ValueError(f"corpus {cfg.corpus} has no sequence of 3 or more tokens")
    return seqs


def shard(sequences: list[list[int]], rank: int, world: int) -> list[list[int]]:
    mine = sequences[rank::world]
    if not mine:
        raise ValueError(f"no corpus sequence for rank {rank} of {world}")
    return mine


# ---- models -------------------------------------------------------------------------------------

def build_models(cfg: TrainDrafterConfig, init_dir: str | None, sequences: list[list[int]]):
    """-> (target with the drafter's taps, BlockDrafter). A fresh drafter takes its reduced
    vocabulary from ``sequences`` and its layers from the target, as the config says."""
    from specdec.models.block_drafter import BlockDrafter, BlockDrafterConfig
    from specdec.models.target import TargetModel
    from specdec.training.drafter_init import copy_target_layer, frequent_tokens

    if init_dir:
        config, _ = BlockDrafter.read_config(init_dir)
        target = TargetModel.from_pretrained(cfg.target, cfg.dtype, config.tap_layers)
        return target, BlockDrafter.load(init_dir, target)
    probe = TargetModel.from_pretrained(cfg.target, cfg.dtype)
    d = cfg.drafter
    config = BlockDrafterConfig.for_target(probe, block_size=d.block_size,
                                           num_layers=d.num_layers, num_taps=d.num_taps,
                                           draft_vocab_size=d.draft_vocab_size)
    target = TargetModel(probe.model, probe.tokenizer, config.tap_layers)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        drafter = BlockDrafter.initialise(config, target, target_ref=cfg.target)
    if d.draft_vocab_size:
        # every rank sees the same vocabulary: it is counted before sharding (see train_loop)
        vocab = frequent_tokens(sequences, d.draft_vocab_size, sorted(target.eos_token_ids))
        drafter = drafter.with_vocabulary(vocab)
    if d.init_layer_from_target is not None:
        copy_target_layer(drafter.net, target, d.init_layer_from_target)
    return target, drafter


# ---- one step -----------------------------------------------------------------------------------

def make_batch(target, sequences: list[list[int]], block_size: int, anchors: int,
               labels: str, gen: torch.Generator):
    """-> (features [S, T, n*F], BlockBatch) for the sampled sequences."""
    from specdec.training.anchors import sample_anchors
    from specdec.training.block_batches import concat_blocks, distill_labels, sequence_blocks
    from specdec.training.target_features import sequence_features

    feats = sequence_features(target, sequences)
    parts = []
    for i, seq in enumerate(sequences):
        ids = torch.tensor(seq, dtype=torch.long)
        label_seq = distill_labels(ids, feats.greedy_next[i, : len(seq)]) \
            if labels == "distill" else None
        parts.append(sequence_blocks(ids, sample_anchors(len(seq), anchors, gen), block_size,
                                     label_seq))
    return feats.features, concat_blocks(parts)


def accepted_prefix(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor):
    """Greedy drafts vs labels: per-position accuracy [B] and the mean accepted prefix per block
    (sum over j >= 1 of prod_{i <= j} correct_i), an estimate of accepted length - 1."""
    correct = (logits.argmax(-1) == labels) & valid  # [N, B]
    prefix = correct[:, 1:].long().cumprod(-1).sum(-1).double().mean()
    per_pos = correct.sum(0).double() / valid.sum(0).clamp_min(1)
    return per_pos, float(prefix)


def train_step(net, parts, target, sequences, cfg, loss_fn, gen, world: int) -> dict:
    from specdec.training.drafter_forward import block_logits, draft_labels

    features, batch = make_batch(target, sequences, net.c.block_size, cfg.anchors_per_sequence,
                                 cfg.labels, gen)
    logits, _ = block_logits(net, parts, features, batch)
    labels, valid = draft_labels(net, batch.labels, batch.valid)
    loss = loss_fn(logits, labels, valid)
    loss.backward()
    if world > 1:  # average gradients across workers
        for p in net.parameters():
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
                p.grad /= world
    norm = torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
    per_pos, prefix = accepted_prefix(logits.detach(), labels, valid)
    metrics = {"loss": float(loss.detach()), "grad_norm": float(norm), "accept_len_est": 1 + prefix}
    metrics |= {f"acc_pos_{j}": float(per_pos[j]) for j in range(1, per_pos.shape[0])}
    return metrics


# ---- the Ray Train loop -------------------------------------------------------------------------

def restore(cfg: TrainDrafterConfig, run_id: str) -> Path | None:
    """The checkpoint to continue from: Ray's (after a worker failure), else the newest in the
    run directory when it belongs to this run (a restart whose last report Ray never received,
    e.g. a worker killed right after reporting) or when ``resume`` is set."""
    import ray.train

    given = ray.train.get_checkpoint()
    if given is not None:
        return Path(given.path)
    newest = ckpt.latest(cfg.output())
    if newest and (cfg.resume or ckpt.read_state(newest).get("run_id") == run_id):
        return newest
    return None


def save_checkpoint(cfg, drafter, opt, step: int, metrics: dict, rank: int, run_id: str):
    import ray.train

    if rank != 0:
        ray.train.report(metrics)
        return
    out = ckpt.step_dir(cfg.output(), step)
    drafter.save(out / "drafter")
    ckpt.save_optimizer(opt, out)
    ckpt.write_state(out, step, loss=metrics["loss"], run_id=run_id)
    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(out))


def maybe_fail(cfg: TrainDrafterConfig, step: int) -> None:
    """Fault injection, once per run directory: a worker process dies abruptly (as if killed);
    in the driver (num_workers 0) the loop raises instead, so the driver survives."""
    marker = cfg.output() / ".injected-failure"
    if cfg.fail_at_step == step and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        if cfg.scaling.num_workers > 0:
            os._exit(1)
        raise RuntimeError(f"injected failure at step {step} (fail_at_step)")


def train_loop(loop_cfg: dict) -> None:
    import mlflow
    import ray.train

    from specdec.algorithms.losses import make_loss
    from specdec.training.drafter_forward import FrozenTargetParts

    cfg = TrainDrafterConfig.model_validate(loop_cfg["config"])
    torch.set_num_threads(cfg.scaling.torch_threads)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    start_dir = restore(cfg, loop_cfg["run_id"])
    corpus = load_sequences(cfg)
    target, drafter = build_models(cfg, str(start_dir / "drafter") if start_dir
                                   else loop_cfg.get("init_dir"), corpus)
    net = drafter.net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    if start_dir:
        ckpt.load_optimizer(opt, start_dir)
        start = ckpt.read_state(start_dir)["step"]
    parts = FrozenTargetParts(target.embedding_weight(), target.lm_head_weight())
    loss_fn = make_loss(cfg.loss.name, **cfg.loss.params())
    sequences = shard(corpus, rank, world)
    client = mlflow.MlflowClient(loop_cfg["tracking_uri"]) if rank == 0 else None
    if start_dir and start >= cfg.steps:  # resumed a finished run: hand back its last checkpoint
        ray.train.report({"step": start}, checkpoint=ray.train.Checkpoint.from_directory(start_dir)
                         if rank == 0 else None)
        return
    for step in tqdm(range(start, cfg.steps), desc="train_drafter", disable=rank != 0,
                     initial=start, total=cfg.steps, mininterval=5):
        maybe_fail(cfg, step)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 101 + rank)
        pick = torch.randint(len(sequences), (cfg.batch_size,), generator=gen).tolist()
        opt.zero_grad(set_to_none=True)
        metrics = train_step(net, parts, target, [sequences[i] for i in pick], cfg, loss_fn,
                             gen, world)
        opt.step()
        metrics["step"] = step + 1
        if client is not None:
            log_step(client, loop_cfg["run_id"], metrics, step + 1)
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(cfg, drafter, opt, step + 1, metrics, rank, loop_cfg["run_id"])


def log_step(client, run_id: str, metrics: dict, step: int) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, step)
                                      for k, v in metrics.items() if k != "step"])


# ---- the driver ---------------------------------------------------------------------------------

def preflight(cfg: TrainDrafterConfig) -> str | None:
    """Every check that can fail fast, before Ray starts: config, corpus schema, tokenizer,
    init checkpoint. Returns the local directory of ``init_from`` (registry refs resolved)."""
    from specdec.models.block_drafter import BlockDrafter
    from specdec.models.registry import resolve_model_ref

    read_table(cfg.corpus, CORPUS_SCHEMA, "train_drafter.corpus")
    check_tokenizer(cfg.corpus, cfg.target, "train_drafter.corpus")
    init_dir = resolve_model_ref(cfg.drafter.init_from, cfg.mlflow.tracking_uri)
    if init_dir and not BlockDrafter.is_checkpoint(init_dir):
        raise FileNotFoundError(f"drafter.init_from {cfg.drafter.init_from!r} is not a "
                                f"block-drafter checkpoint")
    return init_dir


def fit(cfg: TrainDrafterConfig, run, init_dir: str | None, tracking: str):
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    s = cfg.scaling
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"config": cfg.model_dump(), "run_id": run.info.run_id,
                           "tracking_uri": tracking, "init_dir": init_dir},
        scaling_config=ScalingConfig(num_workers=s.num_workers, use_gpu=s.use_gpu,
                                     resources_per_worker={"CPU": s.cpus_per_worker}),
        run_config=RunConfig(name=f"train_drafter-{run.info.run_id[:8]}",
                             storage_path=str((cfg.output() / "ray").absolute()),
                             failure_config=FailureConfig(max_failures=s.max_failures)),
    )
    return trainer.fit()


def run(cfg: TrainDrafterConfig) -> dict:
    """Train, log to MLflow, register. Returns {"drafter": dir, "model_uri": ..., "run_id"}."""
    import mlflow

    from pipelines.plots import loss_figure
    from pipelines.tracking import log_figure, log_params, register, start_run, tracking_uri

    init_dir = preflight(cfg)
    with start_run(cfg.mlflow, "train_drafter") as run_:
        log_params(cfg.model_dump())
        result = fit(cfg, run_, init_dir, tracking_uri(cfg.mlflow))
        if result.error:
            raise result.error
        final = cfg.output() / f"drafter-{run_.info.run_id[:8]}"
        with result.checkpoint.as_directory() as done:
            shutil.copytree(Path(done) / "drafter", final, dirs_exist_ok=True)
        mlflow.log_artifacts(str(final), artifact_path="drafter")
        history = mlflow.MlflowClient().get_metric_history(run_.info.run_id, "loss")
        log_figure(loss_figure(history, f"block drafter ({cfg.loss.name})"), "loss")
        uri = register(cfg.mlflow, f"{target_name(cfg.target)}-block-drafter", run_, "drafter")
    return {"drafter": str(final), "model_uri": uri, "run_id": run_.info.run_id,
            "metrics": result.metrics}


def main(argv=None) -> None:
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    out = run(cli_config(TrainDrafterConfig, argv, "Train the block drafter (Ray Train)."))
    print(f"drafter: {out['drafter']}\nregistered: {out['model_uri']}\nrun: {out['run_id']}")


if __name__ == "__main__":
    main()
