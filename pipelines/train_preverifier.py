"""Job: train PACER's pre-verifier on simulated SD steps (Parquet from ``pipelines.simulate``).

Rows are grouped into steps (one round's draft, by request and step, ordered by position),
requests are split into train and held-out by a hash of their id (a request never straddles
the split), steps are packed whole into sequences (``specdec.training.preverifier_data``) and
a ``PreVerifier`` is trained with binary cross-entropy in a Ray Train ``TorchTrainer``. At the
end it reports loss, accuracy, AUC and ECE on the held-out split, with a calibration plot.

The steps fall into ``data_shards`` shards by request (``pipelines.common.shards``): Ray Data
reads the Parquet, and each Ray Train worker receives its own shards' rows and packs each shard
on its own. With several workers (DDP) a step's global batch of ``batch_size`` packed sequences
is drawn the same on every worker, each slot from one shard, and each worker computes the slots
of its shards (``pipelines.common.global_batch``), its loss divided by the global batch's count
of valid tokens: W workers train what one worker trains with the same ``data_shards``.
Every ``checkpoint_every`` steps the model and optimiser are checkpointed; after a worker failure
(``scaling.max_failures``) the worker group resumes from the last one and draws the same batches.
With ``select: best`` the model kept is the one of lowest held-out loss among the last step's and
the checkpoints' (its held-out metrics are then of a model picked on them;
``pipelines.evaluate_acceptance`` measures on prompts no stage saw).

Rows of the acceptance model's features (their file's metadata ``specdec.acceptance``, written
by ``pipelines.simulate`` for ngram and suffix drafters) train an acceptance model
(``specdec.models.acceptance``) the same way: its parts are normalised apart, each step keeps
only the tokens whose predecessors were all accepted (its label: accepted given they were), and
it is registered as ``<target>-acceptance-<drafter>``.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import ClassVar, Literal

import pyarrow as pa
import torch
from pydantic import Field, model_validator
from tqdm import tqdm

from pipelines.common import checkpoints as ckpt
from pipelines.common.config import (
    Device,
    MlflowSettings,
    Scaling,
    Strict,
    TrainJob,
    cli_config,
    loop_device,
    target_name,
)
from pipelines.common.faults import maybe_fail
from pipelines.common.formats import STEPS_SCHEMA
from pipelines.common.global_batch import global_sum, shard_draws, worker_slots
from pipelines.common.shards import SHARD, OwnedShards, held_rows, only, owned, with_shards
from pipelines.common.steps import acceptance_of, steps_of
from pipelines.common.tables import read_dataset, read_table

SHARDED = STEPS_SCHEMA.append(pa.field(SHARD, pa.int32()))  # the rows a worker receives


class PreVerifierSettings(Strict):
    width: int = 64
    heads: int = 4
    max_positions: int = 64
    use_position: bool = True


class TrainPreVerifierConfig(TrainJob):
    JOB: ClassVar[str] = "train_preverifier"

    target: str = "smollm2-135m"  # only names the registered model
    data: str  # steps.parquet from pipelines.simulate
    run_dir: str | None = None
    model: PreVerifierSettings = PreVerifierSettings()
    heldout_percent: float = Field(20.0, ge=0, lt=100)
    pack_len: int = Field(64, ge=1)
    batch_size: int = Field(16, ge=1)  # packed sequences per step, over all workers (split evenly)
    steps: int = Field(200, ge=1)
    checkpoint_every: int = Field(50, ge=1)
    # the model kept: the last step's, or the lowest held-out loss of its and this run's
    # checkpoints' (a held-out split needed)
    select: Literal["last", "best"] = "last"
    fail_at_step: int | None = None  # fault injection (tests): the last worker dies once here
    lr: float = 1e-3
    seed: int = 0
    dtype: Literal["float32"] = "float32"
    save_dtype: Literal["float32", "bfloat16"] = "float32"  # the saved weights' (bfloat16: half)
    device: Device = "cpu"  # the driver's (scaling.num_workers 0); a worker takes Ray's (use_gpu)
    scaling: Scaling = Scaling()
    mlflow: MlflowSettings = MlflowSettings()

    @model_validator(mode="after")
    def _select(self):
        if self.select == "best" and self.heldout_percent == 0:
            raise ValueError("select best picks by held-out loss: set heldout_percent above 0")
        return self


def heldout(request: str, percent: float) -> bool:
    return int(hashlib.sha1(request.encode()).hexdigest()[:8], 16) % 10000 < percent * 100


def load_steps(path: str, percent: float, reached: bool = False):
    """-> (train steps, held-out steps) of the whole file, as lists of ``Step`` (``reached``:
    only the tokens whose predecessors were all accepted)."""
    table = read_table(path, STEPS_SCHEMA, "train_preverifier.data")
    if table.num_rows == 0:
        raise ValueError(f"train_preverifier.data: {path} has no rows")
    return (steps_of(keep_split(table, percent, held=False), reached),
            steps_of(keep_split(table, percent, held=True), reached))


def keep_split(table: pa.Table, percent: float, held: bool) -> pa.Table:
    """The rows of ``table`` whose request is held out (``held``) or trained on."""
    mask = pa.array([heldout(r, percent) == held for r in table.column("request").to_pylist()])
    return table.filter(mask)


def rows_here(cfg: TrainPreVerifierConfig) -> tuple[pa.Table, pa.Table]:
    """(the training rows this process holds, with their shard; the held-out rows): from Ray
    Data on a Ray Train worker (``datasets``), read here in the driver (``num_workers: 0``, one
    process holding every shard: no Ray Data to start)."""
    if cfg.scaling.num_workers > 0:
        return held_rows("train", SHARDED), held_rows("heldout", STEPS_SCHEMA)
    table = read_table(cfg.data, STEPS_SCHEMA, "train_preverifier.data")
    percent = cfg.heldout_percent
    train = with_shards(keep_split(table, percent, held=False), "request", cfg.shards())
    return train, keep_split(table, percent, held=True) if percent else table


def datasets(cfg: TrainPreVerifierConfig) -> dict:
    """The trainer's Ray datasets: ``train``, the training rows with their shard (each worker
    receives its own shards': ``OwnedShards``), and ``heldout``, every held-out row (all rows
    when nothing is held out), which every worker receives whole."""
    rows = read_dataset(cfg.data)
    train = rows.map_batches(keep_split, fn_kwargs={"percent": cfg.heldout_percent, "held": False},
                             batch_format="pyarrow").map_batches(
        with_shards, fn_kwargs={"key": "request", "shards": cfg.shards()}, batch_format="pyarrow")
    held = rows if cfg.heldout_percent == 0 else rows.map_batches(
        keep_split, fn_kwargs={"percent": cfg.heldout_percent, "held": True},
        batch_format="pyarrow")
    return {"train": train, "heldout": held}


def evaluate(net, packed) -> dict:
    """Held-out metrics of ``net`` on ``packed`` (on the net's device); computed on the CPU."""
    from specdec.training.calibration import accuracy, auc, ece

    net.eval()
    with torch.no_grad():
        logits = net(packed.hidden, packed.positions, packed.step_ids)[packed.valid].cpu()
    labels = packed.labels[packed.valid].cpu()
    probs = torch.sigmoid(logits)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    net.train()
    return {"loss": float(loss), "accuracy": accuracy(probs, labels), "auc": auc(probs, labels),
            "ece": ece(probs, labels), "positive_rate": float(labels.mean())}


def train_loop(loop_cfg: dict) -> None:
    import mlflow
    import ray.train
    from ray.train.torch import prepare_model

    from specdec.models.preverifier import PreVerifier, PreVerifierConfig
    from specdec.training.preverifier_data import pack_steps

    cfg = TrainPreVerifierConfig.model_validate(loop_cfg["config"])
    torch.set_num_threads(cfg.scaling.torch_threads)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = loop_device(cfg.scaling, cfg.device)
    (rows, held_table), shards = rows_here(cfg), cfg.shards()
    acceptance = loop_cfg.get("acceptance")  # None: a pre-verifier's rows
    reached = acceptance is not None
    mine = {s: steps_of(only(rows, range(s, s + 1)), reached) for s in owned(rank, world, shards)}
    packs = {s: pack_steps(steps, cfg.pack_len).to(device) for s, steps in mine.items()}
    sizes = {s: p.hidden.shape[0] for s, p in packs.items()}
    held_steps = steps_of(held_table, reached) or sum(mine.values(), [])
    held = pack_steps(held_steps, cfg.pack_len).to(device)
    m = cfg.model
    parts = () if acceptance is None else accepting(cfg, acceptance).parts
    torch.manual_seed(cfg.seed)
    model = PreVerifier(PreVerifierConfig(input_size=held.hidden.shape[-1], width=m.width,
                                          heads=m.heads, max_positions=m.max_positions,
                                          use_position=m.use_position, parts=parts))
    start_dir = ckpt.restore(cfg.output(), loop_cfg["run_id"])
    if start_dir:
        model.load_state_dict(PreVerifier.load(start_dir / "preverifier").state_dict())
    model = model.to(device).train()
    # More than one worker: DDP (Ray Train's prepare_model), which averages the gradients.
    net = prepare_model(model, move_to_device=device) if world > 1 else model
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
    start = ckpt.read_state(start_dir)["step"] if start_dir else 0
    if start_dir and start < cfg.steps:
        ckpt.load_optimizer(opt, start_dir)
    client = mlflow.MlflowClient(loop_cfg["tracking_uri"]) if rank == 0 else None
    for step in tqdm(range(start, cfg.steps), desc="train_preverifier", disable=rank != 0,
                     initial=start, total=cfg.steps, mininterval=5):
        maybe_fail(cfg.output(), cfg.fail_at_step, step, rank, world, cfg.scaling.num_workers > 0)
        draws = shard_draws(cfg.seed, step, shards, sizes, cfg.batch_size,
                            worker_slots(cfg.batch_size, rank, world))
        loss = train_step(net, opt, pick(packs, draws), world)
        if client is not None:
            client.log_metric(loop_cfg["run_id"], "train_loss", loss, step=step + 1)
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            checkpoint(model, opt, cfg.output(), step + 1, loss, loop_cfg["run_id"], rank)
    if cfg.select == "best" and rank == 0:
        model = best_of(model, held, cfg, loop_cfg["run_id"], client)
    report(model, evaluate(model, held), rank, cfg.save_dtype)


def best_of(model, held, cfg: TrainPreVerifierConfig, run_id: str, client):
    """Of ``model`` (the last step's) and this run's checkpoints, the one of lowest held-out
    loss; each one's loss is logged as ``checkpoint_heldout_loss`` at its step, the pick as
    ``selected_step``."""
    from specdec.models.preverifier import PreVerifier

    best, best_loss, picked = model, evaluate(model, held)["loss"], cfg.steps
    client.log_metric(run_id, "checkpoint_heldout_loss", best_loss, step=cfg.steps)
    for state in sorted((cfg.output() / "checkpoints").glob(f"step_*/{ckpt.STATE_FILE}")):
        info = json.loads(state.read_text())
        if info.get("run_id") != run_id or info["step"] >= cfg.steps:
            continue
        candidate = PreVerifier.load(state.parent / "preverifier").to(held.hidden.device)
        loss = evaluate(candidate, held)["loss"]
        client.log_metric(run_id, "checkpoint_heldout_loss", loss, step=info["step"])
        if loss < best_loss:
            best, best_loss, picked = candidate, loss, info["step"]
    client.log_metric(run_id, "selected_step", picked)
    return best


def accepting(cfg: TrainPreVerifierConfig, acceptance: dict):
    """The ``AcceptanceConfig`` of the model trained on rows described by ``acceptance``."""
    from specdec.models.acceptance import AcceptanceConfig

    m = cfg.model
    return AcceptanceConfig(acceptance["drafter"], acceptance["root_size"],
                            acceptance["signal_size"], m.width, m.heads, m.max_positions)


def pick(packs: dict, draws: list[tuple[int, int]]):
    """The packed sequences ``draws`` names, (shard, row) each, of the shards' ``packs``."""
    from specdec.training.preverifier_data import PackedSteps

    return PackedSteps(*(torch.stack([getattr(packs[s], f.name)[i] for s, i in draws])
                         for f in fields(PackedSteps)))


def train_step(net, opt, batch, world: int) -> float:
    """One optimiser step of binary cross-entropy on ``batch``, this worker's slots of the
    global batch; -> the global batch's loss.

    The loss is the mean over the global batch's valid tokens: this worker's sum divided by
    their count over the workers, times ``world`` because DDP averages the workers' gradients."""
    logits = net(batch.hidden, batch.positions, batch.step_ids)
    total = torch.nn.functional.binary_cross_entropy_with_logits(
        logits[batch.valid], batch.labels[batch.valid], reduction="sum")
    count = global_sum(batch.valid.sum().to(total.dtype), world)
    loss = total * world / count.clamp_min(1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(global_sum(loss.detach(), world)) / world


def checkpoint(model, opt, run_dir: Path, step: int, loss: float, run_id: str, rank: int) -> None:
    """Rank 0 writes the model and optimiser at ``step`` and hands them to Ray Train."""
    import ray.train

    if rank != 0:
        ray.train.report({"step": step, "train_loss": loss})
        return
    out = ckpt.step_dir(run_dir, step)
    model.save(out / "preverifier")
    ckpt.save_optimizer(opt, out)
    ckpt.write_state(out, step, loss=loss, run_id=run_id)
    ray.train.report({"step": step, "train_loss": loss},
                     checkpoint=ray.train.Checkpoint.from_directory(out))


def report(net, metrics: dict, rank: int, dtype: str = "float32") -> None:
    import ray.train

    if rank != 0:
        ray.train.report(metrics)
        return
    out = Path(tempfile.mkdtemp(prefix="preverifier-"))
    net.cpu().eval().save(out / "preverifier", getattr(torch, dtype))
    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(out))


def calibration_plot(cfg: TrainPreVerifierConfig, model_dir: Path):
    from pipelines.common.plots import calibration_figure
    from specdec.models.preverifier import PreVerifier
    from specdec.training.calibration import calibration_bins
    from specdec.training.preverifier_data import pack_steps

    reached = acceptance_of(cfg.data, "train_preverifier.data") is not None
    train_steps, held_steps = load_steps(cfg.data, cfg.heldout_percent, reached)
    packed = pack_steps(held_steps or train_steps, cfg.pack_len)
    net = PreVerifier.load(model_dir)
    with torch.no_grad():
        probs = torch.sigmoid(net(packed.hidden, packed.positions, packed.step_ids))[packed.valid]
    mean_pred, rate, count = calibration_bins(probs, packed.labels[packed.valid])
    keep = count > 0
    name = "acceptance model" if reached else "pre-verifier"
    return calibration_figure(mean_pred[keep].tolist(), rate[keep].tolist(), name)


def run(cfg: TrainPreVerifierConfig) -> dict:
    import shutil

    import mlflow
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from pipelines.common.plots import loss_figure
    from pipelines.common.pools import ensure_ray
    from pipelines.common.tracking import log_figure, log_params, register, start_run, tracking_uri

    acceptance = acceptance_of(cfg.data, "train_preverifier.data")  # fails fast on a bad file, before Ray
    load_steps(cfg.data, cfg.heldout_percent, acceptance is not None)
    with start_run(cfg.mlflow, "train_preverifier") as run_:
        log_params(cfg.model_dump())
        ensure_ray()
        s = cfg.scaling
        result = TorchTrainer(
            train_loop,
            train_loop_config={"config": cfg.model_dump(), "run_id": run_.info.run_id,
                               "tracking_uri": tracking_uri(cfg.mlflow),
                               "acceptance": acceptance},
            scaling_config=ScalingConfig(num_workers=s.num_workers, use_gpu=s.use_gpu,
                                         resources_per_worker=s.worker_resources()),
            datasets=datasets(cfg) if s.num_workers > 0 else None,
            dataset_config=OwnedShards(cfg.shards()),
            run_config=RunConfig(name=f"train_preverifier-{run_.info.run_id[:8]}",
                                 storage_path=str((cfg.output() / "ray").absolute()),
                                 failure_config=FailureConfig(max_failures=s.max_failures)),
        ).fit()
        if result.error:
            raise result.error
        kind = "preverifier" if acceptance is None else "acceptance"
        final = cfg.output() / f"{kind}-{run_.info.run_id[:8]}"
        with result.checkpoint.as_directory() as done:
            shutil.copytree(Path(done) / "preverifier", final, dirs_exist_ok=True)
        name = f"{target_name(cfg.target)}-preverifier"
        if acceptance is not None:  # the net is a pre-verifier's; this file makes it one of these
            from specdec.models.acceptance import ACCEPTANCE_FILE

            config = accepting(cfg, acceptance)
            (final / ACCEPTANCE_FILE).write_text(json.dumps(asdict(config), indent=2))
            name = f"{target_name(cfg.target)}-acceptance-{config.drafter}"
        held = {f"heldout_{k}": v for k, v in result.metrics.items() if isinstance(v, float)}
        mlflow.log_metrics(held)
        mlflow.log_artifacts(str(final), artifact_path=kind)
        log_figure(calibration_plot(cfg, final), "calibration")
        history = mlflow.MlflowClient().get_metric_history(run_.info.run_id, "train_loss")
        log_figure(loss_figure(history, f"{kind} (BCE)"), "loss")
        uri = register(cfg.mlflow, name, run_, kind)
    return {kind: str(final), "model_uri": uri, "metrics": held, "run_id": run_.info.run_id}


def main(argv=None) -> None:
    out = run(cli_config(TrainPreVerifierConfig, argv, "Train the PACER pre-verifier."))
    kind = "preverifier" if "preverifier" in out else "acceptance"
    print(f"{kind}: {out[kind]}\nregistered: {out['model_uri']}\n{out['metrics']}")


if __name__ == "__main__":
    main()
