"""MLflow for the jobs: an absolute tracking URI, runs, plots, registration and aliases.

Default store: ``sqlite:///$SPECDEC_HOME/mlflow.db`` (absolute: a Ray job runs in a temporary
working directory) with artifacts in ``$SPECDEC_HOME/mlartifacts``; ``MLFLOW_TRACKING_URI`` or
the config's ``tracking_uri`` override it. Models are logged as safetensors directories (their
own ``save``), never pickled, and registered as model versions whose source is that directory.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pipelines.config import MlflowSettings
from specdec.models.sources import specdec_home


def tracking_uri(settings: MlflowSettings) -> str:
    uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    return uri or f"sqlite:///{specdec_home() / 'mlflow.db'}"


def start_run(settings: MlflowSettings, job: str):
    """Set the store and experiment, then start a run (a context manager)."""
    import mlflow

    uri = tracking_uri(settings)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(settings.experiment)
    if exp is None:
        artifacts = None
        if uri.startswith("sqlite:///"):
            artifacts = str(Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts")
        exp_id = client.create_experiment(settings.experiment, artifact_location=artifacts)
    else:
        exp_id = exp.experiment_id
    return mlflow.start_run(experiment_id=exp_id, run_name=settings.run_name or job,
                            tags={"specdec.job": job})


def log_params(params: dict, prefix: str = "") -> None:
    """Flatten a nested config into MLflow params (``loss.alpha`` = 0.5)."""
    import mlflow

    flat = {}

    def walk(d: dict, pre: str):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{pre}{k}.")
            else:
                flat[f"{pre}{k}"] = str(v)[:500]

    walk(params, prefix)
    mlflow.log_params(flat)


def log_figure(fig, name: str) -> None:
    import mlflow

    mlflow.log_figure(fig, f"plots/{name}.png")


def register(settings: MlflowSettings, default_name: str, run, artifact_path: str) -> str | None:
    """Register ``runs:/<run>/<artifact_path>`` as a new version; move ``champion`` if asked.
    Returns ``models:/NAME/VERSION`` or None when registration is off."""
    import mlflow

    if not settings.register_model:
        return None
    name = settings.model_name or default_name
    client = mlflow.MlflowClient()
    try:
        client.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(name)
    version = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/{artifact_path}", run_id=run.info.run_id)
    if settings.champion:
        client.set_registered_model_alias(name, "champion", version.version)
    return f"models:/{name}/{version.version}"


def git_state() -> dict:
    """The commit the code runs from and whether tracked files had changes (provenance of
    exports and benchmark results); ``{"commit": None, "dirty": None}`` outside a git clone."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
