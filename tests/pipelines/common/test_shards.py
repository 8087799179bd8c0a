"""Sharded training data: Ray Data hands each worker exactly its own shards' rows, and the
workers' slots of a global batch together draw what one worker holding every shard draws."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipelines.common.global_batch import shard_draws, worker_slots
from pipelines.common.shards import SHARD, OwnedShards, owned, shard_of, with_shards

ROWS = pa.table({"id": [f"row-{i}" for i in range(40)], "x": list(range(40))})


def test_a_row_keeps_its_shard_whatever_the_order_and_the_workers():
    forward = with_shards(ROWS, "id", 4).to_pylist()
    backward = with_shards(ROWS.take(list(range(39, -1, -1))), "id", 4).to_pylist()
    assert sorted(forward, key=lambda r: r["x"]) == sorted(backward, key=lambda r: r["x"])
    assert {r[SHARD] for r in forward} == {0, 1, 2, 3}  # 40 rows fill 4 shards
    assert [owned(r, 2, 4) for r in range(2)] == [range(0, 2), range(2, 4)]
    with pytest.raises(ValueError, match="data_shards 3 is not divisible by 2"):
        owned(0, 2, 3)


def test_each_worker_reads_only_its_shards_through_ray_data(ray_session):
    import ray.data

    train = ray.data.from_arrow(ROWS).map_batches(
        with_shards, fn_kwargs={"key": "id", "shards": 4}, batch_format="pyarrow")
    held = ray.data.from_arrow(ROWS.slice(0, 3))
    per_rank = OwnedShards(4).configure({"train": train, "heldout": held}, world_size=2,
                                        worker_handles=None, worker_node_ids=None)
    seen = []
    for rank, its in enumerate(per_rank):
        rows = [r for b in its["train"].iter_batches(batch_format="pyarrow")
                for r in b.to_pylist()]
        assert {r[SHARD] for r in rows} <= set(owned(rank, 2, 4))
        assert all(shard_of(r["id"], 4) == r[SHARD] for r in rows)
        seen += [r["x"] for r in rows]
        whole = [r["x"] for b in its["heldout"].iter_batches(batch_format="pyarrow")
                 for r in b.to_pylist()]
        assert sorted(whole) == [0, 1, 2]  # a dataset not split: every worker reads it whole
    assert sorted(seen) == list(range(40))  # no row lost, none read twice


@pytest.mark.parametrize("world", [2, 4])
def test_the_workers_slots_draw_what_one_worker_draws(world):
    sizes = {0: 7, 1: 3, 2: 11, 3: 5}
    for step in range(5):
        one = shard_draws(3, step, 4, sizes, 8, range(8))
        parts = [shard_draws(3, step, 4, {s: sizes[s] for s in owned(r, world, 4)}, 8,
                             worker_slots(8, r, world)) for r in range(world)]
        assert sum(parts, []) == one
        assert [s for s, _ in one] == [0, 0, 1, 1, 2, 2, 3, 3]
        assert all(0 <= i < sizes[s] for s, i in one)
    assert shard_draws(3, 0, 4, sizes, 8, range(8)) != shard_draws(3, 1, 4, sizes, 8, range(8))
    with pytest.raises(ValueError, match="shard 1 holds no training rows"):
        shard_draws(3, 0, 4, sizes | {1: 0}, 8, range(8))
