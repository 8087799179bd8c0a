"""Hostile input and unauthorised access, against a separate app with a small token cap and
an API key: schemathesis fuzzes every operation of the app's own OpenAPI schema (valid and
schema-violating cases) and no answer may be a 5xx or take longer than its timeout; oversized
bodies are refused with 413; prompts in any script round-trip through the tokenizer and are
served; every route but /health answers 401 without the key.
"""

from __future__ import annotations

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.cluster.extra_apps import extra_app, tiny_args

KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 16 * 1024
CASES_PER_POST, CASES_PER_GET = 150, 10


@pytest.fixture(scope="module")
def hostile_app(served, tiny_root):
    args = tiny_args(tiny_root, api_key=KEY, limits={
        "max_tokens": 8, "default_max_tokens": 4, "max_concurrent_requests": 4,
        "max_body_bytes": MAX_BODY})
    with extra_app(served, "hostile", args) as url:
        yield url


def operations(url: str):
    import schemathesis

    spec = requests.get(f"{url}/openapi.json", headers=AUTH, timeout=30).json()
    schema = schemathesis.openapi.from_dict(spec)
    return [result.ok() for result in schema.get_all_operations()]


def fuzz(operation, url: str, cases: int) -> int:
    """Run up to ``cases`` generated requests against ``operation``; return how many ran."""
    from schemathesis import GenerationMode

    ran = []
    modes = [operation.as_strategy(GenerationMode.POSITIVE)]
    if operation.method.upper() == "POST":
        modes.append(operation.as_strategy(GenerationMode.NEGATIVE))

    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(modes))
    def check(case):
        response = case.call(base_url=url, headers=AUTH, timeout=30)
        ran.append(response.status_code)
        assert response.status_code < 500, (case.body, response.status_code, response.text[:300])

    check()
    return len(ran)


@pytest.mark.timeout(300)
def test_fuzzing_the_openapi_schema_finds_no_5xx(hostile_app):
    ops = operations(hostile_app)
    paths = {f"{op.method.upper()} {op.path}" for op in ops}
    assert {"POST /v1/completions", "POST /v1/chat/completions"} <= paths
    counts = {}
    for op in ops:
        post = op.method.upper() == "POST"
        label = f"{op.method.upper()} {op.path}"
        counts[label] = fuzz(op, hostile_app, CASES_PER_POST if post else CASES_PER_GET)
    print(f"\nFUZZ cases={sum(counts.values())} by_operation={counts}")
    assert sum(counts.values()) >= 300


def test_the_schema_documents_the_request_bodies(hostile_app):
    spec = requests.get(f"{hostile_app}/openapi.json", headers=AUTH, timeout=30).json()
    body = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert {"model", "messages"} <= set(schema["required"])
    assert "$ref" not in str(schema)  # nested models are inlined


def test_oversized_bodies_are_refused(hostile_app):
    big = {"model": "tiny", "prompt": "x" * MAX_BODY, "max_tokens": 2}
    r = requests.post(f"{hostile_app}/v1/completions", json=big, headers=AUTH, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the server must count what arrives
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(MAX_BODY // 1024 + 1):
            yield b"y" * 1024
        yield b'"}'

    r = requests.post(f"{hostile_app}/v1/completions", data=chunks(), headers=AUTH, timeout=30)
    assert r.status_code == 413


UNICODE = [
    "naïve café, Ünïcödé", "日本語のテキスト", "Ελληνικά και русский", "עברית ومرحبا",
    "emoji 🧪🚀👩‍👩‍👧‍👦 flags 🇺🇦🇯🇵", "combining e\u0301 a\u0308 \u20dd", "zero\u200bwidth\ufeffjoin",
    "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∮ E⋅da = Q", "control \x01\x7f tab\tnewline\n", "nul \x00 byte",
    "private \ue000 plane 16 \U0010fffd", "noncharacter \ufffe \uffff",
]


@pytest.mark.parametrize("text", UNICODE)
def test_unicode_prompts_round_trip_and_are_served(hostile_app, engine, text):
    tokenizer = engine.target_worker.target_model.tokenizer
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    for path, body in [("completions", {"prompt": text}),
                       ("chat/completions", {"messages": [{"role": "user", "content": text}]})]:
        r = requests.post(f"{hostile_app}/v1/{path}", headers=AUTH, timeout=60,
                          json={"model": "tiny", "max_tokens": 2, **body})
        assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > len(ids)  # the chat template wraps the text


@pytest.mark.parametrize("raw", [
    b'{"model": "tiny", "prompt": "bad \\ud800 half", "max_tokens": 2}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}',
])
def test_a_lone_surrogate_is_a_400_not_a_500(hostile_app, raw):
    path = "chat/completions" if b"messages" in raw else "completions"
    r = requests.post(f"{hostile_app}/v1/{path}", data=raw, headers=AUTH, timeout=30)
    assert r.status_code == 400 and "Unicode" in r.json()["error"]["message"], r.text


# ---- the API key ---------------------------------------------------------------------------
ROUTES = [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
          ("GET", "/debug/active"), ("GET", "/debug/actors"), ("GET", "/debug/metrics"),
          ("GET", "/metrics"),
          ("GET", "/openapi.json"), ("GET", "/docs")]
BODY = {"model": "tiny", "prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize("method,route", ROUTES)
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic aG9zdGlsZQ==", "Bearer"])
def test_every_route_but_health_needs_the_key(hostile_app, method, route, header):
    headers = {} if header is None else {"Authorization": header}
    r = requests.request(method, f"{hostile_app}{route}", headers=headers, json=BODY, timeout=30)
    assert r.status_code == 401
    error = r.json()["error"]
    assert error["code"] == "invalid_api_key" and set(error) == {"message", "type", "param", "code"}


def test_with_the_key_routes_answer(hostile_app):
    assert requests.get(f"{hostile_app}/health", timeout=30).status_code == 200  # no key needed
    assert requests.get(f"{hostile_app}/v1/models", headers=AUTH, timeout=30).status_code == 200
    r = requests.post(f"{hostile_app}/v1/completions", headers=AUTH, json=BODY, timeout=30)
    assert r.status_code == 200


def test_the_openai_client_authenticates_with_the_key(hostile_app):
    import openai

    key = AUTH["Authorization"].removeprefix("Bearer ")
    good = openai.OpenAI(base_url=f"{hostile_app}/v1", api_key=key, max_retries=0, timeout=60)
    assert good.completions.create(model="tiny", prompt="hi", max_tokens=2).choices
    bad = openai.OpenAI(base_url=f"{hostile_app}/v1", api_key="nope", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
