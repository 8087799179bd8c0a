"""Serving models by MLflow registry reference: ``models:/NAME@champion`` for the target and
the block drafter, resolved inside the actors and the server from the app's MLflow store."""

from __future__ import annotations

import pytest

from specdec.engine.settings import GenerationParams
from tests.cluster.extra_apps import SMALL, extra_app

PROMPT = "hello world hello world, hello"


def register_directory(client, experiment_id: str, directory, name: str) -> None:
    """Log a model directory as a run's artifacts and make it ``name@champion``."""
    import mlflow

    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_artifacts(str(directory), "model")
    client.create_registered_model(name)
    version = client.create_model_version(name, source=f"{run.info.artifact_uri}/model",
                                          run_id=run.info.run_id)
    client.set_registered_model_alias(name, "champion", version.version)


@pytest.fixture(scope="module")
def store(served, tiny_root, tmp_path_factory):
    import mlflow

    root = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("serving", artifact_location=str(root / "artifacts"))
    client = mlflow.MlflowClient()
    register_directory(client, experiment, tiny_root / "target", "tiny-target")
    register_directory(client, experiment, tiny_root / "block-drafter", "tiny-block-drafter")
    return uri


def test_served_registry_models_equal_the_engine(served, store, engine, client):
    import requests

    args = {"target": "models:/tiny-target@champion",
            "drafter": "models:/tiny-block-drafter@champion", "mlflow_tracking_uri": store,
            "model_id": "tiny", "dtype": "float64", **SMALL}
    with extra_app(served, "registry", args) as url:
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24}
        out = requests.post(f"{url}/v1/completions", json=body, timeout=120).json()
    ids = engine.target_worker.target_model.tokenizer(PROMPT)["input_ids"]
    expected = engine.generate(ids, GenerationParams(24)).token_ids
    assert out["choices"][0]["token_ids"] == expected
    assert out["spec_decode"]["drafted"] > 0  # the registered block drafter did draft
