"""float16 KV caches against float32 ones under the served default's passes (SmolLM2-135M,
float32 with int8 rows, the attention kernel, 2 threads): whole passes of B requests x T new
tokens after 160 cached tokens and a 110-token prefill, the two arms interleaved, medians after
warm-ups, with the largest logit gap between them and whether their greedy tokens agree.

Writes result.json and result.md next to this file.

    PYTHONPATH=. python docs/benchmarks/kv-float16/passes.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bench.passes import cached_forward, sweep, sweep_table, timer
from specdec.engine.loading import load_target

HERE = Path(__file__).parent
PASSES = ((1, 1), (4, 1), (8, 1), (16, 1), (1, 4), (4, 4), (8, 4))
CONTEXT = 160


def main() -> None:
    torch.set_num_threads(2)
    weights = load_target("smollm2-135m", dtype="auto", kv_slots=1).runtime.w
    forwards = {"float16": cached_forward(weights, CONTEXT, torch.float16),
                "float32": cached_forward(weights, CONTEXT, torch.float32)}
    timed, last = timer(forwards)
    agree = []

    def gap() -> float:
        pairs = list(zip(last["float16"], last["float32"], strict=True))
        agree.append(all(torch.equal(a.logits.argmax(-1), b.logits.argmax(-1)) for a, b in pairs))
        return max(float((a.logits - b.logits).abs().max()) for a, b in pairs)

    result = sweep(timed, list(forwards), PASSES, (110,), CONTEXT, gap)
    result["greedy_tokens_agree"] = agree
    (HERE / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = sweep_table(result, "float16", "float32", CONTEXT)
    lines += ["", f"Greedy tokens the same on both caches in every pass: {all(agree)}"]
    (HERE / "result.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
