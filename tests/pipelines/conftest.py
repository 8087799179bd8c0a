"""Fixtures for the pipeline tests: one Ray instance per session, tiny models, a tmp MLflow store.

Ray is shared with the rest of the session through ``ray_cluster`` (tests/conftest.py).
"""

from __future__ import annotations

import pytest

from pipelines.config import parse_config


@pytest.fixture(scope="session")
def ray_session(ray_cluster):
    """The session's shared Ray instance (tests/conftest.py)."""
    return ray_cluster


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """A fresh MLflow store (absolute sqlite URI) and pipeline home for the session."""
    root = tmp_path_factory.mktemp("pipelines")
    return {"root": root, "tracking_uri": f"sqlite:///{root / 'mlflow.db'}"}


def config(schema, store, **fields):
    """A job config with the session's MLflow store and fast, one-thread settings."""
    mlflow = {"tracking_uri": store["tracking_uri"], **fields.pop("mlflow", {})}
    return parse_config(schema, {**fields, "mlflow": mlflow}, "test")
