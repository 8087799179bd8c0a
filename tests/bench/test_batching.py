"""The serving benchmark at concurrency (``bench.batching``) end to end on the tiny pair, in its
own process (it starts its own Ray): the served SD app returns the in-process engine's tokens at
every level, and the report holds each level and the goals. An external
OpenAI-compatible server is an arm beside them (a peer such as llama-server): here the tiny app's
own AR route stands in for it, a real server the harness reaches only through its URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["def add(a, b):\n    return", "hello hello hello", "one two three one two"]


def test_the_served_path_is_measured_against_the_in_process_engine_and_a_peer(tmp_path):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    out = tmp_path / "out"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.batching", "--config", "configs/serve/tiny.yaml",
         "--prompts-file", str(prompts), "--max-tokens", "12", "--concurrency", "1", "2",
         "--repeats", "1", "--engine", "--port", "8047", "--out", str(out),
         "--peer", "peer=http://127.0.0.1:8047/ar/"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert set(result["summary"]) == {"ar", "sd", "sd_engine", "peer"}
    assert set(result["summary"]["sd_engine"]) == {"1"}
    # lossless everywhere: served SD at each level equals the engine's tokens, and AR's
    ours = {k: c for k, c in result["checks"].items() if not k.startswith("peer@")}
    assert len(ours) == 5 and all(c["same_as_sequential"] and c["same_as_ar"] for c in ours.values())
    # the peer: measured at each level like the others, its outputs never compared (even though
    # this one decodes AR's very tokens), no target steps of its own, its goals against ours
    for c in ("1", "2"):
        level = result["summary"]["peer"][c]
        assert level["tokens_per_s"] > 0 and level["mean_batch"] is None and "step_ms" not in level
        assert result["checks"][f"peer@c{c}"] == {"same_as_sequential": None, "same_as_ar": None,
                                                   "reference": None}
    assert result["meta"]["peers"] == {"peer": "http://127.0.0.1:8047/ar"}
    peer_goal = result["goals"]["sd_c1_over_peer_c1"]
    assert peer_goal["goal"] == 1.0 and peer_goal["met"] == (peer_goal["value"] >= 1.0)
    assert "ar_c1_over_peer_c1" in result["goals"] and "sd_c8_over_peer_c8" not in result["goals"]
    goal = result["goals"]["sd_served_c1_over_engine"]
    assert goal["value"] > 0 and goal["met"] == (goal["value"] >= 0.95)
    assert result["meta"]["prompts"] == len(PROMPTS)
    md = (out / "result.md").read_text()
    assert "| sd_engine | 1 |" in md and "| peer | 2 |" in md
    assert "not compared | not compared |" in md and "outputs not compared" in md
    # each SD level splits its round time: the target's share and the rest
    for method in ("sd", "sd_engine"):
        level = result["summary"][method]["1"]
        assert level["target_ms_per_round"] > 0 and level["rest_ms_per_round"] >= 0, method


def test_a_bad_prompts_file_is_refused(tmp_path):
    bad = tmp_path / "prompts.json"
    bad.write_text(json.dumps({"prompt": "not a list"}))
    done = subprocess.run(
        [sys.executable, "-m", "bench.batching", "--config", "configs/serve/tiny.yaml",
         "--prompts-file", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--prompts-file" in done.stderr


def test_chat_prompts_are_held_out_sharegpt_turns_in_the_chat_template(tiny_llama):
    from transformers import AutoTokenizer

    from bench.batching import chat_prompts
    from pipelines.common.datasets import BENCHMARK_PERCENT, DEV_PERCENT, benchmark_chats, split_of

    chats = benchmark_chats(3)
    assert len(chats) == 3 and all(split_of(key, BENCHMARK_PERCENT, DEV_PERCENT) == "benchmark"
                                   for key, _ in chats)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama["target"])
    prompts = chat_prompts(3, tiny_llama["target"])
    for (_, turn), prompt in zip(chats, prompts, strict=True):
        assert prompt == tokenizer.apply_chat_template(
            [{"role": "user", "content": turn}], tokenize=False, add_generation_prompt=True)


def test_a_peer_needs_a_name_and_a_url():
    from bench.batching import parse_peer

    assert parse_peer("llama=http://127.0.0.1:8080/") == ("llama", "http://127.0.0.1:8080")
    for bad in ("llama", "=http://x", "llama=127.0.0.1:8080", "sd=http://x"):
        with pytest.raises(ValueError, match="--peer"):
            parse_peer(bad)


def test_a_variant_is_the_default_with_some_args_changed():
    from bench.batching import BUILTIN, method_args
    from bench.report import named_json

    name, changes = named_json('sd_caps={"batching": {"draft_caps": {"8": 2}}}', "--variant", BUILTIN)
    sd = {"drafter": "suffix", "suffix": {"index": "x"}, "batching": {"max_batch": 32}}
    apps = method_args(sd, {name: changes})
    assert apps["sd_caps"]["batching"] == {"max_batch": 32, "draft_caps": {"8": 2}}
    assert apps["sd_caps"]["suffix"] == apps["sd"]["suffix"] == {"index": "x", "online": False}
    assert "draft_caps" not in apps["sd"]["batching"]
    plain = method_args(sd, {"ar_bf16": {"drafter": "none", "dtype": "bfloat16"}})["ar_bf16"]
    assert plain == {"drafter": "none", "dtype": "bfloat16", "batching": {"max_batch": 32}}
    for bad in ("sd_caps", "sd_caps=[1]", "sd_caps={oops", 'sd={"x": 1}'):
        with pytest.raises(ValueError, match="--variant"):
            named_json(bad, "--variant", BUILTIN)


def test_each_method_is_checked_against_plain_decoding_of_its_own_numerics():
    """Its own dtype and batch-invariant attention: other numerics decode other tokens."""
    from bench.batching import references, summarise

    apps = {"ar": {"drafter": "none", "dtype": "float32"},
            "sd": {"drafter": "suffix", "dtype": "float32"},
            "sd_bf16": {"drafter": "suffix", "dtype": "bfloat16"},
            "ar_bf16": {"drafter": "none", "dtype": "bfloat16"},
            "sd_f64": {"drafter": "suffix", "dtype": "float64"},
            "sd_pq": {"drafter": "suffix", "dtype": "bfloat16", "attention": "per_query"},
            "ar_pq": {"drafter": "none", "dtype": "bfloat16", "attention": "per_query"}}
    refs = references(apps)
    assert refs == {"ar": "ar", "sd": "ar", "sd_bf16": "ar_bf16", "ar_bf16": "ar_bf16",
                    "sd_f64": "ar", "sd_pq": "ar_pq", "ar_pq": "ar_pq", "sd_engine": "ar"}

    def run(ids):
        return {"token_ids": ids, "tokens_per_s": 1.0, "p50_s": 1.0, "p95_s": 1.0, "mean_batch": 1.0}

    runs = {("ar", 1): [run([[1, 2]])], ("sd", 1): [run([[1, 2]])],
            ("ar_bf16", 1): [run([[1, 3]])], ("sd_bf16", 1): [run([[1, 3]])],
            ("sd_bf16", 8): [run([[1, 4]])]}
    checks = summarise(runs, refs)["checks"]
    assert checks["sd@c1"]["same_as_ar"] and checks["sd_bf16@c1"]["same_as_ar"]
    assert checks["sd_bf16@c1"]["reference"] == "ar_bf16"
    assert not checks["sd_bf16@c8"]["same_as_ar"] and not checks["sd_bf16@c8"]["same_as_sequential"]
    from bench.batching import goals

    def level(tok_s):
        return {"tokens_per_s": tok_s, "p50_s": 1.0}

    summary = {"ar": {1: level(10), 8: level(40)}, "sd": {1: level(20), 8: level(60)},
               "ar_bf16": {8: level(50)}, "sd_bf16": {8: level(70)}}
    g = goals(summary, refs)
    assert g["sd_c8_over_ar_c8"]["value"] == 1.5 and g["sd_bf16_c8_over_ar_bf16_c8"]["value"] == 1.4
    assert not any(name.startswith("ar_bf16") for name in g)
    # a plain variant of ar's own numerics (one request a step, say) is a reference, no goal
    summary["ar_one"], refs["ar_one"] = {8: level(20)}, "ar"
    assert "ar_one_c8_over_ar_c8" in goals(summary, refs)
    assert "ar_one_c8_over_ar_c8" not in goals(summary, refs, plain=["ar_one"])


def test_each_repeat_runs_the_methods_one_further_along():
    from bench.batching import rotated

    methods = ["ar", "sd", "sd_engine"]
    orders = [rotated(methods, r) for r in range(4)]
    assert orders == [["ar", "sd", "sd_engine"], ["sd", "sd_engine", "ar"],
                      ["sd_engine", "ar", "sd"], ["ar", "sd", "sd_engine"]]
    assert [o[0] for o in orders[:3]] == methods  # each method leads one repeat
