"""Access: the server binds 127.0.0.1 by default; the API key comes from config or env;
models load only from safetensors, and only from named sources, the registry or allowed paths.

The routes' answers with and without the key are tested on the app that has one, in
``test_hostile_input.py``; the tests here need no app of their own.
"""

from __future__ import annotations

import socket

import pytest

from cluster import serve_local
from cluster.guard import api_key


def test_the_key_comes_from_config_else_env():
    assert api_key("from-config", {"SPECDEC_API_KEY": "from-env"}) == "from-config"
    assert api_key(None, {"SPECDEC_API_KEY": "from-env"}) == "from-env"
    assert api_key(None, {"SPECDEC_API_KEY": ""}) is None and api_key(None, {}) is None


def test_the_key_is_not_in_the_config_repr():
    from cluster.schema import ServeArgs

    assert "secret" not in repr(ServeArgs(target="x", api_key="secret"))


def outward_address() -> str | None:
    """An address of this machine other than loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks a route
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_the_local_server_binds_loopback_only(served):
    assert serve_local.HTTP_OPTIONS["host"] == "127.0.0.1"
    port = int(served.rsplit(":", 1)[1])
    address = outward_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    with pytest.raises(OSError):
        socket.create_connection((address, port), timeout=5).close()


def test_the_local_server_says_what_it_serves():
    line = serve_local.describe({"target": "smollm2-135m", "drafter": "suffix", "dtype": "bfloat16",
                                 "speculative": {"policy": "pacer", "verify": "asd"}})
    assert line == ("serving target=smollm2-135m drafter=suffix policy=pacer verify=asd "
                    "dtype=bfloat16 batching max_batch=32")
    assert "verify=strict" in serve_local.describe({"target": "t", "drafter": "ngram"})


# ---- where models may come from --------------------------------------------------------------
def pickle_only_model(directory) -> str:
    """A tiny model directory whose weights are a pickle (pytorch_model.bin), no safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    model = AutoModelForCausalLM.from_config(config)
    config.save_pretrained(directory)
    torch.save(model.state_dict(), directory / "pytorch_model.bin")
    return str(directory)


def test_a_pickle_only_model_is_refused(tmp_path):
    from specdec.models.ar_drafter import ARDrafter
    from specdec.models.target import TargetModel

    path = pickle_only_model(tmp_path)
    with pytest.raises(OSError, match="safetensors"):
        TargetModel.from_pretrained(path)
    with pytest.raises(OSError, match="safetensors"):
        ARDrafter.from_pretrained(path)


def test_models_come_only_from_named_sources_the_registry_or_allowed_paths(tmp_path):
    from cluster.app import check_source

    for ok in ["smollm2-135m", "ngram", "none", "models:/drafter@champion", str(tmp_path)]:
        check_source(ok, ())
    check_source(str(tmp_path), (str(tmp_path.parent),))
    with pytest.raises(ValueError, match="not a named source"):
        check_source("HuggingFaceTB/SmolLM2-135M", ())  # a hub id
    with pytest.raises(ValueError, match="not a named source"):
        check_source(str(tmp_path / "missing"), ())
    with pytest.raises(ValueError, match="outside the allowed model_roots"):
        check_source(str(tmp_path), (str(tmp_path / "elsewhere"),))
    with pytest.raises(ValueError, match="outside"):
        check_source(f"{tmp_path}/../{tmp_path.name}/..", (str(tmp_path),))  # no escape via ..


def test_metrics_can_be_opened_to_scrapers_without_the_key():
    """``metrics_public: true`` adds /metrics to the gate's open paths (the hostile app checks
    that it is closed by default); the real middleware, called over ASGI."""
    import asyncio

    from cluster.guard import OPEN_PATHS, Guard

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def status(guard, path, headers=()):
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": path, "headers": list(headers), "root_path": ""}
        asyncio.run(guard(scope, receive, send))
        return sent[0]["status"]

    public = Guard(app, key="k", max_body_bytes=1024, open_paths=OPEN_PATHS | {"/metrics"})
    closed = Guard(app, key="k", max_body_bytes=1024)
    assert status(public, "/metrics") == 200 and status(public, "/health") == 200
    assert status(public, "/v1/models") == 401
    assert status(closed, "/metrics") == 401
    assert status(closed, "/metrics", [(b"authorization", b"Bearer k")]) == 200
