"""specdec's own target runtime: a Llama-family forward over a KV slot pool, batch-first.

The portable core: ``plan`` (one resolved plan: every ``auto`` decided once), ``batch`` (rows and
how a batch is laid out), ``pool`` (the KV slots), ``weights`` (which configs it runs, their RoPE
and weights), ``backend`` (the seam to the hardware, and the torch backend), ``forward`` (one
ragged, optionally tree-masked pass) and ``load`` (a plan made real). The x86 backend is a
package of its own (``x86``), imported only by an x86 plan. transformers stays the loader and
the reference the tests compare against; its forward is not on this path. It never imports ray.
"""

from specdec.runtime.batch import SHORT, Row, RowOutput
from specdec.runtime.forward import Forward
from specdec.runtime.load import load_forward
from specdec.runtime.plan import Plan, PlanError, RuntimeConfig, resolve_plan
from specdec.runtime.pool import KVPool, PoolFull
from specdec.runtime.weights import Weights, unsupported

__all__ = ["SHORT", "Forward", "KVPool", "Plan", "PlanError", "PoolFull", "Row", "RowOutput",
           "RuntimeConfig", "Weights", "load_forward", "resolve_plan", "unsupported"]
