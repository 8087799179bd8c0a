"""Ray Data / Ray Train jobs: the corpus, the target's responses, the suffix index, drafter and
pre-verifier training, the SD simulation, evaluation and the PACER/ASD sweep, and the export of
the default pair (training issue #4, default pair issue #5).

Every module in this folder is a job, ``python -m pipelines.NAME --config configs/train/NAME.yaml``
(see docs/PIPELINES.md), except ``jobs`` (the jobs by name, with their config schemas) and
``train_default`` (the whole chain, each job in a subprocess). What the jobs share lives in
``pipelines.common``; a job imports helpers from there, never another job. Models and
algorithms live in ``specdec`` (never Ray); this layer adds Ray, Parquet, MLflow and strict
configs. It never imports ``cluster/`` (serving) or ``bench/`` (benchmarks).
"""
