"""Every shipped config's target plan on its declared device (``specdec.planning``): the serve
configs, the pipelines' and the KubeRay manifests'; a GPU means one 80 GiB H100. A config that
does not fit fails here, with the message ``specdec plan`` gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.cli import main
from specdec.models.sources import model_config
from specdec.planning import planned
from specdec.runtime.plan import cpu_flags, resolve_plan

ROOT = Path(__file__).resolve().parents[1]
H100 = "80GiB"
SHIPPED = sorted([*ROOT.glob("configs/serve/*.yaml"), *ROOT.glob("configs/train/*.yaml"),
                  *ROOT.glob("k8s/*.yaml")])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_fits_its_device(path):
    items = targets(path)
    if not items:
        pytest.skip("runs no target")  # corpus, storage, mlflow, ...
    for item in items:
        config, blocks = model_config(item.target)
        gpu = item.config.device.startswith("cuda")
        plan = resolve_plan(item.config, config, blocks, H100 if gpu else None, present=False)
        assert plan.memory.fits
        assert plan.backend == ("torch" if gpu else plan.backend)


def targets(path: Path) -> list:
    try:
        return planned(path)
    except ValueError:  # runs no target
        return []


def test_the_gpu_configs_are_planned_on_a_gpu():
    gpu = {p.relative_to(ROOT).as_posix() for p in SHIPPED for item in targets(p)
           if item.config.device == "cuda"}
    assert {"configs/serve/gpu.yaml", "configs/train/responses.gpu.yaml",
            "configs/train/train_drafter.gpu.yaml", "k8s/rayservice.yaml",
            "k8s/rayjob-responses.yaml"} <= gpu


def test_plan_cli_json_and_a_plan_that_does_not_fit(capsys):
    assert main(["plan", "--config", str(ROOT / "configs/serve/gpu.yaml"),
                 "--device-memory", H100, "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)
    plan = entry["plan"]
    assert (plan["device"], plan["backend"], plan["dtype"]) == ("cuda", "torch", "bfloat16")
    assert plan["memory"]["fits"] and plan["memory"]["kv_pool"] > 0
    assert main(["plan", "--target", "smollm2-135m", "--device", "cuda", "--device-memory",
                 "8GiB", "--slots", "512", "--max-model-len", "8192"]) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out and "max_model_len" in out and "kv_slots" in out


def test_the_plan_takes_the_configs_threads_and_wait_policy(tmp_path, monkeypatch, capsys):
    """A serve app's target actor's threads, a pipeline's torch_threads, the serve arg
    omp_wait_policy; on the command line --threads and --omp-wait-policy."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    [served] = planned(ROOT / "configs/serve/gpu.yaml")
    assert (served.config.threads, served.config.omp_wait_policy) == (2, "auto")
    [pipeline] = planned(ROOT / "configs/train/evaluate.yaml")
    assert pipeline.config.threads == 2
    app = {"applications": [{"name": "a", "args": {"target": "smollm2-135m",
                                                   "omp_wait_policy": "active"}}]}
    (tmp_path / "serve.yaml").write_text(json.dumps(app))
    [active] = planned(tmp_path / "serve.yaml")
    assert (active.config.threads, active.config.omp_wait_policy) == (1, "active")
    assert main(["plan", "--target", "smollm2-135m", "--device", "cpu", "--threads", "3",
                 "--omp-wait-policy", "active", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert (plan["threads"], plan["omp_wait_policy"]) == (3, "active")


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="isa: avx2 needs a CPU with AVX2")
def test_isa_reaches_the_plan_from_a_serve_config_and_the_cli(tmp_path, capsys):
    """``isa`` is a serve arg and a ``specdec plan`` option, as the other runtime knobs."""
    serve = tmp_path / "serve.yaml"
    serve.write_text("applications:\n- name: app\n  args: {target: smollm2-135m, isa: avx2}\n")
    [item] = planned(serve)
    assert item.config.isa == "avx2"
    assert main(["plan", "--target", "smollm2-135m", "--device", "cpu", "--isa", "avx2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["isa"] == "avx2"
