"""The committed default pair (``artifacts/<target>/``): registered on first use, served from
the MLflow registry.

``ensure_registered(artifacts, uri)`` makes ``<target>-block-drafter@champion`` and
``<target>-preverifier@champion`` (``<target>`` is the artifacts directory's name) hold exactly
the files of ``artifacts/drafter`` and ``artifacts/preverifier``. Each model version carries the
SHA-256 of its directory's content as the tag ``specdec.content_sha256``; when the champion's
tag equals the files' hash nothing happens, otherwise one MLflow run logs the changed
directories, new versions are created from them and ``champion`` moves there.

``artifacts/suffix-index`` (the suffix drafter's offline index, ``pipelines.suffix_index``) is
registered the same way as ``<target>-suffix-index@champion`` when it is there, and so is
``artifacts/acceptance-suffix`` (the suffix drafter's acceptance model, ``pipelines
.train_preverifier``) as ``<target>-acceptance-suffix@champion``. Runs, versions
and the alias are written through ``specdec.models.registry``, the module the training jobs
write through too (the serving layer never imports ``pipelines/``).

``serve_args(args, artifacts, drafter)`` is what ``make serve`` does with
``configs/serve/local.yaml``: when the config names a ``default_pair`` directory that holds a
drafter, the app serves it from the registry as ``default_drafter`` says: ``block`` (the block
drafter with PACER: the sweep's ``pacer_defaults.json`` when present), ``suffix`` (the suffix
drafter with the registered index, and its acceptance model when registered, unless
``acceptance`` is off) or ``hybrid`` (suffix or the block drafter's PACER draft, per round);
without the pair it serves the config as written.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.engine.settings import FLAT, SpecSettings
from specdec.models import registry
from specdec.models.sources import content_hash

HASH_TAG = "specdec.content_sha256"
ALIAS = registry.CHAMPION
KINDS = {"drafter": "block-drafter", "preverifier": "preverifier"}  # subdirectory -> model suffix
# registered when the artifacts hold it
OPTIONAL = {"suffix-index": "suffix-index", "acceptance-suffix": "acceptance-suffix"}
# PACER when the artifacts hold no swept pacer_defaults.json (configs/train/evaluate.yaml's):
# its config's defaults, as flat keys (block_size, threshold, growth, max_draft)
PACER_FALLBACK = {"policy": "pacer", **{key: SpecSettings().flat()[key] for key, targets
                                        in FLAT.items() if any(s == "pacer" for s, _ in targets)}}


def champion_hash(client, name: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, ALIAS).tags.get(HASH_TAG)
    except MlflowException:  # no such model, or no champion yet
        return None


def register_new(stale: dict[str, tuple[str, str]], artifacts: Path, tracking_uri: str) -> None:
    """One run logs every stale directory; each becomes a new version and the champion."""
    import mlflow

    with registry.start_run(tracking_uri, "register_default_pair",
                            run_name="register-default-pair") as run:
        if (artifacts / "provenance.json").is_file():
            mlflow.log_artifact(str(artifacts / "provenance.json"))
        for kind, (name, digest) in stale.items():
            mlflow.log_artifacts(str(artifacts / kind), artifact_path=kind)
            uri = registry.register(name, run, kind, champion=True)  # models:/NAME/VERSION
            mlflow.MlflowClient().set_model_version_tag(name, uri.rsplit("/", 1)[1], HASH_TAG,
                                                        digest)


def ensure_registered(artifacts_dir: str | Path, tracking_uri: str) -> dict[str, str]:
    """Register the pair under ``artifacts_dir`` unless the champions already hold it.
    Returns ``{"drafter": "models:/...@champion", "preverifier": "models:/...@champion"}``
    (and ``"suffix-index"`` when the artifacts hold one)."""
    import mlflow

    artifacts = Path(artifacts_dir).resolve()
    registry.ensure_store_dir(tracking_uri)  # a fresh clone has no $SPECDEC_HOME yet
    kinds = KINDS | {k: v for k, v in OPTIONAL.items() if (artifacts / k).is_dir()}
    names = {kind: f"{artifacts.name}-{suffix}" for kind, suffix in kinds.items()}
    client = mlflow.MlflowClient(tracking_uri)
    stale = {}
    for kind, name in names.items():
        if not (artifacts / kind).is_dir():
            raise FileNotFoundError(f"default pair {artifacts} has no {kind}/ directory")
        digest = content_hash(artifacts / kind)
        if champion_hash(client, name) != digest:
            stale[kind] = (name, digest)
    if stale:
        register_new(stale, artifacts, tracking_uri)
    return {kind: f"models:/{name}@{ALIAS}" for kind, name in names.items()}


def serve_args(args: dict, artifacts_dir: str | Path | None, drafter: str = "block",
               acceptance: bool = True) -> dict:
    """The app's args with the default pair in place of the config's drafter, when
    ``artifacts_dir`` holds one; else ``args`` unchanged. ``drafter``: block | suffix | hybrid
    (the suffix kinds need ``suffix-index/``; without it the block drafter is served);
    ``acceptance``: serve the suffix drafter's acceptance model where the pair holds one.
    Prints one line saying which."""
    if drafter not in ("block", "suffix", "hybrid"):
        raise ValueError(f"default_drafter {drafter!r}: choose block, suffix or hybrid")
    if artifacts_dir is None:
        return args
    artifacts = Path(artifacts_dir)
    if not (artifacts / "drafter").is_dir():
        print(f"no trained default pair in {artifacts}/ (see `make train-default`): serving "
              f"{args['target']} with drafter {args.get('drafter', 'ngram')}", flush=True)
        return args
    uri = registry.resolve_tracking_uri(args.get("mlflow_tracking_uri"))
    refs = ensure_registered(artifacts, uri)
    pacer_file = artifacts / "pacer_defaults.json"
    pacer = json.loads(pacer_file.read_text()) if pacer_file.is_file() else PACER_FALLBACK
    spec = {**args.get("speculative", {}), **pacer}
    model = refs.pop("acceptance-suffix", None)
    if drafter != "block" and "suffix-index" in refs:
        model = model if acceptance and drafter == "suffix" else None
        return suffix_args(args, refs, spec, drafter, uri, model)
    refs.pop("suffix-index", None)
    print(f"serving the trained default pair of {artifacts}/: {refs['drafter']} + "
          f"{refs['preverifier']} from {uri}, {json.dumps(pacer)}", flush=True)
    return {**args, **refs, "speculative": spec, "mlflow_tracking_uri": uri}


def suffix_args(args: dict, refs: dict, spec: dict, drafter: str, uri: str,
                acceptance: str | None = None) -> dict:
    """Serve the suffix drafter (or the hybrid) with the registered index. Both draft up to
    max_draft a round under the fixed window (the hybrid runs PACER on its block draft itself);
    with the suffix drafter's ``acceptance`` model, PACER's rule on it cuts the drafts."""
    policy = "pacer" if acceptance else "fixed"
    spec = {**spec, "policy": policy, "gamma": spec.get("max_draft", SpecSettings().max_draft)}
    suffix = {**args.get("suffix", {}), "index": refs["suffix-index"]}
    out = {**args, "drafter": drafter, "suffix": suffix, "speculative": spec,
           "mlflow_tracking_uri": uri}
    if drafter == "hybrid":
        out |= {"block_drafter": refs["drafter"], "preverifier": refs["preverifier"]}
    if acceptance:
        out["acceptance"] = acceptance
    print(f"serving the {drafter} drafter with {refs['suffix-index']}"
          + (f" + {refs['drafter']} + {refs['preverifier']}" if drafter == "hybrid" else "")
          + (f" + {acceptance}" if acceptance else "")
          + f" from {uri}, {json.dumps(spec)}", flush=True)
    return out
