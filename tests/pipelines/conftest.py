"""Fixtures for the pipeline tests: the session's Ray instance and job configs on the session's
MLflow store (``store``, tests/conftest.py, shared with the benchmark tests).

Ray is shared with the rest of the session through ``ray_cluster`` (tests/conftest.py).
"""

from __future__ import annotations

import pytest

from pipelines.common.config import parse_config


@pytest.fixture(scope="session")
def ray_session(ray_cluster):
    """The session's shared Ray instance (tests/conftest.py)."""
    return ray_cluster


def config(schema, store, **fields):
    """A job config with the session's MLflow store and fast, one-thread settings."""
    mlflow = {"tracking_uri": store["tracking_uri"], **fields.pop("mlflow", {})}
    return parse_config(schema, {**fields, "mlflow": mlflow}, "test")
