"""Continuous batching over HTTP: concurrent requests (streamed and not, mixed prompt lengths,
some joining mid-flight) share target steps and each gets the engine's tokens alone; the steps
show in ``/debug/metrics`` and ``/metrics``. Several replicas, each serving the engine's tokens
and keeping no state: tests/cluster/test_multinode.py."""

from __future__ import annotations

import threading
import time

import requests

from tests.cluster.extra_apps import extra_app, tiny_args
from tests.cluster.test_api import engine_tokens

PROMPTS = ["a", "hello world hello world, hello", "def f(x):\n    return x + 1\n\ndef g(",
           "one two three four five six seven eight nine ten " * 3, "zz zz zz", "abc abc abc"]
SPEC = {"verify": "asd", "asd_budget": 0.0}  # ASD with B = 0: exact, through the ASD code path


def served_tokens(client, prompt: str, stream: bool, max_tokens: int, spec=SPEC) -> list[int]:
    kw = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
          "extra_body": {"speculative": spec}}
    if not stream:
        return client.completions.create(**kw).choices[0].model_extra["token_ids"]
    chunks = client.completions.create(**kw, stream=True)
    return sum((c.choices[0].model_extra["token_ids"] for c in chunks), [])


def run_concurrently(client, prompts, max_tokens=40, stagger_s=0.02,
                     spec=SPEC) -> dict[int, list[int]]:
    out = {}

    def one(i, prompt):
        out[i] = served_tokens(client, prompt, stream=i % 2 == 0, max_tokens=max_tokens,
                               spec=spec)

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
        time.sleep(stagger_s)  # later requests join running ones
    for t in threads:
        t.join(120)
    return out


def test_batched_requests_equal_the_engine_alone(served, client, engine):
    before = requests.get(f"{served}/debug/metrics", timeout=30).json()
    out = run_concurrently(client, PROMPTS)
    tok = engine.target_worker.target_model.tokenizer
    for i, prompt in enumerate(PROMPTS):
        assert out[i] == engine_tokens(engine, tok(prompt)["input_ids"], 40, **SPEC), prompt
    after = requests.get(f"{served}/debug/metrics", timeout=30).json()
    steps = after["steps"] - before.get("steps", 0)
    batched = after["step_requests"] - before.get("step_requests", 0)
    assert steps > 0 and batched / steps > 1.0, "no target step held two requests"
    assert after["mean_step_s"] > 0
    text = requests.get(f"{served}/metrics", timeout=30).text
    for name in ("specdec:batch_size_bucket", "specdec:iteration_tokens_total_bucket",
                 "specdec:step_queue_time_seconds_bucket", "specdec:step_duration_seconds_bucket",
                 "specdec:kv_slots_used",
                 "specdec:kv_cache_usage_perc"):
        assert name in text, name


def test_a_target_that_drafts_serves_the_engine_tokens_and_keeps_no_state(served, tiny_root):
    """The n-gram drafter runs on the target actor (drafter_placement auto): no drafter actor,
    each request runs whole on the target (one call a request, its rounds streamed back), and
    each concurrent request (streamed or not, joining mid-flight) gets the engine's tokens
    alone, strict and with ASD at B = 0 and B > 0; a stop string, which only the replica sees,
    ends the request there and its close ends the target's loop of it."""
    from openai import OpenAI

    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_pair
    from specdec.engine.settings import GenerationParams, SpecSettings
    from specdec.engine.stops import StopStrings
    from tests.cluster.test_openai_fields import a_stop_in, scrape

    pair = load_pair(f"{tiny_root}/target", "ngram", dtype="float64")
    engine, tok = Engine(pair.target, pair.drafter), pair.target.tokenizer
    with extra_app(served, "target-drafts", tiny_args(tiny_root, drafter="ngram")) as url:
        assert requests.get(f"{url}/debug/actors", timeout=30).json()["drafter"] is None
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        for spec in (SPEC, {"verify": "strict"}, {"verify": "asd", "asd_budget": 2.0}):
            out = run_concurrently(client, PROMPTS, spec=spec)
            for i, prompt in enumerate(PROMPTS):
                alone = engine_tokens(engine, tok(prompt)["input_ids"], 40, **spec)
                assert out[i] == alone, (spec, prompt)
        body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 40}
        before = scrape(url)
        stats = requests.post(f"{url}/v1/completions", json=body, timeout=60).json()["spec_decode"]
        after = scrape(url)
        assert stats["mean_accepted_length"] > 1  # the target's own drafts were accepted
        # Not streamed, no stop strings: its answers came in one message at the end, and the
        # time to its first token is still the first round's, not the whole request's.
        ttft, e2e = (after[key] - before.get(key, 0.0) for key in (
            ("specdec:time_to_first_token_seconds_sum", (("model_name", "tiny"),)),
            ("specdec:e2e_request_latency_seconds_sum", (("model_name", "tiny"),))))
        assert 0 < ttft < 0.6 * e2e
        ids, strict = tok(PROMPTS[1])["input_ids"], GenerationParams(40, spec=SpecSettings(verify="strict"))
        decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731
        stop = a_stop_in(decode(engine.generate(ids, strict).token_ids))
        cut = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=40, stop=[stop],
                                        extra_body={"speculative": {"verify": "strict"}}).choices[0]
        assert cut.finish_reason == "stop"
        assert cut.model_extra["token_ids"] == engine.generate(ids, strict, StopStrings([stop], decode)).token_ids
        deadline = time.monotonic() + 30
        while requests.get(f"{url}/debug/active", timeout=30).json()["target"]:
            assert time.monotonic() < deadline, "state left in the target actor"
            time.sleep(0.05)
