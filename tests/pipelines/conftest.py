"""Fixtures for the pipeline tests: one Ray instance per session, tiny models, a tmp MLflow store.

Ray is shared: when another fixture of the session (``tests/cluster``) has already started Ray,
these tests reuse it and leave its shutdown to its owner.
"""

from __future__ import annotations

import os

import pytest

from pipelines.config import parse_config


@pytest.fixture(scope="session")
def ray_session():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 token auth (DESIGN.md)
    import ray

    owner = not ray.is_initialized()
    if owner:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if owner:
        ray.shutdown()


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """A fresh MLflow store (absolute sqlite URI) and pipeline home for the session."""
    root = tmp_path_factory.mktemp("pipelines")
    return {"root": root, "tracking_uri": f"sqlite:///{root / 'mlflow.db'}"}


def config(schema, store, **fields):
    """A job config with the session's MLflow store and fast, one-thread settings."""
    mlflow = {"tracking_uri": store["tracking_uri"], **fields.pop("mlflow", {})}
    return parse_config(schema, {**fields, "mlflow": mlflow}, "test")
