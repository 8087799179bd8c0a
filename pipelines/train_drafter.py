"""Job: train the parallel block drafter (DFlash-style) with Ray Train.

Each step samples sequences from the corpus, runs the frozen target over them once to get the
tapped features (and its greedy predictions, for self-distillation labels), samples anchors per
sequence, drafts every block in one training forward and applies the selected loss (D-PACE by
default). Features are computed on the fly rather than read from a feature store: they are
n_taps x 576 floats per token for SmolLM2 (3 x 576 x 4 B = 7 KB per token, GBs for a corpus),
while recomputing them costs one no-grad target forward per step.

Runs as ``python -m pipelines.train_drafter --config configs/train/train_drafter.yaml``; Ray
Train ``TorchTrainer`` with ``ScalingConfig`` from the config (``num_workers: 0`` runs the loop
in the driver). Ray Data reads the corpus; its rows fall into ``data_shards`` shards by id
(``pipelines.common.shards``) and each worker receives only its own shards' rows. A step's
global batch of ``batch_size`` sequences is drawn the same on every worker, each slot from one
shard, and each worker computes the slots of its shards (``pipelines.common.global_batch``);
the gradients, normalised by the global batch's loss normaliser, are summed with an all-reduce,
so W workers train what one worker trains with the same ``batch_size`` and ``data_shards``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, NamedTuple

import pyarrow as pa
import torch
from pydantic import Field, model_validator
from tqdm import tqdm

from pipelines.common import checkpoints as ckpt
from pipelines.common.config import (
    MlflowSettings,
    Scaling,
    Strict,
    TrainJob,
    load_config,
    target_name,
)
from pipelines.common.faults import maybe_fail
from pipelines.common.formats import CORPUS_SCHEMA, check_tokenizer
from pipelines.common.global_batch import global_sum, shard_draws, step_generator, worker_slots
from pipelines.common.shards import SHARD, OwnedShards, held_rows, only, owned, with_shards
from pipelines.common.tables import read_dataset, read_table
from specdec.algorithms.losses import LOSSES


class LossSettings(Strict):
    name: Literal[LOSSES.names()] = "dpace"  # type: ignore[valid-type]  # a LOSSES name
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


class TrainDrafterConfig(TrainJob):
    JOB: ClassVar[str] = "train_drafter"

    target: str = "smollm2-135m"
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    corpus: str  # train.parquet from pipelines.corpus
    run_dir: str | None = None  # checkpoints and outputs; default $SPECDEC_HOME/pipelines/...
    drafter: DrafterSettings = DrafterSettings()
    loss: LossSettings = LossSettings()
    labels: Literal["text", "distill"] = "distill"  # distill: the target's greedy predictions
    # all: anchors anywhere; response: from the first response token on, as at inference (for a
    # corpus of the target's own responses, pipelines.responses)
    anchors: Literal["all", "response"] = "all"
    steps: int = Field(1000, ge=1)
    # sequences kept out of training (a seeded choice): every eval_every steps the drafter's
    # accepted-length estimate on them, the honest one (on training text it counts memorisation)
    heldout_sequences: int = Field(0, ge=0)
    eval_every: int = Field(100, ge=1)
    batch_size: int = Field(4, ge=1)  # sequences per step, over all workers (split evenly)
    anchors_per_sequence: int = Field(24, ge=1)
    max_seq_len: int = Field(256, ge=3)
    lr: float = 3e-4
    warmup_steps: int = Field(0, ge=0)  # linear warm-up from 0
    lr_schedule: Literal["constant", "cosine"] = "constant"  # cosine: down to lr / 10 at the end
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = Field(100, ge=1)
    resume: bool = False  # continue from the newest checkpoint in run_dir
    fail_at_step: int | None = None  # fault injection (tests): the last worker dies once here
    scaling: Scaling = Scaling()
    mlflow: MlflowSettings = MlflowSettings()

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

class Text(NamedTuple):
    """A training sequence and its first usable anchor (1, or the first response token)."""

    ids: list[int]
    first_anchor: int


ROWS = pa.schema([CORPUS_SCHEMA.field(n) for n in ("id", "input_ids", "prompt_len")])
SHARDED = ROWS.append(pa.field(SHARD, pa.int32()))  # the training rows a worker receives


@dataclass(frozen=True)
class Data:
    """One worker's training texts by shard (``pipelines.common.shards``), and the held-out ones."""

    shards: dict[int, list[Text]]
    heldout: list[Text]


