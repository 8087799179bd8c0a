"""Data-parallel training, helpers and checks: two Ray Train workers (gloo on CPU) train what
one trains with the same global batch, and a run that loses a worker resumes from its last checkpoint and ends where an
uninterrupted run ends (``pipelines.common.global_batch``, ``pipelines.common.faults``).

Each job runs twice: once in the driver (one worker, ``num_workers: 0``), once with two workers
of which the last is killed (``os._exit``) once mid-run, the worker group restarting from the
last checkpoint (``max_failures: 1``). The two runs' losses are compared step by step.

The tolerance, ``RTOL``: the two runs compute the same global batch's loss and gradient, but in
float32 and summed in another order (each worker sums its half, then the all-reduce adds the
halves; the features of the drafter's target are computed on batches padded to other lengths).
Each such sum differs by a few float32 ulps, a relative 1e-7 to 1e-6; AdamW carries the
difference into the weights at about that relative size per step, so after the few steps here
the losses agree to about 1e-6 relative. ``RTOL = 1e-4`` leaves two orders of magnitude for
that growth, while any real difference in what is trained (a worker drawing other rows or other
anchors, a gradient averaged as a mean of the workers' means, a lost or doubled worker's
gradient, a resumed run drawing the batches of other steps) changes a loss of these tiny
models by a relative 1e-2 or more in the first steps.

The runs themselves are in tests/cluster/test_multinode.py, on a cluster of several nodes, with
one worker on each of two nodes (``run_preverifier_pair``, ``run_drafter_pair``); here are the
helpers and the config check.
"""

from __future__ import annotations

import mlflow
import pyarrow as pa
import pytest
import torch

from pipelines import train_drafter, train_preverifier
from pipelines.common import checkpoints
from pipelines.common.faults import MARKER
from pipelines.common.formats import STEPS_SCHEMA
from pipelines.common.tables import write_table
from tests.pipelines.conftest import config
from tests.pipelines.test_train_drafter import drafter_config

RTOL = 1e-4  # see the module docstring
SHARDS = 2  # both runs: what a run trains depends on its shards, not on its workers
STEPS, EVERY, FAIL_AT = 6, 2, 3  # the last worker dies before 0-based step 3: resume at 2


def history(tracking_uri: str, run_id: str, metric: str) -> dict[int, list[float]]:
    """{step: [values logged at it, in order]}: a step run again after a restart has two."""
    client = mlflow.MlflowClient(tracking_uri)
    out: dict[int, list[float]] = {}
    for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.timestamp):
        out.setdefault(m.step, []).append(m.value)
    return out


def two_workers(**extra) -> dict:
    return {"num_workers": 2, "max_failures": 1, "cpus_per_worker": 0.5, "torch_threads": 1,
            **extra}


def check_runs(one: dict[int, list[float]], two: dict[int, list[float]]) -> None:
    """``two``, with a worker lost at ``FAIL_AT``, against ``one``, uninterrupted."""
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    # the restarted group ran the steps after the last checkpoint again, drawing the same
    # batches from the same weights and optimiser state: the same losses, bit for bit
    assert two[FAIL_AT] == [two[FAIL_AT][0]] * 2, two
    for step in one:
        assert two[step][-1] == pytest.approx(one[step][0], rel=RTOL), (step, one, two)


def write_steps(path) -> str:
    """A small steps table (``pipelines.simulate``'s format): 24 requests of 3 rounds of 1-4
    drafted tokens, random hidden states, acceptance a function of them (so there is a signal)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for r in range(24):
        for step in range(3):
            length = 1 + int(torch.randint(4, (1,), generator=gen))
            for pos in range(length):
                hidden = torch.randn(8, generator=gen)
                rows.append(dict(request=f"r{r}", step=step, position=pos, block=pos, token=1,
                                 greedy=1, regret=0.0, accepted=int(hidden[0] + 0.2 * pos > 0),
                                 hidden=hidden.tolist()))
    return str(write_table(pa.Table.from_pylist(rows, schema=STEPS_SCHEMA), path))


def preverifier_config(store, data: str, run_dir, scaling: dict, **fields):
    base = dict(target="tiny", data=data, run_dir=str(run_dir), steps=STEPS, data_shards=SHARDS,
                checkpoint_every=EVERY, batch_size=4, pack_len=8, heldout_percent=25, lr=3e-3,
                model={"width": 16, "heads": 2, "max_positions": 8}, scaling=scaling,
                mlflow={"register_model": False})
    return config(train_preverifier.TrainPreVerifierConfig, store, **(base | fields))


def run_preverifier_pair(store, root, scaling: dict) -> tuple[dict, dict]:
    """-> the one-worker run's and the two-worker (one lost) run's outputs, after checking them."""
    data = write_steps(root / "steps.parquet")
    one = train_preverifier.run(preverifier_config(
        store, data, root / "one", {"num_workers": 0, "torch_threads": 1}))
    two = train_preverifier.run(preverifier_config(
        store, data, root / "two", scaling, fail_at_step=FAIL_AT))
    assert (root / "two" / MARKER).exists()  # the last worker did die
    check_runs(history(store["tracking_uri"], one["run_id"], "train_loss"),
               history(store["tracking_uri"], two["run_id"], "train_loss"))
    assert two["metrics"]["heldout_loss"] == pytest.approx(one["metrics"]["heldout_loss"],
                                                           rel=RTOL)
    return one, two


def run_drafter_pair(store, tiny_llama, corpus: str, root, scaling: dict) -> tuple[dict, dict]:
    """As ``run_preverifier_pair``, for the block drafter."""
    def cfg(run_dir, scaling, **fields):
        return drafter_config(store, tiny_llama, corpus, steps=STEPS, checkpoint_every=EVERY,
                              batch_size=4, data_shards=SHARDS, run_dir=str(run_dir),
                              scaling=scaling, **fields)

    one = train_drafter.run(cfg(root / "one", {"num_workers": 0, "torch_threads": 1}))
    two = train_drafter.run(cfg(root / "two", scaling, fail_at_step=FAIL_AT))
    assert (root / "two" / MARKER).exists()
    check_runs(history(store["tracking_uri"], one["run_id"], "loss"),
               history(store["tracking_uri"], two["run_id"], "loss"))
    assert checkpoints.read_state(checkpoints.latest(root / "two"))["step"] == STEPS
    return one, two


def test_the_global_batch_must_split_over_the_workers(store, tmp_path):
    with pytest.raises(ValueError, match="batch_size 3 must be divisible by data_shards 2"):
        preverifier_config(store, "steps.parquet", tmp_path, two_workers(), batch_size=3)
    with pytest.raises(ValueError, match="data_shards 3 must be a multiple of scaling.num_workers"):
        preverifier_config(store, "steps.parquet", tmp_path, two_workers(), data_shards=3)
