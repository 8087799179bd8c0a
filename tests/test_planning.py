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
