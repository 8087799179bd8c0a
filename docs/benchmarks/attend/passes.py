"""specdec's float32 kernels of 2026-12-04 against the code before them (SmolLM2-135M, 2
threads, interleaved pass by pass, medians after warm-ups):

- one layer's attention of B rows x T new tokens at 160 cached tokens: the kernel
  (``runtime.attend``) against SDPA over the padded group with its mask, as the forward ran it;
- whole passes of B requests x T new tokens after 160 cached tokens, and prompt prefills, in
  four arms, each adding one thing: ``before`` (the panel linear of 67c022b, built from git,
  ``attention: sdpa``, torch's element-wise ops), ``prefetch`` (today's panel linear),
  ``kernel`` (and the attention kernel) and ``fused`` (and the fused ops, ``runtime.fused``:
  today's default), with the largest logit gap between ``fused`` and ``before``.

Writes result.json and result.md next to this file.

    PYTHONPATH=. python docs/benchmarks/attend/passes.py
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load

from bench.passes import cached_forward, interleaved, sweep
from specdec.engine.loading import load_target
from specdec.runtime import attend, kernels, panels

HERE = Path(__file__).parent
BEFORE = "67c022b"  # the commit before the prefetch and the kernel
LAYER = ((1, 1), (8, 1), (8, 4), (16, 1), (8, 16))
PASSES = ((1, 1), (1, 4), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (16, 1), (16, 4))
PROMPTS = (32, 100, 256)
CONTEXT = 160


def old_panels():
    """The panel linear as it was at ``BEFORE``, compiled under another name."""
    source = Path("/tmp/specdec_panels_before.cpp")
    source.write_text(subprocess.run(["git", "show", f"{BEFORE}:specdec/runtime/panels.cpp"],
                                     check=True, capture_output=True, text=True).stdout)
    return load("specdec_panels_before", [str(source)], extra_cflags=kernels.FLAGS,
                extra_ldflags=["-fopenmp"])


def layer_us(B: int, T: int, heads: int, kv_heads: int, d: int) -> dict[str, float]:
    """One layer's attention: the kernel against SDPA on the padded group with its mask."""
    k, v = (torch.randn(17, kv_heads, 2048, d) for _ in "kv")
    q = torch.randn(B * T, heads, d)
    rows = torch.tensor([[b * T, T, b, CONTEXT] for b in range(B)])
    causal = torch.empty(0, dtype=torch.uint8)
    mask = torch.zeros(B, 1, T, CONTEXT + T, dtype=torch.bool)
    for t in range(T):
        mask[:, :, t, :CONTEXT + t + 1] = True
    padded = q.view(B, T, heads, d).transpose(1, 2)
    keys, values = k[:B, :, :CONTEXT + T], v[:B, :, :CONTEXT + T]

    def kernel():
        t0 = time.perf_counter()
        attend.attend(q, k, v, rows, causal, d ** -0.5)
        return (time.perf_counter() - t0) * 1e6

    def sdpa():
        t0 = time.perf_counter()
        F.scaled_dot_product_attention(padded, keys, values, attn_mask=mask, scale=d ** -0.5,
                                       enable_gqa=True)
        return (time.perf_counter() - t0) * 1e6

    return interleaved({"kernel": kernel, "sdpa": sdpa}, 200, 20)


def main() -> None:
    torch.set_num_threads(2)
    builds = {"before": old_panels(), "now": panels._build()}
    target = load_target("smollm2-135m", dtype="float32", kv_slots=1, linears="panels")
    w = target.runtime.w
    s = w.shape
    assert w.lm_head.panels is not None and attend.unavailable() is None, "no kernels here"
    result = {"layer_us": []}
    for B, T in LAYER:
        with torch.inference_mode():
            result["layer_us"].append({"B": B, "T": T, **layer_us(B, T, s.heads, s.kv_heads,
                                                                  s.head_dim)})
        print(result["layer_us"][-1], flush=True)
    forwards = {kind: cached_forward(w, CONTEXT, attention=kind) for kind in ("kernel", "sdpa")}
    arms = {"before": ("before", "sdpa", False), "prefetch": ("now", "sdpa", False),
            "kernel": ("now", "kernel", False), "fused": ("now", "kernel", True)}
    last = {}

    def timed(arm, rows, crop):
        build, kind, on = arms[arm]
        panels._build = lambda: builds[build]  # the linears' extension for this arm
        fwd = forwards[kind]
        fwd.fused = fwd.fused_rope = on
        t0 = time.perf_counter()
        last[arm] = torch.cat([o.logits for o in fwd(rows)])
        dt = (time.perf_counter() - t0) * 1e3
        for r in rows:
            fwd.pool.crop(r.slot, crop)
        return dt

    def gap():
        return float((last["fused"] - last["before"]).abs().max())

    result |= sweep(timed, list(arms), PASSES, PROMPTS, CONTEXT, gap)
    panels._build = lambda: builds["now"]
    (HERE / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"One layer's attention (µs, {CONTEXT} cached tokens):", "",
             "| B x T | kernel | SDPA (padded group, mask) | kernel / SDPA |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['B']} x {r['T']} | {r['kernel']:.1f} | {r['sdpa']:.1f} | "
              f"{r['kernel'] / r['sdpa']:.2f} |" for r in result["layer_us"]]
    lines += ["", f"Whole passes (ms, {CONTEXT} cached tokens) and prefills:", "",
              "| pass | " + " | ".join(arms) + " | fused / before | max logit gap |",
              "|" + " --- |" * (len(arms) + 3)]
    for r in result["passes_ms"] + result["prefill_ms"]:
        name = f"{r['B']} x {r['T']}" if "B" in r else f"prefill {r['tokens']}"
        lines.append(f"| {name} | " + " | ".join(f"{r[a]:.1f}" for a in arms) +
                     f" | {r['fused'] / r['before']:.2f} | {r['max_logit_gap']:.1e} |")
    (HERE / "result.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
