"""The passes harness (bench/passes.py) on the tiny pair: arms loaded through ``load_target``,
every pass and prefill timed in each arm in turn, the logit gap between them, the table; the
ceiling's pricing of the served closed loop from pass costs; plain decoding beside a busy
process."""

from __future__ import annotations

import json

import pytest
import torch

from bench.passes import Passes, aggregate_time, ceilings, latency, main, sweep, table
from specdec.engine.loading import load_target


def test_two_arms_of_the_same_target_time_every_pass_with_no_logit_gap(tiny_llama):
    arms = {name: Passes(load_target(tiny_llama["target"], kv_slots=3), 2, 16)
            for name in ("a", "b")}
    result = sweep(arms, ((1, 1), (2, 3)), (8,), repeats=2, warm=1)
    rows = result["passes_ms"] + result["prefill_ms"]
    assert [(r.get("B"), r.get("T"), r.get("tokens")) for r in rows] == [
        (1, 1, None), (2, 3, None), (None, None, 8)]
    assert all(r["a"] > 0 and r["b"] > 0 and r["max_logit_gap"] == 0 for r in rows)
    assert [s.length for s in arms["a"].states] == [16, 16]  # every pass cropped back
    lines = table(result, ["a", "b"], 16)
    assert lines[2] == "| pass | a | b | b / a | max logit gap |"
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| 1 x 1", "| 2 x 3", "| prefill 8"]


def test_a_pass_feeds_each_running_request_its_tokens_beside_a_prompt(tiny_llama):
    passes = Passes(load_target(tiny_llama["target"], kv_slots=4), 3, 5)
    passes.time([1, 0, 2], prompt=4)
    assert [out.logits.shape[0] for out in passes.last] == [1, 1, 2]  # the prefill's last only
    assert [s.length for s in passes.states] == [5, 5, 5]


# ---- the ceiling: the served closed loop priced from pass costs ------------------------------
def test_one_client_pays_each_prefill_and_every_other_token_in_its_own_pass():
    # 2 prompts of 10 and 20 tokens, 5 tokens each: prefills 30 + 50, 2 x 4 decodes of 7
    assert aggregate_time([10, 20], 5, 1, 7.0, {10: 30.0, 20: 50.0}) == pytest.approx(80 + 56)
    # 4 prompts x 9 tokens at 2 clients: 4 joined steps carry one decode each, the other
    # 4 x 8 - 4 = 28 decodes run in 14 steps of 2
    assert aggregate_time([10] * 4, 9, 2, 12.0, {10: 40.0}) == pytest.approx(4 * 40 + 14 * 12)


def test_latency_adds_one_joined_step_of_each_other_client():
    assert latency(10, 5, 1, 7.0, 30.0) == pytest.approx(30 + 4 * 7)
    assert latency(10, 5, 3, 9.0, 40.0) == pytest.approx(40 + 4 * 9 + 2 * (40 - 9))


def test_when_rows_cost_nothing_c_clients_make_c_times_the_tokens_as_fast():
    decode = {1: 10.0, 8: 10.0}  # every pass costs the same, whatever its rows
    out = ceilings([5] * 16, 9, decode, {1: {5: 10.0}, 8: {5: 10.0}})
    assert out["goals"]["ar_c8_over_c1"]["value"] == pytest.approx(8.0)
    assert out["goals"]["ar_p50_c8_over_c1"]["value"] == pytest.approx(1.0)  # nor wait longer
    assert out["goals"]["ar_c8_over_c1"]["met"] and out["goals"]["ar_p50_c8_over_c1"]["met"]
    assert set(out["goals"]) == {"ar_c8_over_c1", "ar_p50_c8_over_c1"}  # no SD priced here


def test_the_ceiling_prices_the_first_humaneval_prompt_on_the_tiny_target(tiny_llama, tmp_path):
    main(["--ceiling", "1", "--target", tiny_llama["target"], "--concurrency", "1", "2",
          "--repeats", "1", "--max-tokens", "4", "--context", "4", "--threads", "1",
          "--out", str(tmp_path)])
    result = json.loads((tmp_path / "ceiling.json").read_text())
    assert set(result["levels"]) == {"1", "2"} and len(result["prompt_tokens"]) == 1
    assert all(r["tokens_per_s"] > 0 and r["decode_ms"] > 0 for r in result["levels"].values())
    assert "| 2 |" in (tmp_path / "ceiling.md").read_text()


def test_the_neighbour_mode_decodes_every_arm_alone_and_beside_a_busy_process(tiny_llama,
                                                                              tmp_path):
    before = torch.get_num_threads()
    try:
        main(["--neighbour", "--target", tiny_llama["target"], "--tokens", "3", "--repeats", "1",
              "--context", "4", "--threads", "2", "--arm", "two={}", "--arm", 'one={"threads": 1}',
              "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(before)
    result = json.loads((tmp_path / "neighbour.json").read_text())
    assert [(r["arm"], r["threads"]) for r in result["rows"]] == [("two", 2), ("one", 1)]
    assert all(r["alone_tok_s"] > 0 and r["beside_tok_s"] > 0 for r in result["rows"])
    assert "| one | 1 | - |" in (tmp_path / "neighbour.md").read_text()
