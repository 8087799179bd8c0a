"""The training jobs by name and their config schemas (not a job itself): ``train_default``
reads a stage's MLflow settings through it, and the config test parses every YAML under
configs/train against the schema its file name selects."""

from __future__ import annotations

from pipelines.corpus import CorpusConfig
from pipelines.evaluate import EvaluateConfig
from pipelines.evaluate_acceptance import EvaluateAcceptanceConfig
from pipelines.responses import ResponsesConfig
from pipelines.simulate import SimulateConfig
from pipelines.suffix_index import SuffixIndexConfig
from pipelines.train_drafter import TrainDrafterConfig
from pipelines.train_preverifier import TrainPreVerifierConfig

SCHEMAS = {
    "corpus": CorpusConfig,
    "responses": ResponsesConfig,
    "suffix_index": SuffixIndexConfig,
    "train_drafter": TrainDrafterConfig,
    "simulate": SimulateConfig,
    "train_preverifier": TrainPreVerifierConfig,
    "evaluate": EvaluateConfig,
    "evaluate_acceptance": EvaluateAcceptanceConfig,
}


def schema_for(filename_stem: str):
    """``train_drafter`` or ``train_drafter.dflash`` -> TrainDrafterConfig."""
    job = filename_stem.split(".")[0]
    if job not in SCHEMAS:
        raise ValueError(f"no job named {job!r} (from file {filename_stem!r}); "
                         f"jobs: {sorted(SCHEMAS)}")
    return SCHEMAS[job]
