"""What the jobs share: strict YAML configs and their common sections (``config``), Parquet I/O
(``tables``) and the files the jobs hand each other (``formats``), the raw prompt sources
(``datasets``), speculative settings as YAML writes them (``settings``), Ray Data actor pools
(``pools``), Ray Train checkpoints (``checkpoints``), MLflow logging (``tracking``, over
``specdec.models.registry``) and MLflow plots (``plots``).

No module here is a job, and none imports one; the benchmarks (``bench/``) import from here too.
"""
