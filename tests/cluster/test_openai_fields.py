"""Issue 16: the OpenAI request fields as clients use them, through the official openai client,
streamed and not, on the session's served tiny pair; served tokens equal the engine's.

stop / stop_token_ids, top_p / top_k / min_p, logprobs, n > 1, stream_options.include_usage,
the max_tokens default, seed, user, fields refused with a 400 naming them, and GET /metrics.
"""

from __future__ import annotations

import openai
import pytest
import requests

from specdec.engine.settings import GenerationParams
from specdec.engine.stops import StopStrings

PROMPT = "hello world hello world, hello"
MESSAGES = [{"role": "user", "content": PROMPT}]


def tokenizer(engine):
    return engine.target_worker.target_model.tokenizer


def decoder(engine):
    tok = tokenizer(engine)
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def prompt_ids(engine, chat: bool) -> list[int]:
    tok = tokenizer(engine)
    if not chat:
        return tok(PROMPT)["input_ids"]
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def create(client, chat: bool, **kwargs):
    if chat:
        return client.chat.completions.create(model="tiny", messages=MESSAGES, **kwargs)
    return client.completions.create(model="tiny", prompt=PROMPT, **kwargs)


def text_of(choice, chat: bool) -> str:
    if chat:
        return (choice.delta.content if hasattr(choice, "delta") else choice.message.content) or ""
    return choice.text or ""


def collect(chunks, chat: bool, n: int = 1) -> dict:
    """Per choice index: the streamed text pieces, token ids, finish reason and stats."""
    out = {i: {"pieces": [], "tokens": [], "finish": None, "stats": None} for i in range(n)}
    for chunk in chunks:
        for c in chunk.choices:
            o = out[c.index]
            o["pieces"].append(text_of(c, chat))
            o["tokens"] += c.model_extra["token_ids"]
            if c.finish_reason is not None:
                o["finish"], o["stats"] = c.finish_reason, c.model_extra["spec_decode"]
    return out


# ---- stop -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def full(engine):
    """The engine's greedy output (60 tokens) for each route, and its text."""
    out = {}
    for chat in (False, True):
        ids = engine.generate(prompt_ids(engine, chat), GenerationParams(60)).token_ids
        out[chat] = (ids, decoder(engine)(ids))
    return out