def texts_of(table: pa.Table, cfg: TrainDrafterConfig) -> list[Text]:
    """The usable rows of ``table`` (``usable``) as texts cut to ``max_seq_len``, by id."""
    return [t for t in cut_texts(table.sort_by("id"), cfg) if usable(t)]


def cut_texts(table: pa.Table, cfg: TrainDrafterConfig) -> list[Text]:
    """Every row of ``table`` as a text cut to ``max_seq_len``, in the table's order."""
    starts = table.column("prompt_len").to_pylist()
    return [Text(ids[: cfg.max_seq_len], max(1, starts[i]) if cfg.anchors == "response" else 1)
            for i, ids in enumerate(table.column("input_ids").to_pylist())]


def usable(text: Text) -> bool:
    """Whether ``text`` has an anchor with a label after it."""
    return len(text.ids) - text.first_anchor >= 2


def heldout_ids(table: pa.Table, cfg: TrainDrafterConfig) -> set[str]:
    """The ids of the ``heldout_sequences`` usable rows kept out of training: the first by a
    hash of the seed and the id, so the choice depends on neither the file's order nor the
    workers."""
    ids = [i for i, t in zip(table.column("id").to_pylist(), cut_texts(table, cfg), strict=True)
           if usable(t)]
    if not ids:
        raise ValueError(f"corpus {cfg.corpus} has no sequence with an anchor and a label after "
                         f"it (anchors: {cfg.anchors}, max_seq_len: {cfg.max_seq_len})")
    n = cfg.heldout_sequences
    if n >= len(ids):
        raise ValueError(f"heldout_sequences {n} leaves no training sequence of {len(ids)}")
    return set(sorted(ids, key=lambda i: hashlib.sha1(f"{cfg.seed}:{i}".encode()).digest())[:n])


def split_rows(table: pa.Table, held: set[str], keep_held: bool) -> pa.Table:
    """The rows of ``table`` held out (``keep_held``) or trained on."""
    return table.filter(pa.array([(i in held) == keep_held for i in table.column("id").to_pylist()]))


def local_data(cfg: TrainDrafterConfig) -> Data:
    """Every shard, read here: one process trains on all of them (offline runs)."""
    table = read_table(cfg.corpus, CORPUS_SCHEMA, "train_drafter.corpus").select(ROWS.names)
    held = heldout_ids(table, cfg)
    train = with_shards(split_rows(table, held, False), "id", cfg.shards())
    return Data({s: texts_of(only(train, range(s, s + 1)), cfg) for s in range(cfg.shards())},
                texts_of(split_rows(table, held, True), cfg))


def worker_data(cfg: TrainDrafterConfig, rank: int, world: int) -> Data:
    """A Ray Train worker's shards, and every held-out text, as Ray Data hands them to it."""
    train = held_rows("train", SHARDED)
    return Data({s: texts_of(only(train, range(s, s + 1)), cfg)
                 for s in owned(rank, world, cfg.shards())},
                texts_of(held_rows("heldout", ROWS), cfg))


def datasets(cfg: TrainDrafterConfig, held: set[str]) -> dict:
    """The trainer's Ray datasets: ``train`` with each row's shard (each worker receives its own
    shards': ``OwnedShards``), and ``heldout``, which every worker receives whole."""
    rows = read_dataset(cfg.corpus).select_columns(ROWS.names)
    train = rows.map_batches(split_rows, fn_kwargs={"held": held, "keep_held": False},
                             batch_format="pyarrow")
    return {"train": train.map_batches(with_shards, fn_kwargs={"key": "id", "shards": cfg.shards()},
                                       batch_format="pyarrow"),
            "heldout": rows.map_batches(split_rows, fn_kwargs={"held": held, "keep_held": True},
                                        batch_format="pyarrow")}


# ---- models -------------------------------------------------------------------------------------

