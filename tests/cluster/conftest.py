"""One Ray cluster and one Serve app (the tiny pair, float64) for the whole test session.

The app serves the tiny block drafter, so features cross from the target actor to the drafter
actor; the reference is the single-process engine on the same pair and settings.
"""

from __future__ import annotations

import socket

import pytest

from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair

LIMIT = 8  # max concurrent requests of the served app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("served-tiny")


@pytest.fixture(scope="session")
def served(ray_cluster, tiny_root):
    """The base URL of the served tiny pair."""
    from ray import serve

    from cluster.app import build_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = build_app({
        "target": f"tiny:{tiny_root}/target", "drafter": f"tiny:{tiny_root}/block-drafter",
        "model_id": "tiny", "dtype": "float64",
        "target_resources": {"num_cpus": 0.5}, "drafter_resources": {"num_cpus": 0.5},
        "server_num_cpus": 0.25,
        "limits": {"max_tokens": 500, "max_concurrent_requests": LIMIT},
    })
    serve.run(app, name="specdec-test", route_prefix="/")
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def engine(served, tiny_root):
    pair = load_pair(f"{tiny_root}/target", f"{tiny_root}/block-drafter", dtype="float64")
    return Engine(pair.target, pair.drafter)


@pytest.fixture()
def client(served):
    from openai import OpenAI

    return OpenAI(base_url=f"{served}/v1", api_key="unused", max_retries=0, timeout=60)
