"""Bad input fails with the file or column named, before any long work starts."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pydantic import ValidationError

from pipelines import train_preverifier
from pipelines.common import steps
from pipelines.common.formats import load_prompts
from pipelines.common.tables import read_table, write_table
from pipelines.evaluate import EvaluateConfig
from pipelines.simulate import SimulateConfig
from pipelines.train_preverifier import TrainPreVerifierConfig


def test_missing_parquet_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        load_prompts(str(tmp_path / "nope.parquet"), None, "simulate.prompts")


def test_malformed_parquet_is_named(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ValueError, match="bad.parquet is not a readable Parquet"):
        train_preverifier.load_steps(str(bad), 20)


def test_schema_mismatch_names_the_column(tmp_path):
    path = write_table(pa.table({"id": ["a"], "prompt_ids": [[1.5, 2.5]]}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match="no column 'source'"):
        load_prompts(str(path), None, "simulate.prompts")
    schema = pa.schema([("prompt_ids", pa.list_(pa.int32()))])
    with pytest.raises(ValueError, match="column 'prompt_ids' .* expected list<item: int32>"):
        read_table(path, schema, "test")


@pytest.mark.parametrize("config, required", [
    (SimulateConfig, {"drafter": "d", "prompts": "p"}),
    (EvaluateConfig, {"drafter": "d", "prompts": "p"}),
    (TrainPreVerifierConfig, {"data": "s"}),
])
def test_a_bad_device_is_named(config, required):
    with pytest.raises(ValidationError, match="device\n.*a device is cpu, cuda, cuda:N or auto"):
        config(device="gpu", **required)
    assert config(device="cuda:1", **required).device == "cuda:1"


def test_a_suffix_index_without_the_suffix_drafter_and_acceptance_rows_without_signals(tmp_path):
    with pytest.raises(ValidationError, match="suffix_index is only read with drafter suffix"):
        SimulateConfig(drafter="ngram", prompts="p", suffix_index="i")
    assert SimulateConfig(drafter="ngram", prompts="p").records_acceptance
    assert not SimulateConfig(drafter="d", prompts="p").records_acceptance
    row = {"request": "r", "step": 0, "position": 0, "block": 0, "token": 1, "greedy": 1,
           "regret": 0.0, "accepted": 1, "hidden": [0.0] * 8}
    from pipelines.common.formats import ACCEPTANCE_META, STEPS_SCHEMA

    path = write_table(pa.Table.from_pylist([row], schema=STEPS_SCHEMA), tmp_path / "s.parquet",
                       {ACCEPTANCE_META: '{"drafter": "ngram", "root_size": 4}'})
    with pytest.raises(ValueError, match="s.parquet rows of 8 features hold no drafter signals"):
        steps.acceptance_of(str(path), "train_preverifier.data")