def build_models(cfg: TrainDrafterConfig, init_dir: str | None, data: Data, device="cpu",
                 world: int = 1):
    """-> (target with the drafter's taps, BlockDrafter), both on ``device``. A fresh drafter
    takes its reduced vocabulary from the label region of the training texts (their counts
    summed over the ``world`` workers' shards) and its layers from the target, as the config
    says."""
    from specdec.models.block_drafter import BlockDrafter, BlockDrafterConfig
    from specdec.models.target import TargetModel
    from specdec.training.drafter_init import copy_target_layer, frequent_tokens, token_counts

    if init_dir:
        config, _ = BlockDrafter.read_config(init_dir)
        target = TargetModel.from_pretrained(cfg.target, cfg.dtype, config.tap_layers, device,
                                             max_model_len=cfg.max_seq_len)
        return target, BlockDrafter.load(init_dir, target)
    probe = TargetModel.from_pretrained(cfg.target, cfg.dtype, device=device,
                                        max_model_len=cfg.max_seq_len)
    d = cfg.drafter
    config = BlockDrafterConfig.for_target(probe, block_size=d.block_size,
                                           num_layers=d.num_layers, num_taps=d.num_taps,
                                           draft_vocab_size=d.draft_vocab_size)
    target = TargetModel(probe.model, probe.tokenizer, config.tap_layers)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        drafter = BlockDrafter.initialise(config, target, target_ref=cfg.target)
    if d.draft_vocab_size:
        mine = token_counts(t.ids[t.first_anchor:] for texts in data.shards.values()
                            for t in texts)
        counts = torch.zeros(target.vocab_size, dtype=torch.float64)
        counts[list(mine)] = torch.tensor(list(mine.values()), dtype=torch.float64)
        counts = global_sum(counts, world)  # every rank: the same counts, the same vocabulary
        vocab = frequent_tokens({t: c for t, c in enumerate(counts.tolist()) if c},
                                d.draft_vocab_size, sorted(target.eos_token_ids))
        drafter = drafter.with_vocabulary(vocab)
    if d.init_layer_from_target is not None:
        copy_target_layer(drafter.net, target, d.init_layer_from_target)
    return target, drafter


# ---- one step -----------------------------------------------------------------------------------

def make_batch(target, sequences: list[Text], block_size: int, anchors: int,
               labels: str, gen: torch.Generator | list[torch.Generator]):
    """-> (features [S, T, n*F], BlockBatch) for the sampled sequences, on the target's device.
    ``gen`` draws the anchors: one generator for all sequences, or one per sequence."""
    from specdec.training.anchors import sample_anchors
    from specdec.training.block_batches import concat_blocks, distill_labels, sequence_blocks
    from specdec.training.target_features import sequence_features

    feats = sequence_features(target, [t.ids for t in sequences])
    greedy = feats.greedy_next.cpu() if labels == "distill" else None
    gens = gen if isinstance(gen, list) else [gen] * len(sequences)
    parts = []
    for i, (seq, first) in enumerate(sequences):
        ids = torch.tensor(seq, dtype=torch.long)
        label_seq = distill_labels(ids, greedy[i, : len(seq)]) if greedy is not None else None
        parts.append(sequence_blocks(ids, sample_anchors(len(seq), anchors, gens[i], first),
                                     block_size, label_seq))
    return feats.features, concat_blocks(parts).to(target.device)


def accepted_prefix(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor):
    """Greedy drafts vs labels: per-position accuracy [B] and the mean accepted prefix per block
    (sum over j >= 1 of prod_{i <= j} correct_i), an estimate of accepted length - 1."""
    correct = (logits.argmax(-1) == labels) & valid  # [N, B]
    prefix = correct[:, 1:].long().cumprod(-1).sum(-1).double().mean()
    per_pos = correct.sum(0).double() / valid.sum(0).clamp_min(1)
    return per_pos, float(prefix)


