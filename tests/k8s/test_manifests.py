"""The KubeRay and MLflow manifests under k8s/: they parse, their pod templates are valid
Kubernetes objects, the RayService's serve config validates against the serving schema with
import paths that resolve, the RayJobs run modules and configs that exist, and the resources
the pods offer cover what the configs ask for."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shlex
from pathlib import Path

import pytest
import yaml

from cluster import placement
from cluster.app import check_source
from cluster.schema import ServeArgs
from tests.k8s.strict_k8s import build, quantities

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
JOBS = ["corpus", "responses", "train_drafter", "simulate", "train_preverifier", "evaluate"]
MLFLOW_URI = "http://mlflow:5000"


def documents() -> list[tuple[str, dict]]:
    return [(f.name, doc) for f in sorted(K8S.glob("*.yaml"))
            for doc in yaml.safe_load_all(f.read_text()) if doc]


def of_kind(kind: str) -> list[tuple[str, dict]]:
    return [(name, doc) for name, doc in documents() if doc["kind"] == kind]


def ray_cluster_specs() -> list[tuple[str, dict]]:
    """(file, RayCluster spec) of the RayService, the RayJobs and the RayCluster."""
    specs = [(n, d["spec"]["rayClusterConfig"]) for n, d in of_kind("RayService")]
    specs += [(n, d["spec"]["rayClusterSpec"]) for n, d in of_kind("RayJob")]
    return specs + [(n, d["spec"]) for n, d in of_kind("RayCluster")]


def groups(spec: dict) -> list[dict]:
    return [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]


def pod_templates() -> list[tuple[str, dict]]:
    pods = [(f"{n}:{g.get('groupName', 'head')}", g["template"])
            for n, spec in ray_cluster_specs() for g in groups(spec)]
    return pods + [(n, d["spec"]["template"]) for n, d in of_kind("Deployment")]


def limits(template: dict) -> dict:
    return quantities(template["spec"]["containers"][0]["resources"]["limits"])


def serve_config() -> dict:
    (_, service), = of_kind("RayService")
    return yaml.safe_load(service["spec"]["serveConfigV2"])


# ---- parsing and shape -----------------------------------------------------------------------
def test_every_manifest_parses_with_a_known_kind():
    kinds = {doc["kind"] for _, doc in documents()}
    assert {"RayService", "RayJob", "RayCluster", "Deployment", "Service",
            "PersistentVolumeClaim"} <= kinds
    for name, doc in documents():
        assert {"apiVersion", "kind", "metadata", "spec"} <= set(doc), name
        if doc["kind"].startswith("Ray"):
            assert doc["apiVersion"] == "ray.io/v1", name


def test_one_rayjob_per_training_pipeline():
    assert sorted(n for n, _ in of_kind("RayJob")) == sorted(f"rayjob-{j}.yaml" for j in JOBS)


@pytest.mark.parametrize("where,template", pod_templates(), ids=lambda v: v if isinstance(v, str) else "")
def test_pod_templates_are_strict_kubernetes_objects(where, template):
    from kubernetes import client

    assert isinstance(build(template, "V1PodTemplateSpec", where), client.V1PodTemplateSpec)


def test_core_objects_are_strict_kubernetes_objects():
    types = {"Deployment": "V1Deployment", "Service": "V1Service",
             "PersistentVolumeClaim": "V1PersistentVolumeClaim"}
    for name, doc in documents():
        if doc["kind"] in types:
            build(doc, types[doc["kind"]], f"{name}:{doc['kind']}")


# ---- Ray clusters ----------------------------------------------------------------------------
@pytest.mark.parametrize("name,spec", ray_cluster_specs(), ids=lambda v: v if isinstance(v, str) else "")
def test_ray_cluster_shape(name, spec):
    assert spec["rayVersion"] == "2.60.0"
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # the head runs no work
    for group in groups(spec):
        pod = group["template"]["spec"]
        shm = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts.get("/dev/shm") in {v["name"] for v in shm}, name
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["MLFLOW_TRACKING_URI"] == MLFLOW_URI, name
        if limits(group["template"]).get("nvidia.com/gpu"):
            assert any(t["key"] == "nvidia.com/gpu" for t in pod.get("tolerations", [])), name


def test_mlflow_service_matches_the_tracking_uri():
    (_, service), = of_kind("Service")
    (_, deployment), = of_kind("Deployment")
    assert f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}" == MLFLOW_URI
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    claims = {d["metadata"]["name"] for _, d in of_kind("PersistentVolumeClaim")}
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {v["persistentVolumeClaim"]["claimName"] for v in volumes} <= claims
    assert any("sqlite:////mlflow/" in a for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def test_every_claim_the_ray_pods_mount_is_defined():
    claims = {d["metadata"]["name"] for _, d in of_kind("PersistentVolumeClaim")}
    for where, template in pod_templates():
        for volume in template["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, where


# ---- the RayService and its serve config ----------------------------------------------------
def test_serve_config_validates_and_its_import_paths_resolve():
    from ray.serve.schema import ServeDeploySchema

    config = serve_config()
    ServeDeploySchema.model_validate(config)  # Serve's own schema for what serveConfigV2 holds
    for app in config["applications"]:
        module, attr = app["import_path"].split(":")
        assert callable(getattr(importlib.import_module(module), attr))
        args = ServeArgs.model_validate(app["args"])
        for ref in (args.target, args.drafter, args.preverifier):
            check_source(ref, args.model_roots)  # named sources and models:/ only: no files


def pack(demands: list[float], bins: list[float]) -> bool:
    """First-fit decreasing: can every demand be placed, each whole, in one of the bins?"""
    free = sorted(bins, reverse=True)
    for need in sorted(demands, reverse=True):
        fit = next((i for i, room in enumerate(free) if room + 1e-9 >= need), None)
        if fit is None:
            return False
        free[fit] -= need
    return True


def worker_nodes(spec: dict, resource: str) -> list[float]:
    """``resource`` of every worker pod the cluster starts with (minReplicas of each group)."""
    return [limits(g["template"]).get(resource, 0.0)
            for g in spec.get("workerGroupSpecs", []) for _ in range(g.get("minReplicas", 0))]


def ray_offer(group: dict) -> dict[str, float]:
    """What Ray sees on a pod of ``group``: its CPU and GPU limits and the custom resources of
    its ``rayStartParams`` (KubeRay's quoted JSON: '"{\\"name\\": 1}"')."""
    offer = {"CPU": limits(group["template"]).get("cpu", 0.0),
             "GPU": limits(group["template"]).get("nvidia.com/gpu", 0.0)}
    custom = group.get("rayStartParams", {}).get("resources")
    return offer | (json.loads(json.loads(custom)) if custom else {})


def place(groups: list[list[placement.Bundle]], strategy: str, nodes: list[dict]) -> bool:
    """First fit, as Ray reserves placement groups: each group's bundles all on one node under
    STRICT_PACK, bundle by bundle otherwise."""
    free = [dict(n) for n in nodes]

    def take(need: dict[str, float]) -> bool:
        node = next((n for n in free if placement.fits(need, n)), None)
        for name, amount in need.items() if node is not None else ():
            node[name] -= amount
        return node is not None

    for bundles in groups:
        needs = [b.resources for b in bundles]
        if strategy == "STRICT_PACK":
            needs = [{k: sum(n.get(k, 0.0) for n in needs) for k in set().union(*needs)}]
        if not all(take(need) for need in needs):
            return False
    return True


def test_worker_pods_hold_every_replicas_placement_group():
    """Each replica's placement group (replica, target and drafter bundles) lands on the worker
    pods the cluster starts with, the builder's own check passes on them, and the target's
    torch threads fit its CPUs."""
    (_, service), = of_kind("RayService")
    spec = service["spec"]["rayClusterConfig"]
    nodes = [ray_offer(g) for g in spec.get("workerGroupSpecs", [])
             for _ in range(g.get("minReplicas", 0))]
    for app in serve_config()["applications"]:
        args = ServeArgs.model_validate(app["args"])
        bundles = placement.bundles(args)
        assert args.target_resources.num_gpus >= 1  # the target on a whole GPU
        scaling = args.autoscaling_config or {}
        replicas = scaling.get("min_replicas", 1) if scaling else args.num_replicas
        placement.check(bundles, args.placement_strategy, nodes)
        assert place([bundles] * replicas, args.placement_strategy, nodes)
        assert args.target_resources.threads <= max(args.target_resources.num_cpus, 1)


def test_placement_fails_when_the_pods_are_too_small():
    """The same placement on 1-GPU workers does not fit under STRICT_PACK: the check names it."""
    (_, service), = of_kind("RayService")
    args = ServeArgs.model_validate(serve_config()["applications"][0]["args"])
    small = [{"CPU": 4.0, "GPU": 1.0, "specdec-replica": 1.0}] * 2
    assert not place([placement.bundles(args)], "STRICT_PACK", small)
    with pytest.raises(ValueError, match="STRICT_PACK .* 1.5 GPU"):
        placement.check(placement.bundles(args), "STRICT_PACK", small)


def test_serve_proxy_listens_in_the_pod_and_the_key_comes_from_a_secret():
    assert serve_config()["http_options"]["host"] == "0.0.0.0"
    (_, service), = of_kind("RayService")
    for group in groups(service["spec"]["rayClusterConfig"]):
        env = {e["name"]: e for e in group["template"]["spec"]["containers"][0]["env"]}
        assert env["SPECDEC_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "specdec-api-key"


# ---- the RayJobs ----------------------------------------------------------------------------
@pytest.mark.parametrize("job", JOBS)
def test_rayjob_runs_a_module_and_config_that_exist(job):
    (_, doc), = [(n, d) for n, d in of_kind("RayJob") if n == f"rayjob-{job}.yaml"]
    spec = doc["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    python, dash_m, module, flag, config = shlex.split(spec["entrypoint"])
    assert (python, dash_m, flag) == ("python", "-m", "--config")
    assert module == f"pipelines.{job}" and importlib.util.find_spec(module) is not None
    assert (ROOT / config).is_file()
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["env_vars"]["MLFLOW_TRACKING_URI"] == MLFLOW_URI
    assert runtime_env["working_dir"] == "/home/ray/specdec"  # the Dockerfile's WORKDIR


@pytest.mark.parametrize("job", JOBS)
def test_rayjob_workers_cover_the_jobs_resources(job):
    (_, doc), = [(n, d) for n, d in of_kind("RayJob") if n == f"rayjob-{job}.yaml"]
    spec = doc["spec"]["rayClusterSpec"]
    config = yaml.safe_load((ROOT / shlex.split(doc["spec"]["entrypoint"])[-1]).read_text())
    scaling, actors = config.get("scaling", {}), config.get("actors", {})
    cpus = [scaling.get("cpus_per_worker", 1.0)] * scaling.get("num_workers", 0)
    cpus += [actors.get("num_cpus", 1.0)] * actors.get("size", 0)
    gpus = [actors.get("num_gpus", 0.0)] * actors.get("size", 0)
    gpus += [1.0] * scaling.get("num_workers", 0) * bool(scaling.get("use_gpu"))
    assert pack(cpus, worker_nodes(spec, "cpu")), job
    assert pack(gpus, worker_nodes(spec, "nvidia.com/gpu")), job


def test_dockerfile_uses_the_ray_base_and_the_pinned_torch():
    text = (ROOT / "Dockerfile").read_text()
    assert "FROM rayproject/ray:2.60.0-py311-gpu" in text
    assert "torch==2.13.0" in text and "torch==2.13.0" in (ROOT / "Makefile").read_text()
    assert "WORKDIR /home/ray/specdec" in text
