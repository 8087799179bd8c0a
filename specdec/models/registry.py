"""The MLflow store and model registry, both sides: where the store is, resolving ``models:/``
references (read), and runs, model versions and the ``champion`` alias (write).

Read: ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` -> a local directory (downloaded with
``mlflow.artifacts.download_artifacts``); anything else is returned unchanged, so callers can
pass every reference through ``resolve_model_ref`` before ``specdec.engine.loading``.

Write: ``start_run`` opens a run in an experiment of the store, ``register`` makes the run's
artifact directory a new model version (and may move ``champion`` to it), ``set_champion``
moves the alias. The training jobs (``pipelines/``, through ``pipelines.common.tracking``,
which reads their strict MLflow config) and the serving layer (``cluster.default_pair``,
which registers the committed default pair) both write through here, so neither imports the
other.

The store is, in this order: the caller's ``uri``, ``$MLFLOW_TRACKING_URI``, or
``sqlite:///$SPECDEC_HOME/mlflow.db`` (absolute: a Ray job runs in a temporary working
directory), with artifacts in ``mlartifacts/`` next to the database. mlflow is imported lazily
and ray never: the core, the actors, the jobs and the serving layer can all call this module.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from specdec.models.sources import specdec_home

CHAMPION = "champion"  # the alias serving and the chain's later jobs load
DEFAULT_EXPERIMENT = "specdec"


def resolve_tracking_uri(uri: str | None = None) -> str:
    """The store: ``uri``, else ``$MLFLOW_TRACKING_URI``, else the sqlite file in specdec's home."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    return uri or f"sqlite:///{specdec_home() / 'mlflow.db'}"


def is_registry_ref(ref: str | None) -> bool:
    return bool(ref) and ref.startswith("models:/")


# ---- read -----------------------------------------------------------------------------------
def resolve_model_ref(ref: str | None, tracking_uri: str | None = None,
                      cache_dir: str | Path | None = None) -> str | None:
    if not is_registry_ref(ref):
        return ref
    import mlflow

    uri = resolve_tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    root = Path(cache_dir) if cache_dir else specdec_home() / "registry-cache"
    # a fresh folder per reference and store: an alias may move, so never reuse a stale copy
    key = hashlib.sha1(f"{uri}|{ref}".encode()).hexdigest()[:12]
    dst = root / key
    dst.mkdir(parents=True, exist_ok=True)
    try:
        return mlflow.artifacts.download_artifacts(artifact_uri=ref, dst_path=str(dst))
    except Exception as err:
        raise FileNotFoundError(f"cannot resolve {ref} in the MLflow store {uri}: {err}") from None


# ---- write ----------------------------------------------------------------------------------
def ensure_store_dir(uri: str) -> Path | None:
    """Create the folder of a ``sqlite:///`` store (a fresh clone has no $SPECDEC_HOME yet) and
    return it; None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    folder = Path(uri.removeprefix("sqlite:///")).parent
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def start_run(uri: str, job: str, experiment: str = DEFAULT_EXPERIMENT,
              run_name: str | None = None):
    """Make ``uri`` the process's store, create ``experiment`` if it is new (artifacts next to a
    sqlite store), and start a run tagged ``specdec.job = job`` (a context manager)."""
    import mlflow

    folder = ensure_store_dir(uri)
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        artifacts = str(folder / "mlartifacts") if folder else None
        exp_id = client.create_experiment(experiment, artifact_location=artifacts)
    else:
        exp_id = exp.experiment_id
    return mlflow.start_run(experiment_id=exp_id, run_name=run_name or job,
                            tags={"specdec.job": job})


def register(name: str, run, artifact_path: str, champion: bool = False) -> str:
    """``<run's artifacts>/<artifact_path>`` as a new version of model ``name`` (created if
    new) in the current store; ``champion`` moves the alias to it. -> ``models:/NAME/VERSION``."""
    import mlflow

    client = mlflow.MlflowClient()
    try:
        client.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(name)
    version = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/{artifact_path}", run_id=run.info.run_id)
    if champion:
        client.set_registered_model_alias(name, CHAMPION, version.version)
    return f"models:/{name}/{version.version}"


def set_champion(name: str, version: str, uri: str | None = None) -> None:
    """Point ``NAME@champion`` at ``version`` in the store ``uri`` (``resolve_tracking_uri``)."""
    import mlflow

    client = mlflow.MlflowClient(resolve_tracking_uri(uri))
    client.set_registered_model_alias(name, CHAMPION, version)
