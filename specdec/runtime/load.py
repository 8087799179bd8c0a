"""Build the runtime a plan describes: its backend, the weights as that backend runs them, the
KV pool, and the forward over them."""

from __future__ import annotations

from collections.abc import Sequence

from specdec.runtime.backend import Backend
from specdec.runtime.forward import Forward
from specdec.runtime.plan import Plan
from specdec.runtime.pool import KVPool
from specdec.runtime.threads import ThreadGovernor
from specdec.runtime.weights import Weights


def make_backend(plan: Plan) -> Backend:
    """The plan's backend; the x86 package is imported only for an x86 plan."""
    if plan.backend == "x86":
        from specdec.runtime.x86.backend import X86Backend
        return X86Backend(plan)
    return Backend()


def load_forward(model, plan: Plan, blocks: dict | None = None,
                 tap_layers: Sequence[int] = ()) -> Forward:
    """The forward of a loaded transformers ``model`` (on the plan's device, in its dtype) as
    ``plan`` says; ``blocks``: its GGUF blocks by parameter name, where the plan runs them."""
    dtype = next(model.parameters()).dtype
    if dtype != plan.torch_dtype:
        raise ValueError(f"the plan runs {plan.dtype} passes; the model is {dtype}")
    backend = make_backend(plan)
    weights = Weights.from_hf(model, backend, blocks, plan.max_model_len)
    backend.prepare(weights)
    s = weights.shape
    pool = KVPool(s.layers, plan.slots, s.kv_heads, plan.max_model_len, s.head_dim,
                  plan.kv_torch_dtype, weights.embed.device)
    governor = ThreadGovernor(plan.threads) if plan.threads_by_load else None
    return Forward(weights, pool, backend, tap_layers, governor)
