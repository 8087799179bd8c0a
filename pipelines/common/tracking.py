"""MLflow for the jobs: their ``mlflow:`` config section applied to the store, plus run logging
(flattened params, plots) and the git state for provenance.

The store itself (the default tracking URI, starting runs, registering versions, the
``champion`` alias) is ``specdec.models.registry``, shared with the serving layer; this module
only reads a job's ``MlflowSettings`` (experiment, run name, whether and under which name to
register, whether to move ``champion``). Models are logged as safetensors directories (their
own ``save``), never pickled, and registered as model versions whose source is that directory.
"""

from __future__ import annotations

import subprocess

from pipelines.common.config import MlflowSettings
from specdec.models import registry


def tracking_uri(settings: MlflowSettings) -> str:
    """The config's ``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else specdec's sqlite file."""
    return registry.resolve_tracking_uri(settings.tracking_uri)


def start_run(settings: MlflowSettings, job: str):
    """Set the store and experiment, then start a run (a context manager)."""
    return registry.start_run(tracking_uri(settings), job, settings.experiment, settings.run_name)


def register(settings: MlflowSettings, default_name: str, run, artifact_path: str) -> str | None:
    """Register ``runs:/<run>/<artifact_path>`` as a new version (named ``settings.model_name``,
    else ``default_name``); move ``champion`` if asked. Returns ``models:/NAME/VERSION``, or
    None when the config turns registration off."""
    if not settings.register_model:
        return None
    return registry.register(settings.model_name or default_name, run, artifact_path,
                             champion=settings.champion)


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


def log_plan(target: str, runtime) -> dict | None:
    """The target's runtime plan (``specdec.runtime.RuntimeConfig`` ``runtime``, its device the
    one the job's actors take), resolved from the model's config alone as they will resolve it:
    printed, and logged as MLflow params ``plan.*`` in the active run. None for a model the
    runtime does not run (transformers runs it)."""
    from specdec.models.sources import model_config
    from specdec.runtime import resolve_plan, unsupported

    config, blocks = model_config(target)
    if unsupported(config):
        print(f"plan: transformers runs {target} ({unsupported(config)})", flush=True)
        return None
    plan = resolve_plan(runtime, config, blocks, present=False)
    print(plan.describe(), flush=True)
    log_params(plan.to_dict(), prefix="plan.")
    return plan.to_dict()
