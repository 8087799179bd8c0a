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
