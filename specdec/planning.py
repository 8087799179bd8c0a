"""The runtime plans a config file asks for, for ``specdec plan --config FILE``.

A file is a serve config (``applications``: each app's ``args``), a KubeRay manifest (a
RayService's ``serveConfigV2``, or a RayJob's entrypoint ``--config FILE``), or a pipeline
config (a top-level ``target``). Each names a target and its runtime knobs (``dtype``,
``backend``, ``linears``, ``attention``, ``kv_cache_dtype``, ``max_model_len``,
``omp_wait_policy``, ``isa``, ``threads_by_load``; the threads: a serve app's ``target_resources.threads``, a
pipeline's ``torch_threads``) and declares its device: a serve app's target actor is on a GPU
when ``target_resources.num_gpus > 0``; a pipeline's when its ``device`` says so, or its actors or workers take GPUs. A pipeline's
target holds ``actors.batch_size`` requests at once (else ``kv_slots``, else
``PIPELINE_SLOTS``) of ``max_model_len`` positions (a drafter's training: ``max_seq_len``). Only
the model's config is read, never its weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from specdec.runtime.plan import RuntimeConfig

SERVE_SLOTS = 32  # a serve config's limits.kv_slots when it sets none (cluster.schema.Limits reads it)
SERVE_THREADS = 1  # an actor's torch threads when its resources set none (cluster.schema reads it)
PIPELINE_SLOTS = 8  # a pipeline's target without a batch size: load_target's default
KNOBS = ("dtype", "backend", "linears", "attention", "kv_cache_dtype", "max_model_len",
         "omp_wait_policy", "isa", "threads_by_load")


@dataclass(frozen=True)
class Planned:
    """One target a config runs: where it comes from, its model and its runtime knobs."""

    source: str  # the file, and the app within it
    target: str  # a model reference (``specdec.models.sources.resolve``)
    config: RuntimeConfig


def planned(path: str | Path) -> list[Planned]:
    """Every target the file at ``path`` runs on the runtime."""
    path = Path(path)
    docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    out = []
    for doc in docs:
        out += from_doc(doc, str(path), path)
    if not out:
        raise ValueError(f"{path} names no target (not a serve, KubeRay or pipeline config)")
    return out


def from_doc(doc: dict, source: str, path: Path) -> list[Planned]:
    if doc.get("kind") == "RayService":
        return from_doc(yaml.safe_load(doc["spec"]["serveConfigV2"]), source, path)
    if doc.get("kind") == "RayJob":
        m = re.search(r"--config\s+(\S+)", doc["spec"].get("entrypoint", ""))
        return planned(repo_root(path) / m.group(1)) if m else []
    if "applications" in doc:
        return [serve_app(app, f"{source}:{app.get('name', i)}")
                for i, app in enumerate(doc["applications"])]
    if "target" in doc:
        return [pipeline(doc, source)]
    return []


def repo_root(path: Path) -> Path:
    """The checkout a manifest lies in (the folder above k8s/ or configs/)."""
    for parent in path.resolve().parents:
        if (parent / "configs").is_dir():
            return parent
    return Path.cwd()


def knobs(args: dict) -> dict:
    return {k: args[k] for k in KNOBS if args.get(k) is not None}


def serve_app(app: dict, source: str) -> Planned:
    args = app["args"]
    resources = args.get("target_resources") or {}
    gpu = resources.get("num_gpus", 0) > 0
    slots = (args.get("limits") or {}).get("kv_slots", SERVE_SLOTS)
    return Planned(source, args["target"],
                   RuntimeConfig(device="cuda" if gpu else "cpu", slots=slots,
                                 threads=resources.get("threads", SERVE_THREADS), **knobs(args)))


def pipeline(doc: dict, source: str) -> Planned:
    actors, scaling = doc.get("actors") or {}, doc.get("scaling") or {}
    gpu = actors.get("num_gpus", 0) > 0 or scaling.get("use_gpu", False)
    device = doc.get("device") or ("cuda" if gpu else "cpu")
    slots = actors.get("batch_size") or doc.get("kv_slots") or PIPELINE_SLOTS
    sized = {"max_model_len": doc["max_seq_len"]} if "max_seq_len" in doc else {}
    threads = actors.get("torch_threads") or scaling.get("torch_threads")
    return Planned(source, doc["target"],
                   RuntimeConfig(device=device, slots=slots, threads=threads,
                                 **(sized | knobs(doc))))
