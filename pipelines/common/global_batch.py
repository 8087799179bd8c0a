"""The global batch of a data-parallel training step and each worker's part of it.

What this is: how the training jobs draw a step's examples so that the number of workers does
not change what is trained. A step's global batch of ``B`` example indices is drawn from a
generator seeded by the run's seed and the step index only, identically on every worker; worker
``r`` of ``W`` takes the slots ``[r * B / W, (r + 1) * B / W)``. Each worker's loss is a sum over
its slots divided by the global batch's normaliser (``global_sum``), so the gradients averaged
over the workers are those of one worker with the whole batch, up to the order of float sums;
and a run restarted at step ``k`` draws at ``k`` what an uninterrupted run draws there.

What this is not: no data loading, no model, no optimiser; the jobs own those.
"""

from __future__ import annotations

import torch

SEED_STRIDE = 1_000_003  # a prime: (seed, step) pairs map to distinct generator seeds


def step_generator(seed: int, step: int, slot: int = 0) -> torch.Generator:
    """The generator of 0-based ``step``'s draws (``slot``: one of the global batch's examples,
    for draws made per example, e.g. its anchors)."""
    return torch.Generator().manual_seed((seed * SEED_STRIDE + step) * SEED_STRIDE + slot + 1)


def global_rows(seed: int, step: int, population: int, batch: int) -> torch.Tensor:
    """-> [batch] indices into ``population`` examples, drawn with replacement, the same on
    every worker."""
    return torch.randint(population, (batch,), generator=step_generator(seed, step))


def worker_slots(batch: int, rank: int, world: int) -> range:
    """The slots of the global batch that worker ``rank`` of ``world`` computes."""
    if batch % world:
        raise ValueError(f"batch_size {batch} is not divisible by {world} workers")
    per = batch // world
    return range(rank * per, (rank + 1) * per)


def global_sum(value: torch.Tensor, world: int) -> torch.Tensor:
    """The sum of a scalar over the workers (an all-reduce, on the GPU under NCCL; itself with
    one worker), on ``value``'s device."""
    if world == 1:
        return value
    nccl = torch.distributed.get_backend() == "nccl"
    total = value.detach().to("cuda" if nccl else "cpu", copy=True)
    torch.distributed.all_reduce(total)
    return total.to(value.device)
