"""The committed default pair: registration on first use is idempotent and follows changed
files; ``serve_args`` serves the pair from the registry when it is there, the config otherwise."""

from __future__ import annotations

import json
import shutil

import mlflow
import pytest
import torch
from safetensors.torch import load_file, save_file

from cluster.default_pair import (
    HASH_TAG,
    PACER_FALLBACK,
    content_hash,
    ensure_registered,
    serve_args,
)
from pipelines.export_default import export

ARGS = {"target": "smollm2-135m", "drafter": "ngram",
        "speculative": {"policy": "fixed", "gamma": 4}}


@pytest.fixture(scope="module")
def exported(tiny_pair_sources, tmp_path_factory):
    src = tiny_pair_sources
    return export(src["drafter"], src["preverifier"], tmp_path_factory.mktemp("export") / "pair",
                  src["pacer_defaults"])


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('registry') / 'mlflow.db'}"


def versions(client, name: str) -> list[str]:
    return sorted(int(v.version) for v in client.search_model_versions(f"name = '{name}'"))


def champion(client, name: str):
    return client.get_model_version_by_alias(name, "champion")


def test_registration_is_idempotent_and_follows_changed_files(exported, uri, tmp_path):
    artifacts = shutil.copytree(exported, tmp_path / "idem-pair")
    client = mlflow.MlflowClient(uri)
    drafter, pre = "idem-pair-block-drafter", "idem-pair-preverifier"
    assert ensure_registered(artifacts, uri)["preverifier"] == f"models:/{pre}@champion"
    assert versions(client, drafter) == versions(client, pre) == [1]
    assert champion(client, pre).tags[HASH_TAG] == content_hash(artifacts / "preverifier")

    ensure_registered(artifacts, uri)  # nothing changed: nothing new
    assert versions(client, drafter) == versions(client, pre) == [1]

    weights = artifacts / "preverifier" / "model.safetensors"
    state = load_file(weights)
    save_file({k: v + 1 if v.is_floating_point() else v for k, v in state.items()}, weights)
    ensure_registered(artifacts, uri)
    assert versions(client, drafter) == [1] and versions(client, pre) == [1, 2]
    assert int(champion(client, pre).version) == 2
    assert champion(client, pre).tags[HASH_TAG] == content_hash(artifacts / "preverifier")
    local = mlflow.artifacts.download_artifacts(f"models:/{pre}@champion", tracking_uri=uri,
                                                dst_path=str(tmp_path / "dl"))
    assert torch.equal(load_file(f"{local}/model.safetensors")["head.bias"],
                       load_file(weights)["head.bias"])


def test_serve_args_serve_the_pair_from_the_registry(exported, uri, capsys):
    args = serve_args({**ARGS, "mlflow_tracking_uri": uri}, exported)
    assert args["drafter"] == "models:/pair-block-drafter@champion"
    assert args["preverifier"] == "models:/pair-preverifier@champion"
    assert args["mlflow_tracking_uri"] == uri
    pacer = json.loads((exported / "pacer_defaults.json").read_text())
    assert args["speculative"] == {"gamma": 4, **pacer}
    assert "serving the trained default pair" in capsys.readouterr().out


def test_serve_args_without_pacer_defaults_use_the_fallback(exported, uri, tmp_path):
    artifacts = shutil.copytree(exported, tmp_path / "pair")
    (artifacts / "pacer_defaults.json").unlink()
    args = serve_args({**ARGS, "mlflow_tracking_uri": uri}, artifacts)
    assert args["speculative"] == {"gamma": 4, **PACER_FALLBACK}


def test_serve_args_without_artifacts_serve_the_config(tmp_path, capsys):
    assert serve_args(ARGS, tmp_path / "absent") == ARGS
    assert "no trained default pair" in capsys.readouterr().out
    assert serve_args(ARGS, None) == ARGS


@pytest.mark.parametrize("drafter", ["suffix", "hybrid"])
def test_serve_args_serve_the_suffix_index_from_the_registry(exported, uri, tmp_path, drafter):
    from specdec.models.suffix_index import SuffixIndex

    artifacts = shutil.copytree(exported, tmp_path / "sfx-pair")
    SuffixIndex(((1, 2, 3),), "tiny", 300).save(artifacts / "suffix-index")
    args = serve_args({**ARGS, "mlflow_tracking_uri": uri}, artifacts, drafter)
    assert args["drafter"] == drafter
    assert args["suffix"]["index"] == "models:/sfx-pair-suffix-index@champion"
    assert args["speculative"]["policy"] == "fixed"
    assert args["speculative"]["gamma"] == args["speculative"]["max_draft"]
    assert ("block_drafter" in args) == (drafter == "hybrid")
    local = mlflow.artifacts.download_artifacts(args["suffix"]["index"], tracking_uri=uri,
                                                dst_path=str(tmp_path / "dl"))
    assert SuffixIndex.load(local).sequences == ((1, 2, 3),)
    block = serve_args({**ARGS, "mlflow_tracking_uri": uri}, artifacts, "block")
    assert block["drafter"] == "models:/sfx-pair-block-drafter@champion" and "suffix" not in block


def test_serve_args_serve_the_suffix_acceptance_model_unless_turned_off(exported, uri, tmp_path):
    """A pair that holds the suffix drafter's acceptance model serves it (PACER's rule on it),
    registered as <pair>-acceptance-suffix; ``acceptance=False`` serves the suffix drafter as
    without it, and neither the block drafter nor the hybrid takes it."""
    from cluster.schema import ServeArgs
    from specdec.models.acceptance import AcceptanceConfig, AcceptanceModel
    from specdec.models.preverifier import PreVerifier
    from specdec.models.suffix_index import SuffixIndex

    artifacts = shutil.copytree(exported, tmp_path / "acc-pair")
    SuffixIndex(((1, 2, 3),), "tiny", 300).save(artifacts / "suffix-index")
    config = AcceptanceConfig("suffix", 64, 4, width=16, heads=2, max_positions=8)
    AcceptanceModel(config, PreVerifier(config.net_config()), torch.zeros(300, 64)).save(
        artifacts / "acceptance-suffix", torch.bfloat16)
    args = serve_args({**ARGS, "mlflow_tracking_uri": uri}, artifacts, "suffix")
    assert args["acceptance"] == "models:/acc-pair-acceptance-suffix@champion"
    assert args["speculative"]["policy"] == "pacer"
    assert ServeArgs.model_validate(args).acceptance == args["acceptance"]
    local = mlflow.artifacts.download_artifacts(args["acceptance"], tracking_uri=uri,
                                                dst_path=str(tmp_path / "dl"))
    assert AcceptanceModel.load(local, torch.zeros(300, 64)).config == config
    off = serve_args({**ARGS, "mlflow_tracking_uri": uri}, artifacts, "suffix", acceptance=False)
    assert "acceptance" not in off and off["speculative"]["policy"] == "fixed"
    for drafter in ("hybrid", "block"):
        assert "acceptance" not in serve_args({**ARGS, "mlflow_tracking_uri": uri}, artifacts,
                                              drafter)
    with pytest.raises(ValueError, match="acceptance needs a drafter run on the target"):
        ServeArgs.model_validate({**args, "drafter_placement": "actor"})
