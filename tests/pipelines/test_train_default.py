"""The default-pair driver's bookkeeping, with the jobs faked: which stages run, what a stage's
record holds (MLflow run, metrics, registered version, wall time of failed attempts), and how
``champion`` follows the recorded versions. The real chain is ``make pipelines-tiny``'s."""

from __future__ import annotations

import time
from types import SimpleNamespace

import mlflow
import pytest

from pipelines import train_default as td
from pipelines.common.config import MlflowSettings
from pipelines.common.tracking import register, start_run

FULL = {"stages": {s: {} for s in td.STAGES}, "failed_s": {}}


def test_plan_runs_from_the_given_stage_only_after_recorded_stages():
    assert td.plan("corpus", {"stages": {}}) == list(td.STAGES)
    done = {"stages": {"corpus": {}, "responses": {}, "train_drafter": {}}}
    assert td.plan("simulate", done) == ["simulate", "train_preverifier", "evaluate",
                                         "suffix_index", "simulate.suffix",
                                         "train_preverifier.acceptance"]
    assert td.plan("export", FULL) == []
    with pytest.raises(ValueError, match="start from responses"):
        td.plan("simulate", {"stages": {"corpus": {}}})
    with pytest.raises(ValueError, match="choose one of"):
        td.plan("benchmark", FULL)


def fake_job(uri: str, code: int = 0, model: str | None = None, seconds: float = 0.0):
    """Stands in for ``subprocess.run``: logs a tagged run (and registers ``model``)."""
    def run(command, env):
        assert env["RAY_AUTH_MODE"] == "disabled"
        settings = MlflowSettings(tracking_uri=uri, experiment="t")
        with start_run(settings, command[2].removeprefix("pipelines.")) as run_:
            mlflow.log_metric("loss", 0.25)
            mlflow.log_param("lr", 0.001)
            if model:
                mlflow.log_text("weights", "m/weights.txt")
                register(settings, model, run_, "m")
        time.sleep(seconds)
        return SimpleNamespace(returncode=code)
    return run


def test_stage_records_and_champion(store, tmp_path, monkeypatch):
    uri = store["tracking_uri"]
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    for job, extra in [("corpus", ""), ("train_preverifier", "data: x\n"),
                       ("train_preverifier.acceptance", "data: y\n")]:
        (tmp_path / f"{job}.yaml").write_text(f"{extra}mlflow: {{tracking_uri: '{uri}', "
                                              "experiment: t}\n")
    state = td.load_state()

    monkeypatch.setattr(td.subprocess, "run", fake_job(uri, code=1, seconds=0.2))
    with pytest.raises(SystemExit, match="continue with --from corpus"):
        td.run_stage("corpus", tmp_path / "corpus.yaml", state)
    assert td.load_state()["failed_s"]["corpus"] >= 0.2 and "corpus" not in state["stages"]

    monkeypatch.setattr(td.subprocess, "run", fake_job(uri))
    td.run_stage("corpus", tmp_path / "corpus.yaml", state)
    record = td.load_state()["stages"]["corpus"]
    assert record["metrics"] == {"loss": 0.25} and record["failed_attempts_s"] >= 0.2
    assert record["command"].endswith(f"-m pipelines.corpus --config {tmp_path / 'corpus.yaml'}")

    monkeypatch.setattr(td.subprocess, "run", fake_job(uri, model="fake-preverifier"))
    td.run_stage("train_preverifier", tmp_path / "train_preverifier.yaml", state)
    assert state["stages"]["train_preverifier"]["model_version"] == "models:/fake-preverifier/1"
    td.point_champions(state, uri)
    champion = mlflow.MlflowClient(uri).get_model_version_by_alias("fake-preverifier", "champion")
    assert int(champion.version) == 1

    # a stage JOB.VARIANT runs pipelines.JOB on its own config, recorded under its own name
    monkeypatch.setattr(td.subprocess, "run", fake_job(uri, model="fake-acceptance"))
    td.run_stage("train_preverifier.acceptance", tmp_path / "train_preverifier.acceptance.yaml",
                 state)
    record = state["stages"]["train_preverifier.acceptance"]
    assert record["command"].endswith("-m pipelines.train_preverifier --config "
                                      f"{tmp_path / 'train_preverifier.acceptance.yaml'}")
    assert record["model_version"] == "models:/fake-acceptance/1"
    assert state["stages"]["train_preverifier"]["model_version"] == "models:/fake-preverifier/1"

    settings = td.mlflow_settings(tmp_path / "train_preverifier.yaml")
    run_id = state["stages"]["train_preverifier"]["mlflow_run"]
    record = td.adopted("train_preverifier", [run_id], settings)
    assert record["model_version"] == "models:/fake-preverifier/1"
    assert record["metrics"] == {"loss": 0.25} and record["wall_s"] >= 0
    assert record["config"] == {"lr": "0.001"}  # the run's params
    with pytest.raises(ValueError, match="not an ended simulate run"):
        td.adopted("simulate", [run_id], settings)
    # a run that handed back offline training counts that time too
    mlflow.MlflowClient(uri).log_metric(run_id, "offline_seconds", 100.0)
    record = td.adopted("train_preverifier", [run_id], settings)
    assert record["offline_s"] == 100.0 and 100.0 <= record["wall_s"] < 200.0