def loss_normaliser(loss: LossSettings, valid: torch.Tensor) -> torch.Tensor:
    """What the loss divides its sum over blocks by on a batch with mask ``valid`` [N, B]:
    D-PACE the number of blocks N, DFlash its decay weights summed over the valid positions
    (the anchor column off); see ``specdec.algorithms.losses``."""
    from specdec.algorithms.losses import default_gamma, dflash_weights

    if loss.name != "dflash":
        return torch.tensor(float(valid.shape[0]), dtype=torch.float64)
    width = valid.shape[1]
    w = dflash_weights(width, gamma=loss.gamma or default_gamma(width)).double()  # [B]
    return (w[1:] * (valid[:, 1:] != 0).double().cpu()).sum()


def train_step(net, parts, target, sequences, cfg, loss_fn, gen, world: int) -> dict:
    """Forward and backward of this worker's ``sequences``; with ``world`` > 1 the loss is
    rescaled to this worker's share of the global batch's normaliser and the gradients are
    summed over the workers, so they are those of the global batch's loss."""
    from specdec.training.drafter_forward import block_logits, draft_labels

    features, batch = make_batch(target, sequences, net.c.block_size, cfg.anchors_per_sequence,
                                 cfg.labels, gen)
    logits, _ = block_logits(net, parts, features, batch)
    labels, valid = draft_labels(net, batch.labels, batch.valid)
    loss = loss_fn(logits, labels, valid)
    if world > 1:
        # loss = sum / n_r; the global loss is sum_r sum_r' / sum_r n_r = sum_r loss_r * share_r
        share = loss_normaliser(cfg.loss, valid) / global_sum(loss_normaliser(cfg.loss, valid),
                                                              world)
        loss = loss * share.to(loss.dtype).to(loss.device)
    loss.backward()
    if world > 1:  # sum this worker's share of the gradient over the workers
        for p in net.parameters():
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
    norm = torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
    per_pos, prefix = accepted_prefix(logits.detach(), labels, valid)
    metrics = {"loss": float(global_sum(loss.detach(), world)), "grad_norm": float(norm),
               "accept_len_est": 1 + prefix}
    metrics |= {f"acc_pos_{j}": float(per_pos[j]) for j in range(1, per_pos.shape[0])}
    return metrics


# ---- the loop, shared by Ray Train workers and offline runs ------------------------------------

def lr_at(cfg: TrainDrafterConfig, step: int, total: int) -> float:
    """The learning rate of 0-based ``step`` of ``total``: linear warm-up, then constant or a
    cosine down to lr / 10. Stateless, so a resumed run continues the same schedule."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    done = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * done)))


@dataclass
class Loop:
    """Everything one worker's steps need (``data``: its shards' texts, from which it computes
    its slots of each step's global batch, and the held-out texts)."""

    cfg: TrainDrafterConfig
    target: object
    drafter: object
    opt: torch.optim.Optimizer
    parts: object
    loss_fn: object
    data: Data
    start: int
    rank: int = 0
    world: int = 1


