"""Sharded training data: which rows each data-parallel worker holds, read through Ray Data.

What this is: a training table's rows fall into ``S`` fixed shards by a hash of a key column (a
corpus row's id, a simulated step's request), so a row's shard depends on nothing else, not on
the file's order and not on the number of workers. Worker ``r`` of ``W`` holds the shards
``owned(r, W, S)``: Ray Train hands each worker a Ray Data iterator over its shards' rows only
(``OwnedShards``, the trainer's ``dataset_config``), read and filtered by Ray Data tasks wherever
the cluster runs them. A step's global batch draws each of its slots from one shard
(``pipelines.common.global_batch``), and the slots a worker computes are those of the shards it
holds, so W workers train what one worker holding every shard trains with the same ``S``.

What this is not: no model, no packing, no batching; the jobs own those.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc
from ray.train import DataConfig

SHARD = "shard"  # the column ``with_shards`` adds


def shard_of(key: str, shards: int) -> int:
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % shards


def owned(rank: int, world: int, shards: int) -> range:
    """The shards worker ``rank`` of ``world`` holds: a contiguous run of ``shards / world``."""
    if shards % world:
        raise ValueError(f"data_shards {shards} is not divisible by {world} workers")
    per = shards // world
    return range(rank * per, (rank + 1) * per)


def with_shards(table: pa.Table, key: str, shards: int) -> pa.Table:
    """``table`` with each row's shard, by its ``key`` column, as the column ``SHARD``."""
    ids = [shard_of(k, shards) for k in table.column(key).to_pylist()]
    return table.append_column(SHARD, pa.array(ids, pa.int32()))


def only(table: pa.Table, shards: range) -> pa.Table:
    """The rows of ``table`` (with ``SHARD``) in ``shards``."""
    return table.filter(pc.is_in(table[SHARD], pa.array(list(shards), pa.int32())))


class OwnedShards(DataConfig):
    """Ray Train's data config giving worker ``r`` of ``W`` the rows of ``owned(r, W, shards)``
    of each dataset in ``split`` (rows carrying ``SHARD``), and every other dataset whole."""

    def __init__(self, shards: int, split: tuple[str, ...] = ("train",)):
        super().__init__(datasets_to_split=list(split))
        self.shards, self.split = shards, split

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        out = [{} for _ in range(world_size)]
        for name, ds in datasets.items():
            for rank in range(world_size):
                mine = owned(rank, world_size, self.shards) if name in self.split else None
                part = ds if mine is None else ds.map_batches(
                    only, fn_kwargs={"shards": mine}, batch_format="pyarrow")
                out[rank][name] = part.iterator()
        return out


def held_rows(name: str, schema: pa.Schema) -> pa.Table:
    """This worker's rows of the trainer's dataset ``name`` (all of them in Ray Train's local
    mode, one process holding every shard), as one table of ``schema``."""
    import ray.train

    batches = list(ray.train.get_dataset_shard(name).iter_batches(batch_format="pyarrow",
                                                                  batch_size=None))
    return pa.concat_tables([b.select(schema.names).cast(schema) for b in batches]) if batches \
        else schema.empty_table()
