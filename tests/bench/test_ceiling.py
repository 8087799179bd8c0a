"""``bench.ceiling``'s pricing of the serving benchmark's closed loop from pass costs."""

from __future__ import annotations

import pytest

from bench.ceiling import aggregate_time, ceilings, latency


def test_one_client_pays_each_prefill_and_every_other_token_in_its_own_pass():
    # 2 prompts of 10 and 20 tokens, 5 tokens each: prefills 30 + 50, 2 x 4 decodes of 7
    assert aggregate_time([10, 20], 5, 1, 7.0, {10: 30.0, 20: 50.0}) == pytest.approx(80 + 56)


def test_clients_share_decode_steps_and_each_prefill_carries_the_others_decodes():
    # 4 prompts x 9 tokens at 2 clients: 4 joined steps carry one decode each, the other
    # 4 x 8 - 4 = 28 decodes run in 14 steps of 2
    joined = {10: 40.0}
    assert aggregate_time([10] * 4, 9, 2, 12.0, joined) == pytest.approx(4 * 40 + 14 * 12)


def test_latency_adds_one_joined_step_of_each_other_client():
    assert latency(10, 5, 1, 7.0, 30.0) == pytest.approx(30 + 4 * 7)
    assert latency(10, 5, 3, 9.0, 40.0) == pytest.approx(40 + 4 * 9 + 2 * (40 - 9))


def test_when_rows_cost_nothing_c_clients_make_c_times_the_tokens_as_fast():
    decode = {1: 10.0, 8: 10.0}  # every pass costs the same, whatever its rows
    joined = {1: {5: 10.0}, 8: {5: 10.0}}
    out = ceilings([5] * 16, 9, [1, 8], decode, joined)
    assert out["goals"]["ar_c8_over_c1"]["value"] == pytest.approx(8.0)
    assert out["goals"]["ar_p50_c8_over_c1"]["value"] == pytest.approx(1.0)  # nor wait longer
    assert out["goals"]["ar_c8_over_c1"]["met"] and out["goals"]["ar_p50_c8_over_c1"]["met"]
    assert set(out["goals"]) == {"ar_c8_over_c1", "ar_p50_c8_over_c1"}  # no SD priced here
