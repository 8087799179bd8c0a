"""Extra Serve applications for tests that must not disturb the session's app: each runs the
same tiny pair under its own name and route prefix on the session's Ray cluster and Serve
instance, with its own actors (so a test may kill them, or fuzz them with a small token cap).
"""

from __future__ import annotations

from contextlib import contextmanager

SMALL = {  # CPU shares small enough for three apps on the session's 4 CPUs
    "target_resources": {"num_cpus": 0.25}, "drafter_resources": {"num_cpus": 0.25},
    "server_num_cpus": 0.1,
}


def tiny_args(tiny_root, **overrides) -> dict:
    return {"target": f"tiny:{tiny_root}/target", "drafter": f"tiny:{tiny_root}/block-drafter",
            "model_id": "tiny", "dtype": "float64", **SMALL, **overrides}


@contextmanager
def extra_app(served: str, name: str, args: dict):
    """Serve ``args`` as application ``name`` at ``/<name>``; yield its base URL; delete it."""
    from ray import serve

    from cluster.app import build_app

    serve.run(build_app(args), name=name, route_prefix=f"/{name}")
    try:
        yield f"{served}/{name}"
    finally:
        serve.delete(name)