def a_stop_in(text: str) -> str:
    """A stop string of 3-4 characters from the middle of the text, first seen there."""
    for start in range(len(text) // 3, len(text) - 4):
        stop = text[start: start + 4].strip() or text[start: start + 3]
        if len(stop) >= 2 and text.find(stop) == start + text[start:].find(stop):
            return stop
    raise AssertionError(f"no stop string in {text!r}")


@pytest.mark.parametrize("chat", [False, True])
def test_stop_ends_the_text_before_the_stop_string(client, engine, full, chat):
    ids, text = full[chat]
    stop = a_stop_in(text)
    whole = create(client, chat, max_tokens=60, stop=[stop, "never-there"])
    choice = whole.choices[0]
    assert text_of(choice, chat) == text[: text.find(stop)]
    assert choice.finish_reason == "stop"
    expected = engine.generate(prompt_ids(engine, chat), GenerationParams(60),
                               StopStrings([stop], decoder(engine))).token_ids
    assert choice.model_extra["token_ids"] == expected == ids[: len(expected)]
    assert whole.usage.completion_tokens == len(expected) == whole.model_extra["spec_decode"]["committed"]
    # streamed: the same text, and no chunk ever carries any part of the stop string
    streamed = collect(create(client, chat, max_tokens=60, stop=stop, stream=True), chat)[0]
    assert "".join(streamed["pieces"]) == text_of(choice, chat)
    assert streamed["tokens"] == expected and streamed["finish"] == "stop"
    sent = ""
    for piece in streamed["pieces"]:
        sent += piece
        assert stop not in sent


def test_text_that_starts_a_stop_string_is_held_back_then_released(client, full):
    _, text = full[False]
    never = a_stop_in(text) + "\u2603never"  # begins like the output, never completes
    chunks = list(create(client, False, max_tokens=60, stop=never, stream=True))
    pieces = [c.choices[0].text for c in chunks if c.choices]
    # held-back text is released once decided, or at the end (tests/cluster/test_detokenize.py
    # checks the holding itself, chunk by chunk)
    assert "".join(pieces) == text and chunks[-1].choices[0].finish_reason == "length"


def test_stop_token_ids_end_the_output(client, full):
    ids, _ = full[False]
    stop_id = ids[9]
    out = create(client, False, max_tokens=60, extra_body={"stop_token_ids": [stop_id]})
    assert out.choices[0].model_extra["token_ids"] == ids[: ids.index(stop_id) + 1]
    assert out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stop", [["a", "b", "c", "d", "e"], [""], ""])
def test_bad_stop_is_a_400_naming_it(client, stop):
    with pytest.raises(openai.BadRequestError, match="stop"):
        create(client, False, max_tokens=4, stop=stop)


# ---- sampling: top_k / top_p / min_p, seed ----------------------------------------------------
@pytest.mark.parametrize("chat", [False, True])
def test_top_k_one_is_greedy(client, full, chat):
    out = create(client, chat, max_tokens=30, temperature=1.3, extra_body={"top_k": 1})
    assert out.choices[0].model_extra["token_ids"] == full[chat][0][:30]


@pytest.mark.parametrize("warp", [dict(top_p=0.5), dict(top_k=5, min_p=0.1)])
def test_truncated_sampling_equals_the_engine(client, engine, warp):
    top_p = warp.pop("top_p", 1.0)
    out = create(client, False, max_tokens=25, temperature=0.9, seed=11, top_p=top_p,
                 extra_body=warp)
    params = GenerationParams(25, temperature=0.9, seed=11, top_p=top_p, **warp)
    expected = engine.generate(prompt_ids(engine, False), params).token_ids
    assert out.choices[0].model_extra["token_ids"] == expected


def test_seed_is_honoured_and_its_absence_samples_afresh(client):
    def run(**kw):
        return create(client, False, max_tokens=20, temperature=1.0, **kw).choices[0].model_extra[
            "token_ids"]

    assert run(seed=5) == run(seed=5) != run(seed=6)
    assert run() != run()  # a fresh seed each time (20 tokens of a random tiny model)


@pytest.mark.parametrize("change,param", [({"top_p": 0.0}, "top_p"), ({"top_k": -3}, "top_k"),
                                          ({"min_p": 1.5}, "min_p"), ({"seed": -1}, "seed")])
def test_bad_sampling_fields_are_400s_naming_them(served, change, param):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 1.0, **change}
    r = requests.post(f"{served}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# ---- logprobs ---------------------------------------------------------------------------------
def engine_logprobs(engine, chat: bool, n: int, top: int):
    return engine.generate(prompt_ids(engine, chat), GenerationParams(n, logprobs=top))


def test_completion_logprobs_are_the_targets(client, engine):
    out = create(client, False, max_tokens=12, logprobs=2)
    ref = engine_logprobs(engine, False, 12, 2)
    lp = out.choices[0].logprobs
    assert out.choices[0].model_extra["token_ids"] == ref.token_ids
    assert lp.token_logprobs == pytest.approx(ref.logprobs.logprobs, abs=1e-9)
    tok = tokenizer(engine)
    assert lp.tokens == [tok.decode([t]) for t in ref.token_ids]
    assert all(1 <= len(d) <= 2 for d in lp.top_logprobs)  # 2 unless two ids share a string
    for d, ids, lps in zip(lp.top_logprobs, ref.logprobs.top_ids, ref.logprobs.top_logprobs,
                           strict=True):
        assert d[tok.decode([ids[0]])] == pytest.approx(lps[0], abs=1e-9)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    streamed = list(create(client, False, max_tokens=12, logprobs=2, stream=True))
    values = [x for c in streamed if c.choices and c.choices[0].logprobs
              for x in c.choices[0].logprobs.token_logprobs]
    assert values == pytest.approx(lp.token_logprobs, abs=1e-12)
    offsets = [x for c in streamed if c.choices and c.choices[0].logprobs
               for x in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset


def test_chat_logprobs_and_top_logprobs(client, engine):
    out = create(client, True, max_tokens=10, logprobs=True, top_logprobs=3)
    ref = engine_logprobs(engine, True, 10, 3)
    content = out.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(ref.logprobs.logprobs, abs=1e-9)
    assert all(len(c.top_logprobs) == 3 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.top_logprobs[-1].logprob for c in content)
    assert all(bytes(c.bytes).decode("utf-8", "replace") == c.token for c in content)
    plain = create(client, True, max_tokens=4)
    assert plain.choices[0].logprobs is None
    streamed = list(create(client, True, max_tokens=10, logprobs=True, top_logprobs=3, stream=True))
    values = [c.logprob for ch in streamed if ch.choices and ch.choices[0].logprobs
              for c in ch.choices[0].logprobs.content]
    assert values == pytest.approx([c.logprob for c in content], abs=1e-12)


@pytest.mark.parametrize("body,param", [
    ({"prompt": PROMPT, "logprobs": 6}, "logprobs"),
    ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
])
def test_bad_logprobs_are_400s(served, body, param):
    route = "chat/completions" if "messages" in body else "completions"
    r = requests.post(f"{served}/v1/{route}", json={"model": "tiny", "max_tokens": 2, **body},
                      timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# ---- n > 1 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("chat", [False, True])
def test_n_choices_are_independent_samples_seeded_seed_plus_i(client, engine, chat):
    out = create(client, chat, max_tokens=15, temperature=1.0, seed=40, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    ids = prompt_ids(engine, chat)
    for i, c in enumerate(out.choices):
        expected = engine.generate(ids, GenerationParams(15, temperature=1.0, seed=40 + i)).token_ids
        assert c.model_extra["token_ids"] == expected
        assert c.model_extra["spec_decode"]["committed"] == len(expected)
    assert out.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in out.choices)
    streamed = collect(create(client, chat, max_tokens=15, temperature=1.0, seed=40, n=3,
                              stream=True), chat, n=3)
    for i, c in enumerate(out.choices):
        assert streamed[i]["tokens"] == c.model_extra["token_ids"]
        assert "".join(streamed[i]["pieces"]) == text_of(c, chat)
        assert streamed[i]["stats"]["committed"] == len(c.model_extra["token_ids"])


def test_n_at_temperature_zero_repeats_the_greedy_output(client, full):
    out = create(client, False, max_tokens=10, n=2)
    assert [c.model_extra["token_ids"] for c in out.choices] == [full[False][0][:10]] * 2


def test_n_beyond_the_limit_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="n must be"):
        create(client, False, max_tokens=2, n=100)


# ---- usage in streams, max_tokens default -----------------------------------------------------
@pytest.mark.parametrize("chat", [False, True])
def test_include_usage_adds_a_last_chunk_with_usage_and_no_choices(client, chat):
    chunks = list(create(client, chat, max_tokens=12, stream=True,
                         stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(create(client, chat, max_tokens=12, stream=True))
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)


def test_stream_options_without_stream_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        create(client, False, max_tokens=2, stream_options={"include_usage": True})


def test_max_tokens_defaults_to_the_context_left(client, engine):
    out = create(client, False)
    n = len(prompt_ids(engine, False))
    # the app's max_tokens cap is 500
    left = min(engine.target_worker.target_model.max_length - n, 500)
    assert out.usage.completion_tokens == left or out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens > 128  # not the old fixed default


# ---- refused and accepted fields --------------------------------------------------------------
@pytest.mark.parametrize("chat,field,value", [
    (False, "frequency_penalty", 0.5), (False, "presence_penalty", 1.0), (False, "echo", True),
    (False, "best_of", 3), (False, "logit_bias", {"5": 10}), (False, "suffix", "x"),
    (True, "tools", [{"type": "function", "function": {"name": "f"}}]),
    (True, "response_format", {"type": "json_object"}), (True, "store", True),
    (False, "bogus_field", 1), (True, "functions", [{"name": "f"}]),
])
def test_unsupported_fields_are_400s_naming_them(client, chat, field, value):
    with pytest.raises(openai.BadRequestError, match=field) as err:
        create(client, chat, max_tokens=2, extra_body={field: value})
    assert err.value.body["param"] == field


@pytest.mark.parametrize("chat,fields", [
    (False, {"user": "u-1", "frequency_penalty": 0, "presence_penalty": 0.0, "echo": False,
             "best_of": 1, "logit_bias": {}}),
    (True, {"user": "u-1", "store": False, "response_format": {"type": "text"},
            "metadata": {"k": "v"}, "max_completion_tokens": 3}),
])
def test_neutral_values_of_unsupported_fields_are_accepted(client, chat, fields):
    out = create(client, chat, extra_body=fields, **({} if chat else {"max_tokens": 3}))
    assert out.usage.completion_tokens == 3


def test_text_parts_in_chat_content(client, full):
    parts = [{"type": "text", "text": PROMPT[:10]}, {"type": "text", "text": PROMPT[10:]}]
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}],
                                         max_tokens=10)
    assert out.choices[0].model_extra["token_ids"] == full[True][0][:10]


# ---- GET /metrics -----------------------------------------------------------------------------
def scrape(served) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, parsed by prometheus_client's own text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    r = requests.get(f"{served}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_count_requests_tokens_and_speculation(served, client):
    before = scrape(served)
    out = create(client, False, max_tokens=24)
    after = scrape(served)
    stats = out.model_extra["spec_decode"]

    def delta(name: str, **labels) -> float:
        key = (f"specdec:{name}", tuple(sorted({"model_name": "tiny", **labels}.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("request_success_total", finished_reason="length") == 1
    assert delta("generation_tokens_total") == 24
    assert delta("prompt_tokens_total") == out.usage.prompt_tokens
    assert delta("spec_decode_num_draft_tokens_total") == stats["drafted"] > 0
    assert delta("spec_decode_num_accepted_tokens_total") == stats["accepted"]
    assert delta("spec_decode_num_drafts_total") == sum(
        v for k, v in stats["draft_length_histogram"].items() if k != "0")
    for i, count in enumerate(stats["accepted_per_position"]):
        assert delta("spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) == count
    assert delta("e2e_request_latency_seconds_count") == 1
    assert delta("time_to_first_token_seconds_count") == 1
    assert ("specdec:num_requests_running", (("model_name", "tiny"),)) in after
