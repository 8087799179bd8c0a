"""Load-aware speculation by goodput (``actors.goodput``): the step cost, the prices and the cut."""

from __future__ import annotations

import pytest

from actors.goodput import Goodput, StepCost, fit_drafts
from actors.scheduler import head
from specdec.engine.loading import load_target
from specdec.engine.workers import Draft

LINEAR = StepCost((1, 64), (0.010, 0.010 + 63 * 0.001))  # 10 ms a step, 1 ms a token more
PIECES = StepCost((1, 32, 33, 512), (0.020, 0.020, 0.035, 0.035))  # flat, then a second piece


def test_the_step_cost_interpolates_and_extends_its_last_slope():
    cost = StepCost((1, 4, 8), (1.0, 2.5, 3.0))
    assert cost(1) == 1.0 and cost(4) == 2.5 and cost(2) == pytest.approx(1.5)
    assert cost(16) == pytest.approx(4.0)  # 0.125 s a token past 8
    assert cost(0) == 1.0  # never below one token's
    with pytest.raises(ValueError):
        StepCost((4, 1), (1.0, 2.0))


@pytest.mark.parametrize("values, fixed, cost, rate, keep", [
    # rows free up to the piece: every token that fits is kept, the best first
    ([[0.9, 0.5, 0.2], [0.8, 0.1]], 2, PIECES, 100.0, [3, 2]),
    ([[0.9, 0.5, 0.2], [0.8, 0.1]], 29, PIECES, 100.0, [2, 1]),  # 3 rows left: 0.9, 0.8, 0.5
    ([[1.0] * 40], 1, PIECES, 1000.0, [31]),  # a second piece costs 15 tokens' worth, for 9
    ([[1.0] * 40], 1, PIECES, 100.0, [40]),  # at a tenth of the price it pays
    # 1 ms a row at 200 tokens/s: a token must be worth 0.2 tokens
    ([[0.9, 0.3, 0.15], [0.25, 0.19]], 2, LINEAR, 200.0, [2, 1]),
    ([[0.9, 0.3, 0.15], [0.25, 0.19]], 2, LINEAR, 1000.0, [0, 0]),  # nothing is worth a ms
    ([], 4, LINEAR, 200.0, []),
])
def test_fit_drafts_keeps_the_tokens_worth_their_rows(values, fixed, cost, rate, keep):
    assert fit_drafts(values, fixed, cost, rate) == keep


def test_a_run_of_cheap_tokens_pays_for_a_dear_first_one():
    """A step that jumps at its first draft row, then is flat: the first token alone does not
    pay, three do; every count is tried, not only while each token pays on its own."""
    cost = StepCost((1, 2, 64), (0.010, 0.020, 0.020))
    assert fit_drafts([[0.5, 0.5, 0.5]], 1, cost, 100.0) == [3]  # 1.5 tokens for 1 token's time
    assert fit_drafts([[0.5]], 1, cost, 100.0) == [0]


def test_the_goodput_prices_by_calibrated_confidence_and_by_depth():
    g = Goodput(LINEAR)
    assert g.rate == pytest.approx(100.0)  # the prior: one token a one-token step
    assert g.values(3, None) == [0.5, 0.25, 0.125]  # the prior by depth
    for _ in range(100):
        g.step(10, 0.05)
    assert g.rate == pytest.approx(200.0, rel=0.02)  # the prior fades to a few per cent
    # confident drafts accepted at 1 of 2.4 expected: confidence is worth about 0.42
    for _ in range(60):
        g.round((1.0, 0.8, 0.6), 3, 1)
        g.step(2, 0.05)
    assert 0.40 < g.calibration < 0.46
    assert g.values(2, (0.9, 0.95)) == pytest.approx([0.9 * g.calibration] * 2)  # non-increasing
    # drafts without confidence: each depth's own rate, with the prior's weight
    for _ in range(60):
        g.round(None, 3, 1)
        g.step(2, 0.05)
    first, second, third, fourth = g.values(4, None)
    assert first > 0.9 and second < 0.05 and fourth == third < second
    for _ in range(300):  # nothing drafted: the observations fade, the prior returns
        g.step(1, 0.05)
    assert g.calibration == pytest.approx(1.0, abs=0.01)
    assert g.values(2, None) == pytest.approx([0.5, 0.25], abs=0.01)