def setup(cfg: TrainDrafterConfig, start_dir: Path | None, init_dir: str | None,
          rank: int, world: int, device: torch.device, data: Data | None = None) -> Loop:
    """One worker's loop on ``data`` (None: every shard, read in this process)."""
    from specdec.algorithms.losses import make_loss
    from specdec.training.drafter_forward import FrozenTargetParts

    torch.set_num_threads(cfg.scaling.torch_threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # training only; serving is unaffected
    data = data or local_data(cfg)
    target, drafter = build_models(cfg, str(start_dir / "drafter") if start_dir else init_dir,
                                   data, device, world)
    opt = torch.optim.AdamW(drafter.net.train().parameters(), lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    start = ckpt.read_state(start_dir)["step"] if start_dir else 0
    if start_dir and start < cfg.steps:  # a finished run is only handed back: no optimiser
        ckpt.load_optimizer(opt, start_dir)
    parts = FrozenTargetParts(target.embedding_weight(), target.lm_head_weight())
    return Loop(cfg, target, drafter, opt, parts, make_loss(cfg.loss.name, **cfg.loss.params()),
                data, start, rank, world)


@torch.no_grad()
def heldout_metrics(loop: Loop) -> dict:
    """Accepted-length estimate and position-1 accuracy on the held-out texts (fixed anchors),
    in chunks of ``batch_size`` texts; {} without held-out texts."""
    from specdec.training.drafter_forward import block_logits, draft_labels

    cfg, net = loop.cfg, loop.drafter.net
    prefix_sum, first_ok, blocks = 0.0, 0.0, 0
    heldout = loop.data.heldout
    for at in range(0, len(heldout), cfg.batch_size):
        features, batch = make_batch(loop.target, heldout[at: at + cfg.batch_size],
                                     net.c.block_size, cfg.anchors_per_sequence, cfg.labels,
                                     torch.Generator().manual_seed(cfg.seed + at))
        logits, _ = block_logits(net, loop.parts, features, batch)
        labels, valid = draft_labels(net, batch.labels, batch.valid)
        per_pos, prefix = accepted_prefix(logits, labels, valid)
        prefix_sum += prefix * batch.num_blocks
        first_ok += float(per_pos[1]) * batch.num_blocks
        blocks += batch.num_blocks
    if not blocks:
        return {}
    return {"heldout_accept_len_est": 1 + prefix_sum / blocks,
            "heldout_acc_pos_1": first_ok / blocks}


def one_step(loop: Loop, step: int, total: int) -> dict:
    cfg = loop.cfg
    slots = worker_slots(cfg.batch_size, loop.rank, loop.world)
    draws = shard_draws(cfg.seed, step, cfg.shards(),
                        {s: len(texts) for s, texts in loop.data.shards.items()},
                        cfg.batch_size, slots)
    gens = [step_generator(cfg.seed, step, slot + 1) for slot in slots]  # each slot's anchors
    lr = lr_at(cfg, step, total)
    for group in loop.opt.param_groups:
        group["lr"] = lr
    loop.opt.zero_grad(set_to_none=True)
    metrics = train_step(loop.drafter.net, loop.parts, loop.target,
                         [loop.data.shards[s][i] for s, i in draws], cfg, loop.loss_fn, gens,
                         loop.world)
    loop.opt.step()
    if (step + 1) % cfg.eval_every == 0 or step + 1 == total:
        metrics |= heldout_metrics(loop)
    return metrics | {"step": step + 1, "lr": lr}


def write_checkpoint(loop: Loop, step: int, metrics: dict, run_id: str) -> Path:
    out = ckpt.step_dir(loop.cfg.output(), step)
    loop.drafter.save(out / "drafter")
    ckpt.save_optimizer(loop.opt, out)
    ckpt.write_state(out, step, loss=metrics["loss"], run_id=run_id)
    return out


# ---- the Ray Train loop -------------------------------------------------------------------------

def train_loop(loop_cfg: dict) -> None:
    import mlflow
    import ray.train
    from ray.train.torch import get_device

    cfg = TrainDrafterConfig.model_validate(loop_cfg["config"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = get_device() if cfg.scaling.use_gpu else torch.device("cpu")
    start_dir = ckpt.restore(cfg.output(), loop_cfg["run_id"], cfg.resume)
    # num_workers 0: the driver holds every shard and reads them itself (``setup``)
    loop = setup(cfg, start_dir, loop_cfg.get("init_dir"), rank, world, device,
                 worker_data(cfg, rank, world) if cfg.scaling.num_workers > 0 else None)
    client = mlflow.MlflowClient(loop_cfg["tracking_uri"]) if rank == 0 else None
    if start_dir and loop.start >= cfg.steps:  # resumed a finished run: hand back its checkpoint
        ray.train.report({"step": loop.start}, checkpoint=ray.train.Checkpoint.from_directory(
            start_dir) if rank == 0 else None)
        return
    for step in tqdm(range(loop.start, cfg.steps), desc="train_drafter", disable=rank != 0,
                     initial=loop.start, total=cfg.steps, mininterval=5):
        maybe_fail(cfg.output(), cfg.fail_at_step, step, rank, world, cfg.scaling.num_workers > 0)
        metrics = one_step(loop, step, cfg.steps)
        if client is not None:
            log_step(client, loop_cfg["run_id"], metrics, step + 1)
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            if rank != 0:
                ray.train.report(metrics)
                continue
            out = write_checkpoint(loop, step + 1, metrics, loop_cfg["run_id"])
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(out))


def log_step(client, run_id: str, metrics: dict, step: int) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, step)
                                      for k, v in metrics.items() if k != "step"])


