"""The committed default pair (artifacts/smollm2-135m): within the size budget, bfloat16 weights
(integer buffers kept), a block-drafter and a pre-verifier checkpoint, and a provenance that
says how they were made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1] / "artifacts" / "smollm2-135m"
pytestmark = pytest.mark.skipif(not ROOT.is_dir(), reason="no committed default pair")


def test_size_and_layout():
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    assert total <= 30_000_000, total
    for part, config in (("drafter", "block_drafter.json"), ("preverifier", "preverifier.json")):
        assert (ROOT / part / config).is_file() and (ROOT / part / "model.safetensors").is_file()


@pytest.mark.parametrize("part", ["drafter", "preverifier"])
def test_weights_are_bfloat16_except_integer_buffers(part):
    with safe_open(ROOT / part / "model.safetensors", "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    floats = {k: d for k, d in dtypes.items() if d.startswith(("F", "BF"))}
    assert floats and set(floats.values()) == {"BF16"}, floats
    if part == "drafter":
        assert dtypes["draft_to_target"] == "I64"


def test_provenance_names_data_steps_losses_and_command():
    p = json.loads((ROOT / "provenance.json").read_text())
    assert p["target"] == "smollm2-135m" and p["git"]["commit"]
    drafter = p["stages"]["train_drafter"]
    assert int(drafter["config"]["steps"]) > 0 and "loss" in drafter["metrics"]
    assert p["stages"]["train_preverifier"]["metrics"]
    assert "train.parquet" in drafter["config"]["corpus"]
    assert p["wall_s"]["total"] > 0
    defaults = json.loads((ROOT / "pacer_defaults.json").read_text())
    assert defaults["policy"] == "pacer"


def test_suffix_index_loads_and_says_what_it_holds():
    from specdec.models.suffix_index import SuffixIndex

    index = SuffixIndex.load(ROOT / "suffix-index")
    assert index.target == "smollm2-135m" and index.vocab_size == 49152
    assert len(index.sequences) == 800 and index.num_tokens > 50_000  # pipelines.suffix_index
    assert index.meta["source"] == "train.parquet"
