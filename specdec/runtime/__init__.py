"""specdec's own target runtime: a Llama-family forward over a KV slot pool, batch-first.

``weights`` (which configs it runs, their RoPE and weight layout), ``pool`` (the KV slots),
``model`` (one ragged, optionally tree-masked pass). transformers stays the loader and the
reference the tests compare against; its forward is not on this path. It never imports ray.
"""

from specdec.runtime.model import KV_CACHE_DTYPES, Forward, Row, RowOutput, cache_dtype
from specdec.runtime.pool import KVPool, PoolFull
from specdec.runtime.weights import Weights, unsupported

__all__ = ["KV_CACHE_DTYPES", "Forward", "KVPool", "PoolFull", "Row", "RowOutput", "Weights",
           "cache_dtype", "unsupported"]
