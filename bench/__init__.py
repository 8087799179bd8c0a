"""Benchmarks: how fast each path decodes, as three harnesses run as ``python -m bench.NAME``
(the current numbers: docs/RESULTS.md; every run: docs/BENCHMARKS.md):

- engine (``bench.engine``): every method (AR, HF ``generate``, prompt lookup, n-gram, suffix,
  fixed windows, the heuristic, PACER, PACER + ASD, the ablations) in one process on HumanEval
  and ShareGPT prompts, journaled so a run resumes; ``config``, ``methods``, ``journal``,
  ``metrics``, ``drift``, ``plots`` are its parts. ``gpu_check`` checks the GPU path on one
  CUDA device, stage by stage (docs/GPU.md).
- served (``bench.batching``): the served default and plain AR over HTTP at concurrency levels,
  with variants, against the in-process engine.
- passes (``bench.passes``): the target's passes alone, each arm a way to load it;
  ``ceiling`` prices the served loop on its timer.

Shared by all three: ``humaneval`` (the prompts and pass@1), ``report`` (the machine
description, the date, the command line, the report writer and the goal table),
``passes.interleaved`` (arms timed in turn).

This is the top layer: it may import ``cluster/`` (the served path), ``pipelines.common``
(configs, Parquet formats, MLflow logging), ``actors/`` and ``specdec/``; nothing imports it
(``tests/test_layering.py``). It imports no job module: what a benchmark shares with a job lives
in ``pipelines.common``.
"""
