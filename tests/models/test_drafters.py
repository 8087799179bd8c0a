"""The drafter catalog: kinds by reference, what each needs, tap layers without weights."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from specdec.engine.loading import target_taps
from specdec.models.block_drafter import CONFIG_FILE, BlockDrafterConfig
from specdec.models.drafters import DRAFTERS, DrafterArgs, build_drafter, drafter_taps
from specdec.models.ngram import NgramDrafter

CONFIG = BlockDrafterConfig(hidden_size=8, feature_size=8, intermediate_size=16, num_layers=1,
                            num_heads=2, num_kv_heads=1, head_dim=4, block_size=4,
                            tap_layers=(0, 2), vocab_size=32)


@pytest.fixture
def config_only(tmp_path):
    """A block-drafter directory holding its config file and no weights at all."""
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"config": asdict(CONFIG), "target": None}))
    return str(tmp_path)


def test_a_block_drafters_tap_layers_come_from_its_config_alone(config_only):
    assert DRAFTERS.resolve(config_only).name == "block"
    assert target_taps(config_only) == (0, 2)
    assert target_taps("hybrid", block_drafter=config_only) == (0, 2)
    assert drafter_taps(DrafterArgs("ngram")) == () and target_taps("none") == ()


def test_hybrid_taps_need_its_block_drafter():
    with pytest.raises(ValueError, match="block_drafter"):
        target_taps("hybrid")


def test_what_each_kind_needs():
    needs = {name: DRAFTERS.get(name).needs for name in DRAFTERS.names()}
    assert "target_weights" in needs["block"] and "target_weights" in needs["self"]
    assert needs["ngram"] == {"vocab"} and needs["none"] == frozenset()
    assert {n for n, need in needs.items() if "target_features" in need} == {"block", "hybrid"}


def test_build_without_the_target(config_only):
    assert build_drafter(DrafterArgs("none"), None) is None
    assert isinstance(build_drafter(DrafterArgs("ngram", vocab_size=32), None), NgramDrafter)
    with pytest.raises(ValueError, match="needs the target's weights"):
        build_drafter(DrafterArgs(config_only), None)