def test_survival_by_the_acceptance_model_prices_a_draft_as_it_is():
    """Where a draft comes with the acceptance model's survival it is priced by it, not by the
    drafter's confidence (calibrated) nor by depth, and it teaches the calibration nothing."""
    g = Goodput(LINEAR)
    for _ in range(60):
        g.round((1.0, 0.8, 0.6), 3, 1)
        g.step(2, 0.05)
    calibration = g.calibration
    assert g.values(3, (0.9, 0.9, 0.9), (0.8, 0.6, 0.7)) == [0.8, 0.6, 0.6]
    assert g.values(2, None, (0.5, 0.25)) == [0.5, 0.25]
    g.round((0.9, 0.9), 2, 0, survival=(0.5, 0.25))
    assert g.calibration == calibration
    cut = head(Draft([5, 6, 7], None, confidence=(0.9, 0.8, 0.7), survival=(0.6, 0.3, 0.1)), 2)
    assert (cut.tokens, cut.confidence, cut.survival) == ([5, 6], (0.9, 0.8), (0.6, 0.3))


def test_the_rate_leaves_out_what_the_steps_prompt_chunks_cost():
    """A step of 8 decodes and a 100-token prompt chunk: the chunk's tokens cost 0.1 s on the
    step cost, so the 8 tokens count against the rest of the step's 0.15 s."""
    cost = StepCost((1, 201), (0.01, 0.21))  # 1 ms a token past the first
    alone, shared = Goodput(cost), Goodput(cost)
    for _ in range(200):
        alone.step(8, 0.05, fed=8)
        shared.step(8, 0.15, fed=8, prefilled=100)
    assert shared.rate == pytest.approx(alone.rate, rel=0.01)
    assert alone.rate == pytest.approx(160, rel=0.02)
    spent = Goodput(cost)
    for _ in range(200):  # a chunk dearer than its step: the step counts no seconds
        spent.step(8, 0.01, fed=8, prefilled=100)
    assert spent.seconds == 0.0 and spent.rate > 1000


def test_a_second_is_priced_at_least_at_plain_decodings_tokens():
    """Slow steps of long drafts read a low rate; the price stays at what 8 plain decodes would
    make (8 tokens in 10 ms), and rises with the rate above it."""
    cost = StepCost((1, 8, 64), (0.005, 0.010, 0.066))
    g = Goodput(cost)
    for _ in range(200):
        g.step(16, 0.05, fed=40)  # 320 tokens a second
    assert g.rate == pytest.approx(320, rel=0.02)
    assert g.price(8) == pytest.approx(800)
    assert g.price(1) == pytest.approx(g.rate)  # one decode makes 200 a second: the rate wins
    assert g.price(0) == g.rate
    cut = fit_drafts([[0.4] * 4] * 8, 8, cost, g.price(8))
    kept = fit_drafts([[0.4] * 4] * 8, 8, cost, g.rate)
    assert sum(cut) == 0 < sum(kept)  # a 1 ms row is worth 0.8 tokens, a draft token 0.4


def test_the_step_cost_is_measured_on_the_runtime_and_gives_its_slot_back(tiny_llama):
    target = load_target(tiny_llama["target"], dtype="float64", kv_slots=2)
    pool = target.runtime.pool
    free = list(pool.free)
    cost = StepCost.measure(target.runtime, sizes=(1, 4, 16), repeats=1, extra=(5,))
    assert cost.sizes == (1, 4, 5, 16)
    assert all(t > 0 for t in cost.seconds) and list(cost.seconds) == sorted(cost.seconds)
    assert sorted(pool.free) == sorted(free) and all(n == 0 for n in pool.lengths)
