"""Resolve model references that name the MLflow registry to local directories.

``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` -> a local directory (downloaded with
``mlflow.artifacts.download_artifacts``); anything else is returned unchanged, so callers can
pass every reference through ``resolve_model_ref`` before ``specdec.engine.loading``. It lives in
the core (mlflow imported lazily, never ray) so that the jobs, the serving layer and the actors
can all call it. The store is ``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else
``sqlite:///$SPECDEC_HOME/mlflow.db``: the same default as ``pipelines.tracking``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from specdec.models.sources import specdec_home


def is_registry_ref(ref: str | None) -> bool:
    return bool(ref) and ref.startswith("models:/")


def resolve_model_ref(ref: str | None, tracking_uri: str | None = None,
                      cache_dir: str | Path | None = None) -> str | None:
    if not is_registry_ref(ref):
        return ref
    import mlflow

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") \
        or f"sqlite:///{specdec_home() / 'mlflow.db'}"
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
