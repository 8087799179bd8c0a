"""The GPU check's CPU dry run (``--device cpu --tiny``): every stage runs and its report holds
the fields a GPU run is read for, so the script cannot rot between GPU runs."""

from __future__ import annotations

import json

import pytest
import torch

from bench.gpu_check import run
from bench.gpu_check.bring import join, tree_bytes
from bench.gpu_check.report import REPORT_FILE


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    returned = run.main(["--out", str(out), "--device", "cpu", "--tiny", "--minutes", "10"])
    return returned, json.loads((out / REPORT_FILE).read_text())


def test_every_stage_runs_and_the_file_is_the_report(dry_run):
    returned, report = dry_run
    assert report == json.loads(json.dumps(returned, default=str))
    assert list(report["stages"]) == [s.name for s in run.STAGES]
    assert {n: r["status"] for n, r in report["stages"].items()} == \
        {s.name: "ok" for s in run.STAGES}
    assert report["failed"] == [] and report["device"] == "cpu" and report["tiny"] is True
    assert all(r["seconds"] >= 0 for r in report["stages"].values())


def test_tiny_pair_is_lossless_in_float64_and_actors_match(dry_run):
    stages = dry_run[1]["stages"]
    engine = stages["tiny.engine"]["result"]
    for dtype in ("float64", "float32"):
        assert engine[dtype]["device"] == "cpu" and len(engine[dtype]["outputs"]) == 3
        assert "plan" in engine[dtype]
    f64 = engine["float64"]
    assert f64["strict_equal_all"] and f64["asd_budget_0_equal_all"] and f64["plain_equals_hf_all"]
    assert all(len(o["plain"]) > 0 for o in f64["outputs"])
    actors = stages["tiny.actors"]["result"]
    assert actors["equal_engine"] == [True] * 3 and actors["state_freed"]
    for name in ("tiny.train_drafter", "tiny.train_preverifier"):
        trained = stages[name]["result"]
        assert trained["steps"] == 20 and trained["device"] == "cpu"
        assert trained["last_loss"] < trained["first_loss"]


def test_served_model_stage_reports_speed_and_equality_per_dtype(dry_run):
    stages = dry_run[1]["stages"]
    assert stages["model.served"]["result"]["default_drafter"] == "suffix"
    assert stages["model.served"]["result"]["drafter"] == "suffix"
    for dtype in ("float32", "bfloat16"):
        r = stages[f"model.{dtype}"]["result"]
        assert r["dtype"] == dtype and r["of"] == 2 and 0 <= r["equal"] <= 2
        assert r["ar_tokens_per_s"] > 0 and r["sd_tokens_per_s"] > 0
        assert r["sd_vs_ar"] == pytest.approx(r["sd_tokens_per_s"] / r["ar_tokens_per_s"],
                                              rel=0.01)
        assert len(r["differences"]) == r["of"] - r["equal"]
        for d in r["differences"]:
            assert d["margin"] >= 0 and d["plain"] != d["sd"]
    assert stages["model.float32"]["result"]["equal"] == 2  # lossless on the CPU


def test_training_stage_compares_accepted_lengths(dry_run):
    stages = dry_run[1]["stages"]
    assert stages["train.responses"]["result"]["responses"] > 0
    drafter = stages["train.drafter"]["result"]
    assert drafter["steps"] >= 1 and drafter["device"] == "cpu"
    compare = stages["train.compare"]["result"]
    for name in ("trained", "committed"):
        assert compare[name]["mean_accepted_length"] >= 1.0
    assert compare["trained_vs_committed"] > 0


def test_a_failing_stage_is_recorded_and_the_rest_run(tmp_path):
    report = run.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--only",
                       "model", "--serve-config", str(tmp_path / "missing.yaml")])
    stages = report["stages"]
    assert stages["model.served"]["status"] == "failed"
    assert "missing.yaml" in stages["model.served"]["error"]
    assert "Traceback" in stages["model.served"]["traceback"]
    assert stages["model.build"]["status"] == "failed"  # --tiny needs the tiny stages' models
    assert stages["model.float32"]["status"] == "skipped"
    assert report["failed"] == ["model.served", "model.build"]


def test_no_cuda_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="no CUDA device"):
        run.main(["--out", str(tmp_path)])


def test_gguf_parts_join_back_and_are_checked(tmp_path, monkeypatch):
    import hashlib

    from bench.gpu_check import bring

    data = bytes(range(256)) * 10
    monkeypatch.setattr(bring, "HOME", tmp_path / "home")
    (tmp_path / "home").mkdir()
    for i, at in enumerate(range(0, len(data), 1000)):
        (tmp_path / "home" / f"m.gguf.part{i + 1}").write_bytes(data[at: at + 1000])
    manifest = {"gguf": "m.gguf", "package": "pkg", "parts": ["m.gguf.part1", "m.gguf.part2",
                "m.gguf.part3"], "sha256": hashlib.sha256(data).hexdigest()}
    assert join(manifest, tmp_path / "site").read_bytes() == data
    assert (tmp_path / "site" / "pkg" / "__init__.py").is_file()
    with pytest.raises(SystemExit, match="SHA-256"):
        join({**manifest, "sha256": "0" * 64}, tmp_path / "site")
    with pytest.raises(SystemExit, match="part4"):
        join({**manifest, "parts": [*manifest["parts"], "m.gguf.part4"]}, tmp_path / "site")
    assert tree_bytes(run.Path(__file__).resolve().parents[2]) > 0
