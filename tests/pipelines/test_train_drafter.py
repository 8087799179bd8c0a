"""Drafter training: both loss families train, a run resumes its step counter, and a worker
failure is recovered from the last checkpoint (Ray Train FailureConfig)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipelines import checkpoints, train_drafter
from pipelines.corpus import SCHEMA, tokenizer_fingerprint
from pipelines.tables import write_table
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
    write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path,
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
    seqs = train_drafter.load_sequences(cfg)
    target, drafter = train_drafter.build_models(cfg, None, seqs)
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


@pytest.mark.slow
def test_worker_failure_resumes_from_the_last_checkpoint(ray_session, store, tiny_llama,
                                                         tiny_corpus):
    run_dir = store["root"] / "failure"
    out = train_drafter.run(drafter_config(
        store, tiny_llama, tiny_corpus, steps=4, checkpoint_every=2, run_dir=str(run_dir),
        fail_at_step=3, scaling={"num_workers": 1, "max_failures": 1, "torch_threads": 1,
                                 "cpus_per_worker": 0.5}))
    assert (run_dir / ".injected-failure").exists()  # the first attempt did fail
    assert checkpoints.read_state(checkpoints.latest(run_dir))["step"] == 4
    # steps 1-3 ran in the failed attempt; the restart resumed at step 3 from checkpoint 2
    assert step_history(store, out["run_id"]) == [1, 2, 3, 3, 4]


def test_tokenizer_mismatch_fails_before_training(store, tiny_llama, tiny_corpus):
    path = store["root"] / "other" / "train.parquet"
    table = pq.read_table(tiny_corpus)
    write_table(table.replace_schema_metadata({}), path,
                {"specdec.tokenizer": "0000000000000000", "specdec.target": "smollm2-135m"})
    cfg = drafter_config(store, tiny_llama, str(path), steps=1)
    with pytest.raises(ValueError, match="tokenizer"):
        train_drafter.preflight(cfg)
