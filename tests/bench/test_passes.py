"""The probes' pass sweep (bench/passes.py): two arms of weights timed pass by pass, with the
logit gap between them, and its markdown table."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from bench.passes import sweep_table, weights_sweep
from specdec.runtime import Weights


def test_a_sweep_of_two_weights_times_every_pass_and_measures_their_gap(tiny_llama):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama["target"], dtype=torch.float32)
    same = Weights.from_hf(model, panels=False)
    result = weights_sweep({"a": same, "b": same}, ((1, 1), (2, 3)), (8,), 16)
    rows = result["passes_ms"] + result["prefill_ms"]
    assert [(r.get("B"), r.get("T"), r.get("tokens")) for r in rows] == [
        (1, 1, None), (2, 3, None), (None, None, 8)]
    assert all(r["a"] > 0 and r["b"] > 0 and r["max_logit_gap"] == 0 for r in rows)
    table = sweep_table(result, "a", "b", 16)
    assert table[2] == "| pass | a | b | a / b | max logit gap |"
    assert [line.split(" | ")[0] for line in table[4:]] == ["| 1 x 1", "| 2 x 3", "| prefill 8"]
