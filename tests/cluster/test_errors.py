"""Bad input gets OpenAI-style error JSON with the right status, never a 500."""

from __future__ import annotations

import pytest
import requests

GOOD = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
CASES = [
    ({"prompt": ""}, 400, "prompt is empty"),
    ({"prompt": [5] * 600}, 400, "context"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 501}, 400, "max_tokens"),
    ({"temperature": -0.5}, 400, "temperature"),
    ({"speculative": {"policy": "bogus"}}, 400, "speculative.policy"),
    ({"speculative": {"verify": "nope"}}, 400, "speculative.verify"),
    ({"speculative": {"verify": "asd", "asd_budget": -1.0}}, 400, "asd_budget"),
    ({"speculative": {"gamma": "four"}}, 400, "speculative.gamma"),
    ({"speculative": {"unknown": 1}}, 400, "speculative.unknown"),
    ({"speculative": {"asd": {"gate": -1.0}}}, 400, "speculative.asd.gate"),
    ({"speculative": {"pacer": {"bogus": 1}}}, 400, "speculative.pacer.bogus"),
    ({"speculative": {"policy": "pacer"}}, 400, "pre-verifier"),
    ({"max_tokens": "ten"}, 400, "max_tokens"),
    ({"prompt": 42}, 400, "prompt"),
    ({"temperature": 0.5, "speculative": {"verify": "strict"}}, 400, "sample"),
    ({"model": "gpt-4"}, 404, "does not exist"),
]


@pytest.mark.parametrize("change,status,message", CASES)
def test_bad_completion_requests(served, change, status, message):
    r = requests.post(f"{served}/v1/completions", json={**GOOD, **change}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"] + str(error["param"])
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("messages,message", [
    ([], "empty"), ([{"role": "user", "content": "  "}], "empty"),
    ([{"role": "wizard", "content": "hi"}], "messages.0.role"),
])
def test_bad_chat_requests(served, messages, message):
    body = {"model": "tiny", "messages": messages, "max_tokens": 4}
    r = requests.post(f"{served}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"] + str(error["param"])


def test_body_that_is_not_json(served):
    r = requests.post(f"{served}/v1/completions", data=b"{not json", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_openai_client_raises_with_the_status(client):
    import openai

    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny", prompt="hi", max_tokens=0)
