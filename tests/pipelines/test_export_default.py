"""The default pair's export: bfloat16 on disk with integer buffers intact, loadable into a
float32 target as the rounded weights, refused whole when over the size limit; and, after
registration, lossless from ``models:/...@champion`` in the engine."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from cluster.default_pair import ensure_registered
from pipelines.export_default import export
from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair, load_target
from specdec.engine.settings import GenerationParams, SpecSettings
from specdec.models.block_drafter import BlockDrafter
from specdec.models.preverifier import PreVerifier
from specdec.models.registry import resolve_model_ref
from tests.conftest import PROMPTS


def export_sources(src: dict, out, **kw):
    return export(src["drafter"], src["preverifier"], out, src["pacer_defaults"], **kw)


@pytest.fixture(scope="module")
def exported(tiny_pair_sources, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "tiny-pair"
    return export_sources(tiny_pair_sources, out, extra={"wall_s": {"total": 12.5}},
                          command=["export", "test"])


def stored_dtypes(path) -> dict[str, torch.dtype]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k).dtype for k in f.keys()}


def test_export_writes_bfloat16_and_keeps_the_integer_buffer(exported, tiny_pair_sources):
    drafter = stored_dtypes(exported / "drafter" / "model.safetensors")
    assert drafter.pop("draft_to_target") == torch.int64
    assert set(drafter.values()) == {torch.bfloat16}
    assert set(stored_dtypes(exported / "preverifier" / "model.safetensors").values()) \
        == {torch.bfloat16}
    ids = load_file(exported / "drafter" / "model.safetensors")["draft_to_target"]
    assert torch.equal(ids, torch.arange(300))


def test_provenance_holds_the_checkpoints_facts_and_the_callers(exported, tiny_pair_sources):
    prov = json.loads((exported / "provenance.json").read_text())
    assert prov["wall_s"] == {"total": 12.5} and prov["export_command"] == ["export", "test"]
    assert prov["drafter"]["checkpoint"]["step"] == 40
    assert prov["drafter"]["config"]["draft_vocab_size"] == 300
    assert prov["target"] == tiny_pair_sources["target"]
    assert prov["preverifier"]["config"]["width"] == 16
    assert prov["pacer_defaults"]["policy"] == "pacer"
    assert json.loads((exported / "pacer_defaults.json").read_text()) == prov["pacer_defaults"]
    assert set(prov["files"]) == {"drafter/block_drafter.json", "drafter/model.safetensors",
                                  "preverifier/preverifier.json",
                                  "preverifier/model.safetensors", "pacer_defaults.json"}
    assert "commit" in prov["git"]


def test_the_acceptance_model_is_exported_in_bfloat16_with_its_config(tiny_pair_sources,
                                                                     tmp_path):
    from specdec.models.acceptance import AcceptanceConfig, AcceptanceModel

    config = AcceptanceConfig("suffix", 64, 4, width=16, heads=2, max_positions=8)
    model = AcceptanceModel(config, PreVerifier(config.net_config()), torch.zeros(320, 64))
    out = export_sources(tiny_pair_sources, tmp_path / "pair",
                         acceptance=str(model.save(tmp_path / "acceptance")))
    assert set(stored_dtypes(out / "acceptance-suffix" / "model.safetensors").values()) \
        == {torch.bfloat16}
    assert AcceptanceModel.load(out / "acceptance-suffix", torch.zeros(320, 64)).config == config
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["acceptance"]["config"]["drafter"] == "suffix"
    assert "acceptance-suffix/acceptance.json" in prov["files"]
    with pytest.raises(FileNotFoundError, match="not an acceptance checkpoint"):
        export_sources(tiny_pair_sources, tmp_path / "bad", acceptance=str(tmp_path / "pair"))


def assert_rounded(loaded: dict, source: dict) -> None:
    """Every float tensor is the source rounded to bfloat16, now in float32; ints unchanged."""
    assert loaded.keys() == source.keys()
    for name, value in loaded.items():
        if source[name].is_floating_point():
            assert value.dtype == torch.float32, name
            assert torch.equal(value, source[name].to(torch.bfloat16).float()), name
        else:
            assert value.dtype == source[name].dtype and torch.equal(value, source[name]), name


def test_exported_pair_loads_into_a_float32_target_as_the_rounded_weights(
        exported, tiny_pair_sources):
    target = load_target(tiny_pair_sources["target"], str(exported / "drafter"), "float32")
    drafter = BlockDrafter.load(exported / "drafter", target)
    source = load_file(f"{tiny_pair_sources['drafter']}/model.safetensors")
    assert_rounded(drafter.net.state_dict(), source)
    preverifier = PreVerifier.load(exported / "preverifier")
    assert_rounded(preverifier.state_dict(),
                   load_file(f"{tiny_pair_sources['preverifier']}/model.safetensors"))


def test_export_over_the_limit_is_refused_and_leaves_the_old_export(tiny_pair_sources, tmp_path):
    out = tmp_path / "pair"
    out.mkdir()
    (out / "old").write_text("previous export")
    with pytest.raises(ValueError, match="over the limit"):
        export_sources(tiny_pair_sources, out, limit_bytes=10_000)
    assert [p.name for p in tmp_path.iterdir()] == ["pair"]  # no temporary directory left
    assert [p.name for p in out.iterdir()] == ["old"]


def test_export_refuses_a_directory_of_the_wrong_kind(tiny_pair_sources, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a drafter checkpoint"):
        export(tiny_pair_sources["preverifier"], tiny_pair_sources["preverifier"], tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_registered_pair_is_lossless_in_the_engine(exported, store, tmp_path):
    refs = ensure_registered(exported, store["tracking_uri"])
    assert refs == {"drafter": "models:/tiny-pair-block-drafter@champion",
                    "preverifier": "models:/tiny-pair-preverifier@champion"}
    local = {k: resolve_model_ref(v, store["tracking_uri"], tmp_path / "dl")
             for k, v in refs.items()}
    provenance = json.loads((exported / "provenance.json").read_text())
    pair = load_pair(provenance["target"], local["drafter"], local["preverifier"], "float64")
    assert pair.drafter.draft_to_target.dtype == torch.int64
    plain = Engine(pair.target)
    spec = Engine(pair.target, pair.drafter, pair.preverifier)
    pacer = SpecSettings(**provenance["pacer_defaults"])
    for prompt in PROMPTS:
        ids = pair.target.tokenizer(prompt)["input_ids"]
        want = plain.generate(ids, GenerationParams(24)).token_ids
        fixed = spec.generate(ids, GenerationParams(24))
        assert fixed.token_ids == want and fixed.stats.drafted > 0
        assert spec.generate(ids, GenerationParams(24, spec=pacer)).token_ids == want