# ---- offline: one process, no Ray, no MLflow (a bare GPU machine) -------------------------------

OFFLINE_RUN = "offline"
OFFLINE_METRICS = "offline-metrics.jsonl"
OFFLINE_TIME = "offline-seconds.jsonl"  # one line per offline attempt: steps and wall time


def run_offline(cfg: TrainDrafterConfig, minutes: float | None = None) -> dict:
    """Train in this process on the GPU when there is one; checkpoints go to ``run_dir`` exactly
    as the Ray job writes them, metrics to ``run_dir/offline-metrics.jsonl`` and the attempt's
    wall time to ``run_dir/offline-seconds.jsonl``. A later ``python -m pipelines.train_drafter``
    with ``resume: true`` and the same ``steps`` hands the result back through Ray Train, logs
    those metrics (and the offline time, as ``offline_seconds``) to MLflow and registers the
    drafter.

    With ``minutes`` the step count is fitted to the time: after 12 steps, ``steps`` becomes
    what the rest of the budget allows at their pace (the cosine schedule follows it); the
    effective config is written to ``run_dir/offline-config.json``."""
    from specdec.models.sources import parse_device

    device = parse_device("auto")
    started = time.perf_counter()
    newest = ckpt.latest(cfg.output()) if cfg.resume else None
    if cfg.drafter.init_from and not Path(cfg.drafter.init_from).is_dir():
        raise ValueError("offline runs need drafter.init_from as a directory (no registry)")
    loop = setup(cfg, newest, cfg.drafter.init_from, 0, 1, device)
    total, step, paced_from = cfg.steps, loop.start, None
    metrics: dict = {}
    cfg.output().mkdir(parents=True, exist_ok=True)
    with (cfg.output() / OFFLINE_METRICS).open("a") as log, \
            tqdm(total=total, initial=step, desc="train_drafter (offline)", mininterval=5) as bar:
        while step < total:
            metrics = one_step(loop, step, total)
            step += 1
            log.write(json.dumps(metrics) + "\n")
            bar.update()
            if minutes and step - loop.start == 2:
                paced_from = time.perf_counter()  # steps 1-2 warm the kernels up
            if minutes and step - loop.start == 12:
                pace = (time.perf_counter() - paced_from) / 10
                left = minutes * 60 - (time.perf_counter() - started)
                total = max(step, min(cfg.steps, step + int(left / pace)))
                bar.total = total
            if step % cfg.checkpoint_every == 0 or step == total:
                write_checkpoint(loop, step, metrics, OFFLINE_RUN)
    done = cfg.model_copy(update={"steps": total})
    (cfg.output() / "offline-config.json").write_text(done.model_dump_json(indent=2))
    seconds = round(time.perf_counter() - started, 1)
    with (cfg.output() / OFFLINE_TIME).open("a") as f:
        f.write(json.dumps({"from_step": loop.start, "to_step": total, "seconds": seconds,
                            "device": str(device)}) + "\n")
    return {"checkpoint": str(ckpt.step_dir(cfg.output(), total)), "steps": total,
            "seconds": seconds, "device": str(device), "metrics": metrics}


def log_offline_metrics(cfg: TrainDrafterConfig) -> int:
    """Log an offline run's metrics, and the wall time of its attempts as ``offline_seconds``,
    to the active MLflow run, once; -> the steps logged."""
    import mlflow
    from mlflow.entities import Metric

    times = cfg.output() / OFFLINE_TIME
    if times.is_file():
        attempts = [json.loads(line) for line in times.read_text().splitlines() if line.strip()]
        mlflow.log_metric("offline_seconds", sum(a["seconds"] for a in attempts))
        times.rename(times.with_suffix(".logged.jsonl"))
    path = cfg.output() / OFFLINE_METRICS
    if not path.is_file():
        return 0
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, int(m["step"])) for m in lines
             for k, v in m.items() if k != "step"]
    client, run_id = mlflow.MlflowClient(), mlflow.active_run().info.run_id
    for at in range(0, len(batch), 1000):  # MLflow's limit per log_batch
        client.log_batch(run_id, metrics=batch[at: at + 1000])
    path.rename(path.with_suffix(".logged.jsonl"))
    return len(lines)


