"""``make train-default``: train the default pair end to end and export it.

    python -m pipelines.train_default [--from STAGE] [--configs configs/train] \
        [--out artifacts/smollm2-135m]

Stages, each a subprocess ``python -m pipelines.JOB --config CONFIGS/JOB.yaml`` with
``RAY_AUTH_MODE=disabled``, timed: corpus -> responses (the target's own greedy answers to the
training prompts, the drafter's text) -> train_drafter -> simulate -> train_preverifier ->
evaluate (its PACER and ASD sweep on the dev split gives ``pacer_defaults.json``); then
suffix_index (the responses as the suffix drafter's offline index) -> simulate.suffix (the
suffix drafter's rounds with the acceptance model's features) -> train_preverifier.acceptance
(its acceptance model; these last, so that a state recorded before they existed can still
resume) -> ``pipelines.export_default`` writes the bfloat16 pair (with ``suffix-index/`` and
``acceptance-suffix/``) to ``--out`` with a provenance that holds, per stage, the command, the
config, the wall time, the MLflow run and its final metrics. A stage is its config's name:
``JOB`` or ``JOB.VARIANT`` runs ``pipelines.JOB`` on ``CONFIGS/JOB.VARIANT.yaml``.

The training stages register new model versions and move ``champion`` to them (simulate and
evaluate read ``models:/...@champion``); before every later stage the driver points
``champion`` at the recorded versions again, since something else may have moved it in between
(``make serve`` moves it to the committed pair). The export takes the exact versions, not the
alias.

Resuming is explicit. Every finished stage is recorded in
``$SPECDEC_HOME/pipelines/train_default/state.json``; ``--from STAGE`` reuses the records of the
stages before STAGE (they must exist) and runs the rest; without it every stage runs. An
interrupted train_drafter continues from its newest checkpoint (``resume: true`` in its config);
the wall time of failed or interrupted attempts is kept as ``failed_attempts_s``. A stage run
by hand is recorded from its MLflow run(s) with ``--record STAGE=RUN_ID[,RUN_ID...]`` (wall time
from the runs' start and end times, so without process start-up: an underestimate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pipelines.common.config import load_config
from pipelines.common.tracking import tracking_uri
from specdec.models.sources import specdec_home

STAGES = ("corpus", "responses", "train_drafter", "simulate", "train_preverifier", "evaluate",
          "suffix_index", "simulate.suffix", "train_preverifier.acceptance")
# the stages that register a model version
TRAINED = ("suffix_index", "train_drafter", "train_preverifier", "train_preverifier.acceptance")


def state_path() -> Path:
    return specdec_home() / "pipelines" / "train_default" / "state.json"


def load_state() -> dict:
    path = state_path()
    return json.loads(path.read_text()) if path.is_file() else {"stages": {}, "failed_s": {}}


def save_state(state: dict) -> None:
    state_path().parent.mkdir(parents=True, exist_ok=True)
    state_path().write_text(json.dumps(state, indent=2))


def plan(start: str, state: dict) -> list[str]:
    """The stages to run from ``start``; every earlier stage must have a finished record."""
    if start not in STAGES + ("export",):
        raise ValueError(f"--from {start!r}: choose one of {[*STAGES, 'export']}")
    before = STAGES[: STAGES.index(start)] if start in STAGES else STAGES
    missing = [s for s in before if s not in state["stages"]]
    if missing:
        raise ValueError(f"--from {start}: no finished run of {missing} recorded in "
                         f"{state_path()}; start from {missing[0]}")
    return [s for s in STAGES if s not in before]


def mlflow_settings(config_file: Path):
    from pipelines.jobs import schema_for

    return load_config(schema_for(config_file.stem), config_file).mlflow


def stage_run(job: str, settings, since_ms: int) -> dict:
    """The MLflow run the stage just made (tag ``specdec.job``, started after ``since_ms``):
    id, final metrics, and the model version it registered."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri(settings))
    exp = client.get_experiment_by_name(settings.experiment)
    query = f"tags.`specdec.job` = '{job}' and attributes.start_time >= {since_ms}"
    runs = [] if exp is None else client.search_runs(
        [exp.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise RuntimeError(f"{job} finished but logged no MLflow run in {settings.experiment!r}")
    return {"mlflow_run": runs[0].info.run_id, "metrics": runs[0].data.metrics,
            **registered_by(client, runs[0].info.run_id)}


def registered_by(client, run_id: str) -> dict:
    """``{"model_version": "models:/NAME/VERSION"}`` if the run registered one, else ``{}``."""
    versions = client.search_model_versions(f"run_id = '{run_id}'")
    return {"model_version": f"models:/{versions[0].name}/{versions[0].version}"} \
        if versions else {}


def adopted(job: str, run_ids: list[str], settings) -> dict:
    """A stage's record from MLflow runs of a job run by hand (a resumed run logs one MLflow
    run per attempt): wall time from the runs' start and end times plus the offline training
    they handed back (their ``offline_seconds``), the newest run (which must
    have finished) for the metrics, the registered version and, as its params, the config."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri(settings))
    runs = sorted((client.get_run(r) for r in run_ids), key=lambda r: r.info.start_time)
    for r in runs:  # earlier attempts may have failed; every one must have ended
        if r.data.tags.get("specdec.job") != job or not r.info.end_time:
            raise ValueError(f"--record {job}: MLflow run {r.info.run_id} is not an ended "
                             f"{job} run")
    last = runs[-1]
    if last.info.status != "FINISHED":
        raise ValueError(f"--record {job}: the newest run {last.info.run_id} did not finish")
    inside = sum(r.info.end_time - r.info.start_time for r in runs) / 1000
    offline = sum(r.data.metrics.get("offline_seconds", 0.0) for r in runs)
    record = {"command": f"adopted MLflow runs {run_ids}", "config": last.data.params,
              "wall_note": "inside the MLflow runs, plus the offline attempts they handed back "
                           "(offline_seconds): process start-up and pre-run loading excluded",
              "wall_s": round(inside + offline, 1), "offline_s": round(offline, 1),
              "failed_attempts_s": 0.0, "finished_at": time.strftime(
                  "%Y-%m-%dT%H:%M:%SZ", time.gmtime(last.info.end_time / 1000)),
              "mlflow_run": last.info.run_id, "metrics": last.data.metrics}
    return record | registered_by(client, last.info.run_id)


def point_champions(state: dict, uri: str) -> None:
    """``champion`` of each trained model -> the version its recorded stage registered."""
    from specdec.models.registry import set_champion

    for stage in TRAINED:
        record = state["stages"].get(stage, {})
        if "model_version" in record:
            name, version = record["model_version"].removeprefix("models:/").rsplit("/", 1)
            set_champion(name, version, uri)


def run_stage(stage: str, config_file: Path, state: dict) -> None:
    """Run ``stage`` (``JOB`` or ``JOB.VARIANT``: ``pipelines.JOB``) on ``config_file`` and
    record it in ``state``."""
    job = stage.split(".")[0]
    python = os.path.relpath(sys.executable)
    command = [python, "-m", f"pipelines.{job}", "--config", str(config_file)]
    settings = mlflow_settings(config_file)
    point_champions(state, tracking_uri(settings))
    print(f"== {stage}: RAY_AUTH_MODE=disabled {' '.join(command)}", flush=True)
    start, code = time.time(), None
    try:
        code = subprocess.run(command, env={**os.environ, "RAY_AUTH_MODE": "disabled"}).returncode
    finally:  # a failed or interrupted attempt still counts towards the stage's wall time
        elapsed = time.time() - start
        if code != 0:
            state["failed_s"][stage] = state["failed_s"].get(stage, 0.0) + elapsed
            save_state(state)
    if code != 0:
        raise SystemExit(f"{stage} failed (exit {code}) after {elapsed:.0f} s; after fixing it, "
                         f"continue with --from {stage}")
    state["stages"][stage] = {
        "command": f"RAY_AUTH_MODE=disabled {' '.join(command)}",
        "config": yaml.safe_load(config_file.read_text()), "wall_s": round(elapsed, 1),
        "failed_attempts_s": round(state["failed_s"].pop(stage, 0.0), 1),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **stage_run(job, settings, int(start * 1000)),
    }
    save_state(state)
    print(f"== {stage}: {elapsed:.0f} s", flush=True)


def pacer_defaults(state: dict, settings, out_dir: Path) -> str | None:
    """The sweep's ``pacer_defaults.json`` from the evaluate run, if it logged one."""
    import mlflow

    run_id = state["stages"]["evaluate"]["mlflow_run"]
    uri = tracking_uri(settings)
    names = [a.path for a in mlflow.MlflowClient(uri).list_artifacts(run_id)]
    if "pacer_defaults.json" not in names:
        return None
    return mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="pacer_defaults.json",
                                               dst_path=str(out_dir), tracking_uri=uri)


def provenance_extra(state: dict) -> dict:
    import torch

    walls = {s: round(state["stages"][s]["wall_s"] + state["stages"][s]["failed_attempts_s"], 1)
             for s in STAGES if s in state["stages"]}
    return {"recipe": "make train-default (python -m pipelines.train_default)",
            "data": {f"{stage}_{key}": state["stages"][stage][key]
                     for stage in ("corpus", "responses") for key in ("config", "metrics")},
            "wall_s": {**walls, "total": round(sum(walls.values()), 1)},
            "stages": state["stages"],
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "python": platform.python_version(), "torch": torch.__version__}}


