"""Ray Data / Ray Train jobs: SD-simulation datasets, pre-verifier and drafter training,
evaluation and benchmarks (training issue #4, benchmark issue #5).

The training chain is corpus -> train_drafter -> simulate -> train_preverifier -> evaluate; each
job is ``python -m pipelines.NAME --config configs/train/NAME.yaml`` (see docs/PIPELINES.md).
Models and algorithms live in ``specdec`` (never Ray); this layer adds Ray, Parquet, MLflow and
strict configs.
"""