# ---- the driver ---------------------------------------------------------------------------------

def preflight(cfg: TrainDrafterConfig) -> tuple[str | None, set[str]]:
    """Every check that can fail fast, before Ray starts: config, corpus schema and rows,
    tokenizer, init checkpoint. Returns the local directory of ``init_from`` (registry refs
    resolved) and the held-out rows' ids."""
    from specdec.models.block_drafter import BlockDrafter
    from specdec.models.registry import resolve_model_ref

    held = heldout_ids(read_table(cfg.corpus, CORPUS_SCHEMA, "train_drafter.corpus"), cfg)
    check_tokenizer(cfg.corpus, cfg.target, "train_drafter.corpus")
    init_dir = resolve_model_ref(cfg.drafter.init_from, cfg.mlflow.tracking_uri)
    if init_dir and not BlockDrafter.is_checkpoint(init_dir):
        raise FileNotFoundError(f"drafter.init_from {cfg.drafter.init_from!r} is not a "
                                f"block-drafter checkpoint")
    return init_dir, held


def fit(cfg: TrainDrafterConfig, run, init_dir: str | None, held: set[str], tracking: str):
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    s = cfg.scaling
    # by reference, also under `python -m` (a __main__ function would be pickled by value,
    # with every submodule it touches, e.g. torch.backends.cuda, which cannot be pickled)
    from pipelines.train_drafter import datasets
    from pipelines.train_drafter import train_loop as loop

    trainer = TorchTrainer(
        loop,
        train_loop_config={"config": cfg.model_dump(), "run_id": run.info.run_id,
                           "tracking_uri": tracking, "init_dir": init_dir},
        scaling_config=ScalingConfig(num_workers=s.num_workers, use_gpu=s.use_gpu,
                                     resources_per_worker=s.worker_resources()),
        datasets=datasets(cfg, held) if s.num_workers > 0 else None,
        dataset_config=OwnedShards(cfg.shards()),
        run_config=RunConfig(name=f"train_drafter-{run.info.run_id[:8]}",
                             storage_path=str((cfg.output() / "ray").absolute()),
                             failure_config=FailureConfig(max_failures=s.max_failures)),
    )
    return trainer.fit()


def run(cfg: TrainDrafterConfig) -> dict:
    """Train, log to MLflow, register. Returns {"drafter": dir, "model_uri": ..., "run_id"}."""
    import mlflow

    from pipelines.common.plots import loss_figure
    from pipelines.common.tracking import (
        log_figure,
        log_params,
        log_plan,
        register,
        start_run,
        tracking_uri,
    )
    from specdec.runtime import RuntimeConfig

    init_dir, held = preflight(cfg)
    with start_run(cfg.mlflow, "train_drafter") as run_:
        log_params(cfg.model_dump())
        log_plan(cfg.target, RuntimeConfig("cuda" if cfg.scaling.use_gpu else "cpu", cfg.dtype,
                                           max_model_len=cfg.max_seq_len))
        if cfg.resume:
            log_offline_metrics(cfg)
        result = fit(cfg, run_, init_dir, held, tracking_uri(cfg.mlflow))
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
    parser = argparse.ArgumentParser(description="Train the block drafter (Ray Train).")
    parser.add_argument("--config", required=True, help="YAML file for this job")
    parser.add_argument("--offline", action="store_true",
                        help="this process alone, GPU if any, no Ray or MLflow (see run_offline)")
    parser.add_argument("--minutes", type=float, help="offline: fit the step count to this time")
    args = parser.parse_args(argv)
    cfg = load_config(TrainDrafterConfig, args.config)
    if args.offline:
        print(json.dumps(run_offline(cfg, args.minutes), indent=2))
        return
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    out = run(cfg)
    print(f"drafter: {out['drafter']}\nregistered: {out['model_uri']}\nrun: {out['run_id']}")


if __name__ == "__main__":
    main()
