"""Every serve YAML in configs/ names the builder and parses under the strict schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from cluster.schema import ServeArgs

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "serve").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_serve_configs_parse(path):
    for app in yaml.safe_load(path.read_text())["applications"]:
        assert app["import_path"] == "cluster.app:build_app"
        ServeArgs.model_validate(app["args"])


def test_configs_exist():
    assert {p.name for p in CONFIGS} >= {"local.yaml", "tiny.yaml"}


def test_unknown_keys_are_rejected():
    with pytest.raises(ValidationError, match="extra"):
        ServeArgs.model_validate({"target": "x", "drafterr": "ngram"})
    with pytest.raises(ValidationError):
        ServeArgs.model_validate({"target": "x", "speculative": {"gama": 3}})


def test_suffix_and_hybrid_args():
    ok = ServeArgs.model_validate({"target": "x", "drafter": "suffix",
                                   "suffix": {"index": "models:/x-suffix-index@champion"},
                                   "speculative": {"suffix_factor": 1.5, "hybrid_skip": 3}})
    assert ok.suffix.max_cached_requests > 0 and ok.speculative.suffix_min_prob == 0.05
    ServeArgs.model_validate({"target": "x", "drafter": "hybrid", "block_drafter": "d",
                              "preverifier": "p"})
    with pytest.raises(ValidationError, match="needs block_drafter and preverifier"):
        ServeArgs.model_validate({"target": "x", "drafter": "hybrid", "block_drafter": "d"})
    with pytest.raises(ValidationError, match="only read with drafter hybrid"):
        ServeArgs.model_validate({"target": "x", "drafter": "suffix", "block_drafter": "d"})
    with pytest.raises(ValidationError):
        ServeArgs.model_validate({"target": "x", "suffix": {"max_depht": 3}})


def test_drafter_placement():
    """A drafter without a model runs on the target unless told otherwise; any other drafter
    needs an actor of its own, and asking for the target is refused, naming the field."""
    def on_target(**args) -> bool:
        return ServeArgs.model_validate({"target": "x", **args}).drafter_on_target

    assert on_target(drafter="suffix") and on_target(drafter="ngram", drafter_placement="target")
    assert not on_target(drafter="ngram", drafter_placement="actor")
    assert not on_target(drafter="none") and not on_target(drafter="some/block-drafter")
    assert not on_target(drafter="hybrid", block_drafter="d", preverifier="p")
    with pytest.raises(ValidationError, match="drafter_placement target needs a drafter without"):
        ServeArgs.model_validate({"target": "x", "drafter": "hybrid", "block_drafter": "d",
                                  "preverifier": "p", "drafter_placement": "target"})
    with pytest.raises(ValidationError, match="drafter_placement"):
        ServeArgs.model_validate({"target": "x", "drafter_placement": "gpu"})


def test_attention_names_the_ways_a_batch_invariant_target_attends():
    assert ServeArgs.model_validate({"target": "x"}).attention == "auto"
    assert ServeArgs.model_validate({"target": "x", "attention": "per_query"}).attention == "per_query"
    with pytest.raises(ValidationError, match="attention"):
        ServeArgs.model_validate({"target": "x", "attention": "blocked"})


def test_local_default_drafter_is_known():
    doc = yaml.safe_load((CONFIGS[0].parent / "local.yaml").read_text())
    assert doc.get("default_drafter", "block") in ("block", "suffix", "hybrid")


def test_policy_and_verifier_names_come_from_the_catalogs():
    from specdec.algorithms.policies import POLICIES
    from specdec.algorithms.verify import VERIFIERS

    for name in POLICIES:
        ServeArgs.model_validate({"target": "x", "speculative": {"policy": name}})
    for name in VERIFIERS:
        ServeArgs.model_validate({"target": "x", "speculative": {"verify": name}})
    with pytest.raises(ValidationError, match="policy"):
        ServeArgs.model_validate({"target": "x", "speculative": {"policy": "eagle"}})
    with pytest.raises(ValidationError, match="verify"):
        ServeArgs.model_validate({"target": "x", "speculative": {"verify": "typical"}})


def test_built_in_references_are_the_drafter_catalogs_names():
    from cluster.app import BUILT_IN
    from specdec.models.drafters import DRAFTERS

    assert BUILT_IN == {*DRAFTERS.named(), "untrained"}
