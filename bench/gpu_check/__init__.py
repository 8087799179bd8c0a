"""The GPU check: ``python -m bench.gpu_check --out DIR`` runs specdec's GPU path on one device
stage by stage (``run.STAGES``: the tiny pair in ``tiny``, the served target in ``model``, a
shortened drafter training in ``training``) and rewrites ``DIR/gpu_check.json`` after each
(``report``); ``bring`` carries what a bare machine lacks. docs/GPU.md: each stage and how to run
it. Not a benchmark of record (few prompts, one run) nor a test of served HTTP; it needs no Ray,
MLflow or network.
"""
