"""Benchmarks: how fast each path decodes, measured on the same prompts (issues 3, 5, 14, 15).

Each benchmark is a module run as ``python -m bench.NAME`` (commands and the latest numbers:
docs/BENCHMARKS.md):

- ``engine``: every method (AR, HF ``generate``, prompt lookup, n-gram, suffix, fixed windows,
  the heuristic, PACER, PACER + ASD, the ablations) in one process on HumanEval and ShareGPT
  prompts, journaled so a run resumes; ``config``, ``methods``, ``journal``, ``metrics``,
  ``humaneval`` (pass@1), ``plots`` and ``report`` are its parts.
- ``serve``: the served path (HTTP -> Serve -> actors) against the in-process engine.
- ``runtime``: specdec's own target forward against transformers'.
- ``gpu_check``: the GPU path on one CUDA device, stage by stage (the tiny pair, the served
  target's speed and equality per dtype, a shortened drafter training); docs/GPU.md.
- ``suffix_replay``: the suffix drafter's accepted length replayed from greedy outputs (no
  timing).

This is the top layer: it may import ``cluster/`` (the served path), ``pipelines.common``
(configs, Parquet formats, MLflow logging), ``actors/`` and ``specdec/``; nothing imports it
(``tests/test_layering.py``). It imports no job module: what a benchmark shares with a job lives
in ``pipelines.common``.
"""
