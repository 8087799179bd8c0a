"""Drafter training: both loss families train and a run resumes its step counter. A worker lost
mid-run is recovered from the last checkpoint in tests/cluster/test_multinode.py (two workers on
two nodes, one killed: ``tests.pipelines.test_data_parallel.run_drafter_pair``)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipelines import train_drafter
from pipelines.common import checkpoints
from pipelines.common.formats import CORPUS_SCHEMA, tokenizer_fingerprint
from pipelines.common.tables import write_table
from specdec.algorithms.losses import make_loss
from specdec.training.drafter_forward import FrozenTargetParts
from tests.pipelines.conftest import config

TEXT = [b"def add(a, b):\n    return a + b\n", b"hello world, hello world, hello world!",
        b"for i in range(10):\n    print(i * i)\n"]


@pytest.fixture(scope="module")
def tiny_corpus(tiny_llama, store):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama["target"])
    rows = [dict(id=f"t{i}", source="sharegpt", split="train", prompt_ids=list(t[:8]),
                 input_ids=list(t), prompt_len=8) for i, t in enumerate(TEXT)]
    path = store["root"] / "small-corpus" / "train.parquet"
    write_table(pa.Table.from_pylist(rows, schema=CORPUS_SCHEMA), path,
                {"specdec.tokenizer": tokenizer_fingerprint(tok)})
    return str(path)


def drafter_config(store, tiny_llama, corpus, **fields):
    base = dict(target=tiny_llama["target"], corpus=corpus, drafter={"block_size": 6,
                "num_taps": 2}, batch_size=3, anchors_per_sequence=8, max_seq_len=64,
                lr=3e-3, scaling={"num_workers": 0, "torch_threads": 1},
                mlflow={"register_model": False})
    return config(train_drafter.TrainDrafterConfig, store, **(base | fields))


@pytest.mark.parametrize("loss,drafter", [
    ({"name": "dpace"}, {}),
    ({"name": "dflash", "gamma": 4.0}, {}),
    ({"name": "dpace"}, {"draft_vocab_size": 24, "init_layer_from_target": -1}),
])
def test_loss_decreases_on_the_tiny_pair(loss, drafter, store, tiny_llama, tiny_corpus):
    cfg = drafter_config(store, tiny_llama, tiny_corpus, loss=loss,
                         drafter={"block_size": 6, "num_taps": 2} | drafter)
    data = train_drafter.local_data(cfg)
    seqs = data.shards[0]  # one shard: every training text
    target, drafter = train_drafter.build_models(cfg, None, data)
    net = drafter.net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
    parts = FrozenTargetParts(target.embedding_weight(), target.lm_head_weight())
    loss_fn = make_loss(cfg.loss.name, **cfg.loss.params())
    losses = []
    for _ in range(25):  # the same anchors every step: the drafter must fit them
        opt.zero_grad()
        m = train_drafter.train_step(net, parts, target, seqs, cfg, loss_fn,
                                     torch.Generator().manual_seed(0), world=1)
        opt.step()
        losses.append(m["loss"])
    assert sum(losses[-3:]) < 0.6 * sum(losses[:3]), losses


def step_history(store, run_id: str) -> list[int]:
    client = mlflow.MlflowClient(store["tracking_uri"])
    return sorted(m.step for m in client.get_metric_history(run_id, "loss"))


def test_resume_continues_the_step_counter(ray_session, store, tiny_llama, tiny_corpus):
    run_dir = store["root"] / "resume"
    first = train_drafter.run(drafter_config(store, tiny_llama, tiny_corpus, steps=3,
                                             checkpoint_every=3, run_dir=str(run_dir)))
    second = train_drafter.run(drafter_config(store, tiny_llama, tiny_corpus, steps=6,
                                              checkpoint_every=3, run_dir=str(run_dir),
                                              resume=True))
    assert step_history(store, first["run_id"]) == [1, 2, 3]
    assert step_history(store, second["run_id"]) == [4, 5, 6]
    assert checkpoints.read_state(checkpoints.latest(run_dir))["step"] == 6
    # resuming a finished run trains nothing and hands back the same drafter
    third = train_drafter.run(drafter_config(store, tiny_llama, tiny_corpus, steps=6,
                                             checkpoint_every=3, run_dir=str(run_dir),
                                             resume=True))
    assert step_history(store, third["run_id"]) == []
    weights = "model.safetensors"
    assert (Path(third["drafter"]) / weights).read_bytes() == \
        (Path(second["drafter"]) / weights).read_bytes()


def test_tokenizer_mismatch_fails_before_training(store, tiny_llama, tiny_corpus):
    path = store["root"] / "other" / "train.parquet"
    table = pq.read_table(tiny_corpus)
    write_table(table.replace_schema_metadata({}), path,
                {"specdec.tokenizer": "0000000000000000", "specdec.target": "smollm2-135m"})
    cfg = drafter_config(store, tiny_llama, str(path), steps=1)
    with pytest.raises(ValueError, match="tokenizer"):
        train_drafter.preflight(cfg)


def test_response_anchors_start_at_the_first_response_token(store, tiny_llama, tiny_corpus):
    cfg = drafter_config(store, tiny_llama, tiny_corpus, anchors="response",
                         anchors_per_sequence=40)
    data = train_drafter.local_data(cfg)
    texts = data.shards[0]
    assert [t.first_anchor for t in texts] == [8, 8, 8]  # the prompt_len of every row
    target, _ = train_drafter.build_models(cfg, None, data)
    _, batch = train_drafter.make_batch(target, texts, 6, 40, "text", torch.Generator())
    assert int(batch.block_pos[:, 0].min()) == 8  # every anchor lies in the response
    # every usable anchor (8 .. T-2) of every sequence is drafted from, and no other
    assert batch.num_blocks == sum(len(t.ids) - 1 - 8 for t in texts)


def test_learning_rate_schedule(store, tiny_llama, tiny_corpus):
    cfg = drafter_config(store, tiny_llama, tiny_corpus, lr=1e-3, warmup_steps=10,
                         lr_schedule="cosine")
    assert train_drafter.lr_at(cfg, 0, 100) == pytest.approx(1e-4)
    assert train_drafter.lr_at(cfg, 9, 100) == pytest.approx(1e-3)
    assert train_drafter.lr_at(cfg, 10, 100) == pytest.approx(1e-3)
    assert train_drafter.lr_at(cfg, 55, 100) == pytest.approx(0.55e-3)
    assert train_drafter.lr_at(cfg, 100, 100) == pytest.approx(1e-4)
    flat = cfg.model_copy(update={"lr_schedule": "constant"})
    assert train_drafter.lr_at(flat, 99, 100) == pytest.approx(1e-3)


def test_an_offline_run_is_handed_back_and_registered_by_the_ray_job(ray_session, store,
                                                                     tiny_llama, tiny_corpus):
    run_dir = store["root"] / "offline"
    cfg = drafter_config(store, tiny_llama, tiny_corpus, steps=4, checkpoint_every=2,
                         run_dir=str(run_dir), resume=True, mlflow={"register_model": True})
    done = train_drafter.run_offline(cfg)
    assert done["steps"] == 4 and done["device"] == "cpu"
    assert checkpoints.read_state(checkpoints.latest(run_dir)) == {
        "step": 4, "loss": done["metrics"]["loss"], "run_id": train_drafter.OFFLINE_RUN}
    out = train_drafter.run(cfg)  # trains nothing: logs the offline steps, registers the drafter
    assert step_history(store, out["run_id"]) == [1, 2, 3, 4]
    client = mlflow.MlflowClient(store["tracking_uri"])
    logged = client.get_run(out["run_id"]).data.metrics["offline_seconds"]
    assert logged == pytest.approx(done["seconds"])  # the offline wall time, for the records
    assert (Path(out["drafter"]) / "model.safetensors").read_bytes() == \
        (checkpoints.latest(run_dir) / "drafter" / "model.safetensors").read_bytes()
    assert out["model_uri"].startswith("models:/")
    assert not (run_dir / train_drafter.OFFLINE_METRICS).exists()  # logged once
    assert not (run_dir / train_drafter.OFFLINE_TIME).exists()


def test_offline_minutes_fit_the_step_count(store, tiny_llama, tiny_corpus):
    run_dir = store["root"] / "offline-minutes"
    cfg = drafter_config(store, tiny_llama, tiny_corpus, steps=500, run_dir=str(run_dir))
    done = train_drafter.run_offline(cfg, minutes=1e-6)  # no time left after the 12 paced steps
    assert done["steps"] == 12
    assert checkpoints.read_state(checkpoints.latest(run_dir))["step"] == 12
    written = train_drafter.TrainDrafterConfig.model_validate_json(
        (run_dir / "offline-config.json").read_text())
    assert written.steps == 12


def test_heldout_texts_are_kept_out_and_measured(store, tiny_llama, tiny_corpus):
    run_dir = store["root"] / "heldout"
    cfg = drafter_config(store, tiny_llama, tiny_corpus, steps=4, eval_every=2,
                         heldout_sequences=1, run_dir=str(run_dir))
    loop = train_drafter.setup(cfg, None, None, 0, 1, torch.device("cpu"))
    assert len(loop.data.heldout) == 1 and loop.data.heldout[0] not in loop.data.shards[0]
    assert len(loop.data.shards[0]) == len(TEXT) - 1
    steps = [train_drafter.one_step(loop, s, cfg.steps) for s in range(cfg.steps)]
    measured = [m["step"] for m in steps if "heldout_accept_len_est" in m]
    assert measured == [2, 4]
    assert all(1.0 <= m["heldout_accept_len_est"] <= cfg.drafter.block_size for m in steps
               if m["step"] in measured)
    with pytest.raises(ValueError, match="leaves no training sequence"):
        train_drafter.local_data(cfg.model_copy(update={"heldout_sequences": len(TEXT)}))
