"""The served tiny pair through the official openai client: outputs equal the engine's."""

from __future__ import annotations

import os

import pytest
import requests

from specdec.engine.settings import GenerationParams, SpecSettings

PROMPT = "hello world hello world, hello"
SETTINGS = [{}, {"policy": "heuristic", "gamma": 2}, {"verify": "asd", "asd_budget": 4.0},
            # the nested form: sections of the configs' knobs
            {"policy": "heuristic", "heuristic": {"initial": 2, "max_len": 6}, "verify": "asd",
             "asd": {"budget": 4.0, "gate": 0.5}}]


def engine_tokens(engine, prompt_ids, max_tokens, **spec):
    params = GenerationParams(max_tokens, spec=SpecSettings(**spec))
    return engine.generate(prompt_ids, params).token_ids


def test_health_and_models(served, client):
    health = requests.get(f"{served}/health", timeout=10).json()
    assert health["status"] == "ok"
    assert [m.id for m in client.models.list().data] == ["tiny"]
    # the target actor's process started with OpenMP's wait policy (the app's runtime_env), and
    # its plan shows it and the actor's torch threads
    plan, given = health["plan"], os.environ.get("OMP_WAIT_POLICY", "").lower()
    assert (plan["omp_wait_policy"], plan["threads"]) == (given or "default", 1)
    said = (f"omp_wait_policy: {given}, as the environment's OMP_WAIT_POLICY says" if given
            else "omp_wait_policy auto: default, libgomp's own (spin a while, then sleep): the "
                 "fastest alone by measurement")
    assert said in plan["reasons"]


@pytest.mark.parametrize("spec", SETTINGS)
def test_completion_equals_engine(client, engine, spec):
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40,
                                    extra_body={"speculative": spec})
    ids = engine.target_worker.target_model.tokenizer(PROMPT)["input_ids"]
    expected = engine_tokens(engine, ids, 40, **spec)
    choice = out.choices[0]
    assert choice.model_extra["token_ids"] == expected
    tokenizer = engine.target_worker.target_model.tokenizer
    assert choice.text == tokenizer.decode(expected, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == len(expected)
    stats = out.model_extra["spec_decode"]
    assert stats["committed"] == len(expected) and stats["rounds"] >= 1
    assert set(stats) >= {"drafted", "accepted", "mean_accepted_length", "accepted_per_position",
                          "regret_spent"}


def test_chat_equals_engine(client, engine):
    messages = [{"role": "user", "content": "say hi"}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=30)
    tok = engine.target_worker.target_model.tokenizer
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    expected = engine_tokens(engine, ids, 30)
    assert out.choices[0].model_extra["token_ids"] == expected
    assert out.choices[0].message.content == tok.decode(expected, skip_special_tokens=True)
    assert out.model_extra["spec_decode"]["committed"] == len(expected)


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_equals_non_streaming(client, chat):
    kwargs = dict(model="tiny", max_tokens=40)
    if chat:
        create, kwargs["messages"] = client.chat.completions.create, [{"role": "user", "content": PROMPT}]
    else:
        create, kwargs["prompt"] = client.completions.create, PROMPT
    whole = create(**kwargs)
    chunks = list(create(stream=True, **kwargs))
    text = "".join((c.choices[0].delta.content if chat else c.choices[0].text) or "" for c in chunks)
    tokens = sum((c.choices[0].model_extra["token_ids"] for c in chunks), [])
    assert tokens == whole.choices[0].model_extra["token_ids"]
    assert text == (whole.choices[0].message.content if chat else whole.choices[0].text)
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert last.model_extra["spec_decode"]["committed"] == len(tokens)
    assert last.choices[0].model_extra["spec_decode"] == last.model_extra["spec_decode"]


def test_raw_stream_ends_with_done(served):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "stream": True}
    with requests.post(f"{served}/v1/completions", json=body, stream=True, timeout=60) as r:
        lines = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"


def test_metrics_count_every_round(served, client):
    before = requests.get(f"{served}/debug/metrics", timeout=10).json()
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24)
    after = requests.get(f"{served}/debug/metrics", timeout=10).json()
    stats = out.model_extra["spec_decode"]
    for key in ("rounds", "drafted", "accepted"):
        assert after.get(key, 0) - before.get(key, 0) == stats[key], key
    assert after["requests"] - before.get("requests", 0) == 1
    assert after["committed"] - before.get("committed", 0) >= stats["committed"]
