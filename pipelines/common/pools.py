"""Ray Data over prompts with a pool of model-holding actors (``ActorPoolStrategy``).

``map_prompts`` turns rows into a Dataset (one block per few prompts), maps a callable class
over it with ``compute=ActorPoolStrategy(size=n)`` and the configured CPUs/GPUs per actor, and
gathers the result as one Arrow table (simulation outputs are small next to a corpus).
"""

from __future__ import annotations

import pyarrow as pa

from pipelines.common.config import Strict


class ActorSettings(Strict):
    size: int = 1  # actors in the pool
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    torch_threads: int = 1  # set explicitly: Ray sets OMP_NUM_THREADS from the CPU share
    batch_size: int = 1  # prompts per call


def ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False)


def map_prompts(rows: list[dict], actor_cls, ctor_kwargs: dict, actors: ActorSettings,
                schema: pa.Schema) -> pa.Table:
    import ray
    import ray.data

    ensure_ray()
    if not rows:
        return schema.empty_table()
    ds = ray.data.from_items(rows, override_num_blocks=min(len(rows), 4 * actors.size))
    out = ds.map_batches(actor_cls, fn_constructor_kwargs=ctor_kwargs,
                         compute=ray.data.ActorPoolStrategy(size=actors.size),
                         batch_size=actors.batch_size, batch_format="pyarrow",
                         num_cpus=actors.num_cpus, num_gpus=actors.num_gpus)
    tables = [t for t in ray.get(out.to_arrow_refs()) if t.num_rows]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables).select(schema.names).cast(schema)
