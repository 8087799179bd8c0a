"""Benchmarks, as three harnesses run as ``python -m bench.NAME`` (the current numbers:
docs/RESULTS.md; every run: docs/BENCHMARKS.md):

- engine (``bench.engine``; ``config``, ``methods``, ``journal``, ``metrics``): every method in
  one process on HumanEval and ShareGPT prompts, journaled so a run resumes;
- served (``bench.batching``): the served default and plain AR over HTTP at concurrency levels;
- passes (``bench.passes``): the target's passes alone; ``--ceiling`` prices the served loop on them.

Shared: ``humaneval`` (prompts, pass@1), ``report`` (machine, command, the report writer),
``passes.interleaved`` (arms timed in turn). ``gpu_check`` checks the GPU path stage by
stage (docs/GPU.md). The top layer: it may import every layer below; nothing imports it.
"""
