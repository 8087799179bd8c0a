"""Serving the suffix and hybrid drafters over HTTP: lossless (strict, and ASD with B = 0)
against the engine, the suffix index from the MLflow registry, the suffix drafter's acceptance
model (on, and off per request), per-request suffix settings, and a clear start-up error for a
missing or malformed index."""

from __future__ import annotations

import pytest

from specdec.engine.settings import GenerationParams
from specdec.models.suffix_index import SuffixIndex
from tests.cluster.extra_apps import extra_app, tiny_args
from tests.cluster.test_registry_serving import register_directory

PROMPT = "hello world hello world, hello"
N = 24


@pytest.fixture(scope="module")
def greedy(engine):
    ids = engine.target_worker.target_model.tokenizer(PROMPT)["input_ids"]
    return engine.generate(ids, GenerationParams(N)).token_ids


@pytest.fixture(scope="module")
def index_store(served, engine, greedy, tmp_path_factory):
    """An index holding the prompt's own greedy output, registered as tiny-suffix-index@champion."""
    import mlflow

    root = tmp_path_factory.mktemp("suffix-registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("suffix", artifact_location=str(root / "artifacts"))
    vocab_size = engine.target_worker.target_model.vocab_size
    index = SuffixIndex((tuple(greedy),), "tiny", vocab_size).save(root / "index")
    register_directory(mlflow.MlflowClient(), experiment, index, "tiny-suffix-index")
    return uri


def complete(url: str, **speculative) -> dict:
    import requests

    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": N, "speculative": speculative}
    return requests.post(f"{url}/v1/completions", json=body, timeout=120).json()


def test_suffix_with_registered_index_is_lossless(served, tiny_root, index_store, greedy):
    """With an (untrained) acceptance model on the target too: PACER on it, the goodput's
    prices by it, and a request that turns it off all give plain greedy tokens."""
    args = tiny_args(tiny_root, drafter="suffix", mlflow_tracking_uri=index_store,
                     suffix={"index": "models:/tiny-suffix-index@champion"},
                     acceptance="untrained")
    with extra_app(served, "suffix", args) as url:
        strict = complete(url, policy="fixed", gamma=16)
        asd = complete(url, gamma=16, verify="asd", asd_budget=0.0, suffix_min_prob=0.2)
        pacer = complete(url, policy="pacer", block_size=2, threshold=0.2, max_draft=16)
        off = complete(url, policy="fixed", gamma=16, acceptance=False)
        bad = complete(url, suffix_min_prob=2.0)
        no_model = complete(url, policy="pacer", acceptance=False)
    for out in (strict, asd, pacer, off):
        assert out["choices"][0]["token_ids"] == greedy
    assert no_model["error"]["param"] == "speculative.policy"
    stats = strict["spec_decode"]
    assert stats["draft_sources"]["suffix"] >= 1
    assert stats["mean_accepted_length"] > 3  # the index holds this very output
    assert bad["error"]["param"].startswith("speculative")


def test_hybrid_is_lossless_and_counts_sources(served, tiny_root, greedy):
    args = tiny_args(tiny_root, drafter="hybrid", block_drafter=f"tiny:{tiny_root}/block-drafter",
                     preverifier="untrained", speculative={"gamma": 16, "hybrid_skip": 2.0})
    with extra_app(served, "hybrid", args) as url:
        outs = [complete(url), complete(url, verify="asd", asd_budget=0.0),
                complete(url, hybrid_skip=100.0)]
        pacer = complete(url, policy="pacer")
    for out in outs:
        assert out["choices"][0]["token_ids"] == greedy
    sources = {k for out in outs for k in out["spec_decode"]["draft_sources"]}
    assert sources == {"suffix", "block"}  # warm rounds skip the block drafter; skip 100 never
    assert pacer["error"]["param"] == "speculative.policy"


@pytest.mark.parametrize("damage", ["missing", "malformed"])
def test_bad_index_fails_at_start_up(tiny_root, tmp_path, damage):
    from cluster.app import build_app

    path = tmp_path / "index"
    if damage == "malformed":
        SuffixIndex(((1, 2),), "tiny", 300).save(path)
        (path / "suffix_index.json").write_text("{oops")
    args = tiny_args(tiny_root, drafter="suffix", suffix={"index": str(path)})
    with pytest.raises(ValueError, match="an existing local directory|not valid JSON"):
        build_app(args)