def export(state: dict, configs: Path, out: Path) -> Path:
    from pipelines import export_default

    work = state_path().parent
    settings = mlflow_settings(configs / "evaluate.yaml")
    os.environ["MLFLOW_TRACKING_URI"] = tracking_uri(settings)  # where models:/ refs resolve
    pacer = pacer_defaults(state, settings, work)
    extra = provenance_extra(state)
    (work / "provenance-extra.json").write_text(json.dumps(extra, indent=2))
    acceptance = state["stages"].get("train_preverifier.acceptance", {}).get("model_version")
    args = ["--drafter", state["stages"]["train_drafter"]["model_version"],
            "--preverifier", state["stages"]["train_preverifier"]["model_version"],
            *(["--pacer-defaults", pacer] if pacer else []),
            *(["--acceptance", acceptance] if acceptance else []),
            "--provenance-extra", str(work / "provenance-extra.json"), "--out", str(out)]
    export_default.main(args)
    export_suffix_index(state, out)
    return out


def export_suffix_index(state: dict, out: Path) -> None:
    """The registered index version -> ``out/suffix-index`` (``cluster.default_pair`` registers
    and serves it from there)."""
    import shutil

    from specdec.models.registry import resolve_model_ref

    version = state["stages"].get("suffix_index", {}).get("model_version")
    if version is None:
        return
    shutil.rmtree(out / "suffix-index", ignore_errors=True)
    shutil.copytree(resolve_model_ref(version), out / "suffix-index")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the default pair and export it.")
    ap.add_argument("--from", dest="start", default=STAGES[0],
                    help=f"first stage to run: one of {[*STAGES, 'export']}")
    ap.add_argument("--configs", default="configs/train", help="directory of the job configs")
    ap.add_argument("--out", default="artifacts/smollm2-135m")
    ap.add_argument("--record", action="append", default=[], metavar="STAGE=RUN_ID[,RUN_ID]",
                    help="record a stage run by hand from its MLflow run(s), e.g. to continue "
                         "--from simulate after running train_drafter yourself")
    a = ap.parse_args(argv)
    state = load_state()
    for item in a.record:
        stage, _, ids = item.partition("=")
        if stage not in STAGES or not ids:
            raise ValueError(f"--record {item!r}: expected STAGE=RUN_ID[,RUN_ID...]")
        config_file = Path(a.configs) / f"{stage}.yaml"
        state["stages"][stage] = adopted(stage.split(".")[0], ids.split(","),
                                         mlflow_settings(config_file))
    save_state(state)
    todo = plan(a.start, state)
    for stage in todo:
        state["stages"].pop(stage, None)  # a stage that runs again replaces its record
    for stage in todo:
        run_stage(stage, Path(a.configs) / f"{stage}.yaml", state)
    export(state, Path(a.configs), Path(a.out))


if __name__ == "__main__":
    main()
