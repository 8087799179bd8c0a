"""``python -m cluster.serve_local [CONFIG]``: an embedded local Ray cluster serving one config.

Starts Ray in this process (token auth off: the cluster is private to this process), runs the
config's application on http://127.0.0.1:8000 and blocks until interrupted (Ctrl-C or SIGTERM,
e.g. from ``docker stop``: both shut Serve and Ray down). ``make serve`` runs it.
A config's top-level ``default_pair: DIR`` serves the committed trained pair in DIR from the
MLflow registry when DIR holds one (``cluster.default_pair.serve_args``), with the suffix
drafter's acceptance model when DIR holds that too, unless ``default_acceptance: false``; Serve
itself ignores those keys.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import yaml

DEFAULT = "configs/serve/local.yaml"
HTTP_OPTIONS = {"host": "127.0.0.1", "port": 8000}  # loopback only: set an API key to open it up


def describe(args: dict) -> str:
    """One line saying what the app serves: the pair, the policy and the verifier (the target's
    plan is printed once its actor has resolved it)."""
    from cluster.schema import ServeArgs
    from specdec.engine.settings import SpecSettings

    a = ServeArgs.model_validate(args)
    spec = SpecSettings(**a.speculative.model_dump(exclude_unset=True))
    verify = spec.verify or "strict (greedy; sampling at temperature > 0)"
    drafter = a.drafter if a.drafter != "hybrid" else f"hybrid (suffix + {a.block_drafter})"
    accepting = f" acceptance={a.acceptance}" if a.acceptance else ""
    return (f"serving target={a.target} drafter={drafter}{accepting} policy={spec.policy} "
            f"verify={verify} dtype={a.dtype} batching max_batch={a.batching.max_batch}")


def served_plan() -> str:
    """The target's resolved plan, as the running app's ``/health`` returns it."""
    import json
    import urllib.request

    from specdec.runtime.plan import describe as describe_plan

    url = f"http://{HTTP_OPTIONS['host']}:{HTTP_OPTIONS['port']}/health"
    key = os.environ.get("SPECDEC_API_KEY")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    plan = json.load(urllib.request.urlopen(request, timeout=30)).get("plan")
    return "plan: transformers (not the runtime)" if plan is None else describe_plan(plan)


def interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from cluster.app import build_app
    from cluster.default_pair import serve_args

    path = argv[0] if argv else DEFAULT
    doc = yaml.safe_load(open(path))
    app_cfg = doc["applications"][0]
    args = serve_args(app_cfg["args"], doc.get("default_pair"), doc.get("default_drafter", "block"),
                      doc.get("default_acceptance", True))
    print(describe(args), flush=True)
    ray.init(address="local", include_dashboard=False)  # embedded: never a cluster found on disk
    serve.start(http_options=HTTP_OPTIONS)
    serve.run(build_app(args), name=app_cfg["name"], route_prefix=app_cfg["route_prefix"])
    print(served_plan(), flush=True)
    print("specdec serving on http://127.0.0.1:8000 (OpenAI-compatible: /v1/completions, "
          "/v1/chat/completions, /v1/models, /health)", flush=True)
    print(f"READY model={app_cfg['args'].get('model_id') or app_cfg['args']['target']}", flush=True)
    # Ctrl-C and kill both shut Serve and Ray down; SIGINT set here too, since a shell script's
    # background job inherits it ignored (Python then leaves it so) and would leave Ray running
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
