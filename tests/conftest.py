"""Shared fixtures: tiny random models (Llama and Qwen3 configs), built once per session."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch
from transformers import AutoModelForCausalLM

from specdec.models.tiny import make_tiny_models

# Tiny models run fastest on one thread, and tests must not fight over the two cores.
torch.set_num_threads(1)

# Every Ray instance of the session (this process's, and those of the processes it starts) keeps
# its files under a directory of its own: a `ray start` or a killed run elsewhere on the machine
# leaves /tmp/ray/ray_current_cluster behind, and ray.init would try to join that cluster. Short,
# since Ray puts its sockets under it.
OWN_RAY_TMPDIR = "RAY_TMPDIR" not in os.environ
if OWN_RAY_TMPDIR:
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rt", dir="/tmp")

PROMPTS = ["hello world hello world, hello", "def f(x):\n    return x + 1\n\ndef g(", "a"]


def make_noisy_copy(src, out, scale: float, seed: int):
    """A drafter that agrees with the target only partly: the target plus weight noise."""
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale * p.std())
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session", params=["llama", "qwen3"])
def tiny(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"tiny-{request.param}")
    paths = {k: str(v) for k, v in make_tiny_models(root, request.param).items()}
    paths["noisy"] = str(make_noisy_copy(paths["target"], root / "noisy", 0.1, seed=1))
    paths["arch"] = request.param
    return paths


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-llama-only")
    return {k: str(v) for k, v in make_tiny_models(root, "llama").items()}


def greedy_reference(model, prompt_ids: list[int], n: int, eos: frozenset[int]) -> list[int]:
    """Plain greedy decoding with no cache at all: the independent ground truth."""
    ids = list(prompt_ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            token = int(logits.argmax())
            out.append(token)
            ids.append(token)
            if token in eos:
                break
    return out


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance for the whole test session (Serve apps, Train and Data jobs)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 token auth (docs/DESIGN.md)
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    from ray import serve

    if ray.is_initialized():  # tests/cluster/test_multinode.py replaces it with its own cluster
        serve.shutdown()
        ray.shutdown()


def pytest_sessionfinish(session, exitstatus):
    if OWN_RAY_TMPDIR:  # a caller's own RAY_TMPDIR is left as it was
        shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)


def pytest_collection_modifyitems(items):
    """Tests marked ``multinode`` run last: their module shuts the session's Ray cluster down
    and starts one of several nodes (stable sort: the others keep their order)."""
    items.sort(key=lambda item: item.get_closest_marker("multinode") is not None)


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """A fresh MLflow store (absolute sqlite URI) and pipeline home for the session (the jobs'
    and the benchmarks' tests)."""
    root = tmp_path_factory.mktemp("pipelines")
    return {"root": root, "tracking_uri": f"sqlite:///{root / 'mlflow.db'}"}


@pytest.fixture(scope="session")
def tiny_pair_sources(tiny_llama, tmp_path_factory):
    """A stand-in for the trained default pair of the tiny Llama target (float64): a block
    drafter with a reduced vocabulary saved in a training checkpoint, a pre-verifier, and
    PACER defaults as the evaluate job logs them."""
    import json

    from specdec.engine.loading import load_pair
    from specdec.models.preverifier import PreVerifier, PreVerifierConfig

    root = tmp_path_factory.mktemp("tiny-pair-sources")
    pair = load_pair(tiny_llama["target"], tiny_llama["block-drafter"], dtype="float64")
    drafter = pair.drafter.with_vocabulary(torch.arange(300))  # keeps EOS (258)
    step = root / "checkpoints" / "step_0000040"
    drafter.save(step / "drafter")
    (step / "state.json").write_text(json.dumps({"step": 40, "loss": 2.5, "run_id": "r"}))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = PreVerifier(PreVerifierConfig(input_size=64, width=16, heads=2, max_positions=8))
    pacer = root / "pacer_defaults.json"
    pacer.write_text(json.dumps({"policy": "pacer", "block_size": 2, "threshold": 0.3,
                                 "growth": 1.2, "max_draft": 5}))
    return {"target": tiny_llama["target"], "drafter": str(step / "drafter"),
            "preverifier": str(net.save(root / "preverifier")), "pacer_defaults": str(pacer)}
