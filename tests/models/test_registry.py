"""models:/NAME@ALIAS resolves to a local directory through a real (tmp) MLflow store."""

from __future__ import annotations

import mlflow
import pytest

from specdec.models.preverifier import PreVerifier, PreVerifierConfig
from specdec.models.registry import is_registry_ref, resolve_model_ref


def test_plain_references_pass_through():
    assert resolve_model_ref("/some/dir") == "/some/dir"
    assert resolve_model_ref(None) is None
    assert not is_registry_ref("smollm2-135m") and is_registry_ref("models:/x@champion")


def test_alias_resolves_to_the_logged_directory(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "art"))
    model_dir = PreVerifier(PreVerifierConfig(input_size=8, width=8, heads=2)).save(tmp_path / "pv")
    with mlflow.start_run(experiment_id=exp) as run:
        mlflow.log_artifacts(str(model_dir), artifact_path="preverifier")
    client.create_registered_model("tiny-preverifier")
    v = client.create_model_version("tiny-preverifier", f"{run.info.artifact_uri}/preverifier",
                                    run_id=run.info.run_id)
    client.set_registered_model_alias("tiny-preverifier", "champion", v.version)
    local = resolve_model_ref("models:/tiny-preverifier@champion", uri, tmp_path / "cache")
    assert PreVerifier.load(local).c.input_size == 8
    with pytest.raises(FileNotFoundError, match="models:/tiny-preverifier@nope"):
        resolve_model_ref("models:/tiny-preverifier@nope", uri, tmp_path / "cache")
