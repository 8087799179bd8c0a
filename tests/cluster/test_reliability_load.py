"""Load on the session's app (a drafter actor: two actor calls a round) and on one whose
target drafts itself (n-gram: each request runs whole on the target actor, one call a
request): 200 requests at concurrency 8, streamed and not, mixed settings.

Every output must equal its sequential run, no request may fail, no per-request state may be
left in the actors afterwards, and the actors' resident memory must stay within 10% of its
level after a warm-up pass. Prints the numbers that docs/RELIABILITY.md records.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.cluster.extra_apps import extra_app, tiny_args
from tests.cluster.test_load import wait_idle

REQUESTS, CONCURRENCY, MAX_TOKENS = 200, 8, 12
SETTINGS = [{}, {"policy": "heuristic", "gamma": 2}, {"verify": "asd", "asd_budget": 4.0}]
PROMPTS = [f"load {i}: " + "xy" * (i % 7) + " the end" for i in range(10)]


def workload() -> list[tuple[str, dict, bool]]:
    """(prompt, speculative settings, stream) for each request; every other one streams."""
    cases = [(p, s) for p in PROMPTS for s in SETTINGS]
    return [(*cases[i % len(cases)], i % 2 == 1) for i in range(REQUESTS)]


def body(prompt: str, spec: dict, stream: bool) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": stream,
            "speculative": spec}


def complete(served: str, prompt: str, spec: dict, stream: bool) -> list[int]:
    """The completion's token ids; raises on any error status or in-band error event."""
    r = requests.post(f"{served}/v1/completions", json=body(prompt, spec, stream),
                      stream=stream, timeout=60)
    r.raise_for_status()
    if not stream:
        return r.json()["choices"][0]["token_ids"]
    tokens = []
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            raise RuntimeError(event["error"]["message"])
        tokens += event["choices"][0]["token_ids"]
    return tokens


def resident(served: str) -> dict[str, int]:
    actors = requests.get(f"{served}/debug/actors", timeout=10).json()
    return {name: info["rss_bytes"] for name, info in actors.items() if info is not None}


def test_200_requests_at_concurrency_8(served):
    load(served, "LOAD")


def test_200_requests_at_concurrency_8_run_whole_on_the_target(served, tiny_root):
    with extra_app(served, "load-whole", tiny_args(tiny_root, drafter="ngram")) as url:
        assert requests.get(f"{url}/debug/actors", timeout=30).json()["drafter"] is None
        load(url, "LOAD-WHOLE")


def load(served: str, tag: str) -> None:
    """The load: every output equals its sequential run, no error, no state left, and the
    actors' memory within 10% of its level after the warm-up; prints the figures."""
    cold = resident(served)
    sequential = {(p, json.dumps(s)): complete(served, p, s, False)
                  for p in PROMPTS for s in SETTINGS}
    warm = resident(served)

    def one(case):
        prompt, spec, stream = case
        try:
            return complete(served, prompt, spec, stream) == sequential[(prompt, json.dumps(spec))]
        except Exception as e:  # counted, and reported below
            return repr(e)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        outcomes = list(pool.map(one, workload()))
    seconds = time.perf_counter() - t0
    errors = [o for o in outcomes if o is not True and o is not False]
    assert not errors, errors[:3]
    assert all(outcomes), f"{outcomes.count(False)} outputs differ from their sequential run"
    assert wait_idle(served) == {"target": [], "drafter": []}
    after = resident(served)
    growth = {name: after[name] / warm[name] - 1 for name in warm}
    print(f"\n{tag} requests={REQUESTS} concurrency={CONCURRENCY} max_tokens={MAX_TOKENS} "
          f"seconds={seconds:.1f} rps={REQUESTS / seconds:.1f} errors={len(errors)} "
          f"cold_mb={ {k: round(v / 2**20) for k, v in cold.items()} } "
          f"warm_mb={ {k: round(v / 2**20) for k, v in warm.items()} } "
          f"after_mb={ {k: round(v / 2**20) for k, v in after.items()} } "
          f"growth={ {k: f'{v:+.1%}' for k, v in growth.items()} }")
    assert all(abs(g) <= 0.10 for g in growth.values()), growth
