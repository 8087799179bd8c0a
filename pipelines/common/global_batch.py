"""The global batch of a data-parallel training step and each worker's part of it.

What this is: how the training jobs draw a step's examples so that the number of workers does
not change what is trained. The rows sit in ``S`` shards (``pipelines.common.shards``); slot
``j`` of a step's global batch of ``B`` draws from shard ``j * S / B``, its row from a generator
seeded by the run's seed and the step index only, identically on every worker. Worker ``r`` of
``W`` computes the slots ``[r * B / W, (r + 1) * B / W)``, which draw from exactly the shards it
holds. Each worker's loss is a sum over its slots divided by the global batch's normaliser
(``global_sum``), so the gradients averaged over the workers are those of one worker with the
whole batch, up to the order of float sums; and a run restarted at step ``k`` draws at ``k``
what an uninterrupted run draws there. Slots draw uniformly within their shard, and the shards
are of about equal size (a hash splits them), so every row is about equally likely.

What this is not: no data loading, no model, no optimiser; the jobs own those.
"""

from __future__ import annotations

import torch

SEED_STRIDE = 1_000_003  # a prime: (seed, step) pairs map to distinct generator seeds


def step_generator(seed: int, step: int, slot: int = 0) -> torch.Generator:
    """The generator of 0-based ``step``'s draws (``slot``: one of the global batch's examples,
    for draws made per example, e.g. its anchors)."""
    return torch.Generator().manual_seed((seed * SEED_STRIDE + step) * SEED_STRIDE + slot + 1)


def shard_draws(seed: int, step: int, shards: int, sizes: dict[int, int], batch: int,
                slots: range) -> list[tuple[int, int]]:
    """-> (shard, row within the shard) of each of ``slots`` of 0-based ``step``'s global batch
    of ``batch`` over ``shards`` shards, ``sizes`` the row counts of (at least) the shards the
    slots draw from: the same on every worker that computes a slot."""
    if batch % shards:
        raise ValueError(f"batch_size {batch} is not divisible by data_shards {shards}")
    draws = torch.randint(2**62, (batch,), generator=step_generator(seed, step)).tolist()
    out = []
    for j in slots:
        shard = j * shards // batch
        if not sizes.get(shard):
            raise ValueError(f"data shard {shard} holds no training rows: use fewer data_shards")
        out.append((shard, draws[j] % sizes[shard]))
    return out


def worker_slots(batch: int, rank: int, world: int) -> range:
    """The slots of the global batch that worker ``rank`` of ``world`` computes."""
    if batch % world:
        raise ValueError(f"batch_size {batch} is not divisible by {world} workers")
    per = batch // world
    return range(rank * per, (rank + 1) * per)


def global_sum(value: torch.Tensor, world: int) -> torch.Tensor:
    """The sum of a tensor over the workers (an all-reduce, on the GPU under NCCL; itself with
    one worker), on ``value``'s device."""
    if world == 1:
        return value
    nccl = torch.distributed.get_backend() == "nccl"
    total = value.detach().to("cuda" if nccl else "cpu", copy=True)
    torch.distributed.all_reduce(total)
    return total.to(value.device)
