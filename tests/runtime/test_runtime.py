"""The runtime's forward against transformers' own, in float64: logits and taps within 1e-9.

Each tiny model is built from a config (Llama with llama3 RoPE scaling and a tied lm_head,
Llama without GQA, Qwen2 with q/k/v bias, Qwen3 with q/k RMSNorm and linear RoPE scaling) and
compared with a cacheless HF forward over the whole sequence: prefill, decode, k-token append,
crop-then-append, a ragged batch, a tree-masked append; plus the pool's limits and the
unsupported fallback, and batch invariance in bfloat16 (both attentions, and how the plan
chooses one).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from specdec.runtime import (
    Forward,
    KVPool,
    PlanError,
    PoolFull,
    Row,
    Weights,
    load_forward,
    unsupported,
)
from specdec.runtime.weights import inv_freq
from specdec.runtime.x86 import invariance
from specdec.runtime.x86.attention import FittedSdpa
from specdec.runtime.x86.invariance import INVARIANTS, Invariant, attention_invariant
from tests.runtime.conftest import (
    COMMON,
    CONFIGS,
    TAPS,
    TOL,
    X86,
    forward_of,
    plan_of,
    reference,
    seq,
)


def make(model, slots: int = 4):
    fwd = forward_of(model, TAPS, slots=slots)
    return fwd, fwd.pool


def append(fwd, slot, ids):
    every = range(len(ids))
    return fwd([Row(slot, ids, logits_at=every, taps_at=every)])[0]


def test_rope_frequencies_equal_transformers(hf):
    torch.testing.assert_close(inv_freq(hf.config, Weights.from_hf(hf).shape.head_dim),
                               hf.model.rotary_emb.inv_freq.float(), rtol=0, atol=0)


def test_prefill_decode_and_append_equal_transformers(hf):
    fwd, pool = make(hf)
    ids = seq(40, 1)
    slot = pool.acquire()
    prefill = fwd([Row(slot, ids[:20], logits_at=[19], taps_at=range(20))])[0]
    logits, taps = reference(hf, ids)
    torch.testing.assert_close(prefill.logits, logits[19:20], **TOL)
    torch.testing.assert_close(prefill.taps, taps[:20], **TOL)
    one = append(fwd, slot, ids[20:21])  # a 1-token decode
    torch.testing.assert_close(one.logits, logits[20:21], **TOL)
    torch.testing.assert_close(one.taps, taps[20:21], **TOL)
    k = append(fwd, slot, ids[21:40])  # a k-token append, past llama3's original context
    torch.testing.assert_close(k.logits, logits[21:40], **TOL)
    torch.testing.assert_close(k.taps, taps[21:40], **TOL)


def test_crop_then_append_equals_transformers(hf):
    fwd, pool = make(hf)
    ids, other = seq(30, 2), seq(8, 3)
    slot = pool.acquire()
    append(fwd, slot, ids[:25])
    pool.crop(slot, 12)
    out = append(fwd, slot, ids[12:15] + other)
    logits, taps = reference(hf, ids[:15] + other)
    torch.testing.assert_close(out.logits, logits[12:], **TOL)
    torch.testing.assert_close(out.taps, taps[12:], **TOL)


def test_ragged_batch_equals_each_request_alone(hf):
    fwd, pool = make(hf)
    prompts = [seq(5, 4), seq(17, 5), seq(9, 6)]
    news = [seq(1, 7), seq(6, 8), seq(3, 9)]
    slots = [pool.acquire() for _ in prompts]
    for slot, p in zip(slots, prompts, strict=True):
        fwd([Row(slot, p, logits_at=[len(p) - 1])])
    rows = [Row(s, n, logits_at=range(len(n)), taps_at=range(len(n)))
            for s, n in zip(slots, news, strict=True)]
    for row, out, p, n in zip(rows, fwd(rows), prompts, news, strict=True):
        logits, taps = reference(hf, p + n)
        torch.testing.assert_close(out.logits, logits[len(p):], **TOL)
        torch.testing.assert_close(out.taps, taps[len(p):], **TOL)
        assert pool.lengths[row.slot] == len(p) + len(n)


def test_mixed_batch_equals_each_request_alone(hf):
    """Decodes, 3-token verifies and a tree on scattered slots (a padded group per run of
    consecutive slots) with a long prompt (alone) in one pass: each row as alone; then decodes
    on consecutive slots (one group). Every group reads its caches as a view."""
    from specdec.runtime.batch import SHORT, plan_groups

    fwd, pool = make(hf, slots=6)
    slots = [pool.acquire() for _ in range(6)]
    prompts = {s: seq(4 + 3 * s, 20 + s) for s in slots}
    prompts[3] = []  # slot 3 gets its prompt in the mixed pass
    for slot in (0, 1, 2, 4, 5):
        fwd([Row(slot, prompts[slot], logits_at=[len(prompts[slot]) - 1])])
    tree = torch.ones(3, 3, dtype=torch.bool).tril()
    tree[2, 1] = False  # tokens 1 and 2 are siblings under 0
    news = {0: seq(1, 30), 1: seq(1, 31), 2: seq(3, 32), 4: seq(3, 33), 3: seq(SHORT + 8, 34),
            5: seq(3, 35)}
    rows = [Row(s, news[s], logits_at=range(len(news[s])), taps_at=range(len(news[s])),
                ancestors=tree if s == 5 else None) for s in (4, 0, 3, 2, 5, 1)]
    groups, _, _ = plan_groups(rows, [pool.lengths[r.slot] for r in rows], "cpu",
                               cost=fwd.attention.cost)
    assert [([rows[b].slot for b in g.rows], g.T, g.span) for g in groups] == [
        ([0, 1, 2], 3, (0, 3)), ([4, 5], 3, (4, 6)), ([3], SHORT + 8, (3, 4))]
    for row, out in zip(rows, fwd(rows), strict=True):
        s, n = row.slot, len(news[row.slot])
        seen = tree if s == 5 else torch.ones(n, n, dtype=torch.bool).tril()
        for j in range(n):  # each new token against its own path
            logits, taps = reference(hf, prompts[s] + [news[s][i] for i in range(n) if seen[j, i]])
            torch.testing.assert_close(out.logits[j], logits[-1], **TOL)
            torch.testing.assert_close(out.taps[j], taps[-1], **TOL)
        assert pool.lengths[s] == len(prompts[s]) + n
    pool.crop(5, len(prompts[5]) + 1)  # keep the tree's root only
    rows = [Row(s, [7], logits_at=[0]) for s in (1, 0)]
    groups, _, _ = plan_groups(rows, [pool.lengths[r.slot] for r in rows], "cpu",
                               cost=fwd.attention.cost)
    assert [g.span for g in groups] == [(0, 2)]
    for row, out in zip(rows, fwd(rows), strict=True):
        logits, _ = reference(hf, prompts[row.slot] + news[row.slot] + [7])
        torch.testing.assert_close(out.logits[0], logits[-1], **TOL)


def test_short_rows_split_where_padding_costs_more_than_another_group():
    """``split_short``: runs of consecutive slots only; one long draft among decodes attends
    apart (padding seven decodes to its 16 queries costs more than a second SDPA call), rows
    alike stay together; the linears still cut the short rows as one run (``Forward.parts``)."""
    from specdec.runtime.batch import Group, split_short

    attention_cost = FittedSdpa().cost

    def rows(ns, slots=None):
        return [Row(s, list(range(n)), [0]) for s, n in zip(slots or range(len(ns)), ns, strict=True)]

    alike = rows([2, 3, 2, 1, 3, 2, 2, 3])
    assert split_short(alike, [200] * 8, 64, 2048, attention_cost) == [list(range(8))]
    one_long = rows([2, 1, 16, 2, 1, 2, 1, 2])
    runs = split_short(one_long, [200] * 8, 64, 2048, attention_cost)
    assert [2] in runs and sum(runs, []) == list(range(8))
    assert (sum(attention_cost(len(r), max(len(one_long[i].ids) for i in r), 256) for r in runs)
            < attention_cost(8, 16, 256))
    assert split_short(rows([1, 1, 1], [0, 1, 5]), [10, 10, 10], None, None,
                       attention_cost) == [[0, 1], [2]]
    fwd = Forward.__new__(Forward)
    fwd.rows = 32

    def group(size, whole=False):
        return Group([0], 0, size, 1, 1, None, (0, 1), None, whole)

    assert fwd.parts([group(20), group(20), group(100, whole=True), group(3)]) == [32, 8, 100, 3]


def test_tree_masked_append_equals_each_branch_run_linearly(hf):
    fwd, pool = make(hf)
    prompt = seq(10, 10)
    #        0
    #      /   \
    #     1     4
    #    / \     \
    #   2   3     5
    parent = [-1, 0, 1, 1, 0, 4]
    tokens = seq(6, 11)
    n = len(parent)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parent[j]
    slot = pool.acquire()
    fwd([Row(slot, prompt, logits_at=[9])])
    out = fwd([Row(slot, tokens, logits_at=range(n), taps_at=range(n), ancestors=anc)])[0]
    for leaf in (2, 3, 5):
        branch = [j for j in range(n) if anc[leaf, j]]
        logits, taps = reference(hf, prompt + [tokens[j] for j in branch])
        torch.testing.assert_close(out.logits[branch], logits[len(prompt):], **TOL)
        torch.testing.assert_close(out.taps[branch], taps[len(prompt):], **TOL)
    # keep the accepted branch 0 -> 4 -> 5; the slot then equals that linear sequence
    pool.keep(slot, len(prompt), [0, 4, 5])
    probe = seq(2, 12)
    logits, _ = reference(hf, prompt + [tokens[0], tokens[4], tokens[5]] + probe)
    torch.testing.assert_close(append(fwd, slot, probe).logits, logits[-2:], **TOL)


def test_full_pool_raises_and_freed_slots_are_reused(hf):
    _, pool = make(hf, slots=2)
    a, b = pool.acquire(), pool.acquire()
    with pytest.raises(PoolFull, match="all 2 KV cache slots are in use"):
        pool.acquire()
    pool.release(a)
    assert pool.acquire() == a and b != a


def test_bad_rows_are_refused(hf):
    fwd, pool = make(hf)
    slot = pool.acquire()
    with pytest.raises(ValueError, match="at least one new token"):
        Row(slot, [], logits_at=[])
    with pytest.raises(ValueError, match="outside the row"):
        Row(slot, [1, 2], logits_at=[2])
    with pytest.raises(ValueError, match="earlier tokens"):
        Row(slot, [1, 2], logits_at=[0], ancestors=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="exceeds the KV slot"):
        fwd([Row(slot, [1] * 129, logits_at=[0])])


def test_unsupported_configs_say_why():
    from transformers import GPT2Config

    assert unsupported(CONFIGS["llama"]()) is None
    assert "gpt2" in unsupported(GPT2Config())
    assert "sliding" in unsupported(Qwen2Config(**COMMON, use_sliding_window=True))
    yarn = LlamaConfig(**COMMON, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    assert "yarn" in unsupported(yarn)


def float32(hf):
    """The reference model in float32."""
    model = AutoModelForCausalLM.from_config(hf.config, dtype=torch.float32).eval()
    model.load_state_dict({k: v.float() for k, v in hf.state_dict().items()})
    return model


def test_float32_single_row_copies_equal_the_reference(hf):
    """The float32 layout without the panel kernel (``linears: onednn``): x @ wt on [in, out]
    copies for one-row passes, against HF."""
    model = float32(hf)
    fwd = forward_of(model, TAPS, linears="onednn", kv_cache_dtype="model", slots=1)
    w = fwd.w
    assert all(p.kind == "onednn" for p in w.projections())
    assert w.lm_head.wt is not None and w.layers[0].qkv.wt.shape == w.layers[0].qkv.w.T.shape
    ids = seq(12, 13)
    slot = fwd.pool.acquire()
    prefill = fwd([Row(slot, ids[:11], logits_at=[10])])[0]  # one lm_head row: the copy
    decode = fwd([Row(slot, ids[11:], logits_at=[0], taps_at=[0])])[0]  # every layer: the copy
    logits, taps = reference(model, ids)
    torch.testing.assert_close(prefill.logits, logits[10:11], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(decode.logits, logits[11:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(decode.taps, taps[11:], rtol=1e-4, atol=1e-4)


def packable(hf, dtype: torch.dtype, why: str):
    """The reference model in ``dtype``; the test is skipped (``why``) where oneDNN cannot pack
    its weights."""
    from specdec.runtime.x86.linears import can_pack

    model = AutoModelForCausalLM.from_config(hf.config, dtype=dtype).eval()
    model.load_state_dict({k: v.to(dtype) for k, v in hf.state_dict().items()})
    if not can_pack(model.model.embed_tokens.weight):
        pytest.skip(why)
    return model


def test_float32_packed_multi_row_passes_equal_the_reference(hf):
    """The float32 multi-row fast path (``linears: onednn``: oneDNN linear on weights packed at
    load) against HF and against the plain [out, in] layout (``linears: torch``): a prefill, a
    ragged two-request verify, a 7-row append."""
    model = packable(hf, torch.float32, "this PyTorch build has no oneDNN")
    passes = {}
    for packed in (True, False):
        fwd = forward_of(model, TAPS, linears="onednn" if packed else "torch",
                         kv_cache_dtype="model", slots=2)
        w = fwd.w
        assert all(p.kind == ("onednn" if packed else "torch") for p in w.projections())
        assert ((getattr(w.layers[0].gate_up, "packed", None) is not None) == packed
                and (getattr(w.lm_head, "packed", None) is not None) == packed)
        a, b = fwd.pool.acquire(), fwd.pool.acquire()
        every = range(7)
        first = fwd([Row(a, seq(9, 1), logits_at=range(9), taps_at=range(9)),
                     Row(b, seq(4, 2), logits_at=range(4), taps_at=range(4))])
        second = fwd([Row(a, seq(7, 3), logits_at=every, taps_at=every)])
        passes[packed] = first + second
    logits, taps = reference(model, seq(9, 1) + seq(7, 3))
    torch.testing.assert_close(passes[True][2].logits, logits[9:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(passes[True][2].taps, taps[9:], rtol=1e-4, atol=1e-4)
    for fast, plain in zip(passes[True], passes[False], strict=True):
        torch.testing.assert_close(fast.logits, plain.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast.taps, plain.taps, rtol=1e-5, atol=1e-5)
        assert torch.equal(fast.logits.argmax(-1), plain.logits.argmax(-1))


def test_float32_passes_on_the_panel_kernel_equal_the_reference(hf):
    """Where the panel kernel runs (``specdec.runtime.x86.panels``), ``linears: panels`` keeps
    only its panels and runs every pass on them: a prefill, a ragged two-request verify with
    taps and a decode against HF and against the plain ``[out, in]`` layout (``linears:
    torch``; the kernel itself: tests/runtime/test_panels.py)."""
    from specdec.runtime.x86 import panels
    from specdec.runtime.x86.linears import PanelLinear

    if panels.unavailable():
        pytest.skip(panels.unavailable())
    model = float32(hf)
    passes = {}
    for on in (True, False):
        fwd = forward_of(model, TAPS, linears="panels" if on else "torch",
                         kv_cache_dtype="model", slots=2)
        w = fwd.w
        assert (getattr(w.layers[0].qkv, "panels", None) is not None) == on
        assert (getattr(w.lm_head, "panels", None) is not None) == on
        down = w.layers[0].down
        assert not on or (type(down) is PanelLinear and not hasattr(down, "wt")
                          and not hasattr(down, "packed"))
        a, b = fwd.pool.acquire(), fwd.pool.acquire()
        every = range(7)
        out = fwd([Row(a, seq(9, 1), logits_at=range(9), taps_at=range(9)),
                   Row(b, seq(4, 2), logits_at=range(4), taps_at=range(4))])
        out += fwd([Row(a, seq(7, 3), logits_at=every, taps_at=every)])
        out += fwd([Row(a, seq(1, 4), logits_at=[0], taps_at=[0])])
        passes[on] = out
    logits, taps = reference(model, seq(9, 1) + seq(7, 3) + seq(1, 4))
    torch.testing.assert_close(passes[True][2].logits, logits[9:16], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(passes[True][3].taps, taps[16:], rtol=1e-4, atol=1e-4)
    for fast, plain in zip(passes[True], passes[False], strict=True):
        torch.testing.assert_close(fast.logits, plain.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast.taps, plain.taps, rtol=1e-5, atol=1e-5)


@X86
def test_bfloat16_runs_on_packed_weights_as_on_the_plain_ones(hf):
    """bfloat16 on the x86 backend keeps only the oneDNN-packed copy (where oneDNN runs
    bfloat16 here) and runs every pass on it, one row or many: a prefill, a ragged verify and a
    decode give what the plain ``[out, in]`` layout gives (the torch backend's; bitwise on the
    AMX Xeon; close wherever the kernels round otherwise). Its batch invariance is the test
    below's."""
    model = packable(hf, torch.bfloat16, "oneDNN does not run bfloat16 here")
    passes = {}
    for packed in (True, False):
        fwd = forward_of(model, backend="x86" if packed else "torch", slots=2)
        w = fwd.w
        assert all(p.kind == ("onednn" if packed else "torch") for p in w.projections())
        assert (getattr(w.layers[0].qkv, "packed", None) is not None) == packed
        assert getattr(w.lm_head, "wt", None) is None
        a, b = fwd.pool.acquire(), fwd.pool.acquire()
        out = fwd([Row(a, seq(40, 1), logits_at=[39], chunk=True)])
        out += fwd([Row(b, seq(5, 2), logits_at=range(5))])
        out += fwd([Row(a, seq(3, 3), logits_at=range(3)), Row(b, seq(1, 4), logits_at=[0])])
        passes[packed] = out
    for fast, plain in zip(passes[True], passes[False], strict=True):
        torch.testing.assert_close(fast.logits, plain.logits, rtol=0.05, atol=0.05)


def invariant_by_hand(model, attention: str, slots: int = 4) -> Forward:
    """The x86 backend's batch-invariant layout forced on for ``model``'s passes (a plan gives
    it to bfloat16 only): linears in pieces (its probe), ``attention`` over whole key blocks."""
    from specdec.runtime.x86.backend import X86Backend

    plan = dataclasses.replace(plan_of(model), attention=attention, batch_invariant=True)
    backend = X86Backend(plan)
    backend.invariant_by_pieces = True
    weights = Weights.from_hf(model, backend, None, plan.max_model_len)
    backend.prepare(weights)
    s = weights.shape
    pool = KVPool(s.layers, slots, s.kv_heads, plan.max_model_len, s.head_dim, plan.torch_dtype)
    return Forward(weights, pool, backend, TAPS)


@X86
@pytest.mark.parametrize("attention", sorted(INVARIANTS))
def test_the_batch_invariant_layout_equals_transformers(hf, attention):
    """Either batch-invariant attention over whole key blocks (float64, forced on): a decode, a
    3-token verify, a tree and a long prompt chunk in one pass, each against its own HF
    reference."""
    fwd = invariant_by_hand(hf, attention)
    assert fwd.rows >= 1 and fwd.key_block and fwd.attention.kind == attention
    prompts = [seq(5, 40), seq(17, 41), seq(9, 42), []]
    slots = [fwd.pool.acquire() for _ in prompts]
    for slot, p in zip(slots[:3], prompts, strict=False):
        fwd([Row(slot, p, logits_at=[len(p) - 1])])
    tree = torch.ones(3, 3, dtype=torch.bool).tril()
    tree[2, 1] = False
    news = [seq(1, 43), seq(3, 44), seq(3, 45), seq(40, 46)]
    rows = [Row(slot, n, logits_at=range(len(n)), taps_at=range(len(n)),
                ancestors=tree if slot == slots[2] else None)
            for slot, n in zip(slots, news, strict=True)]
    for row, out, p, n in zip(rows, fwd(rows), prompts, news, strict=True):
        seen = row.ancestors
        if seen is None:
            seen = torch.ones(len(n), len(n), dtype=torch.bool).tril()
        for j in range(len(n)):
            logits, taps = reference(hf, p + [n[i] for i in range(len(n)) if seen[j, i]])
            torch.testing.assert_close(out.logits[j], logits[-1], **TOL)
            torch.testing.assert_close(out.taps[j], taps[-1], **TOL)


def bfloat16(hf):
    model = AutoModelForCausalLM.from_config(hf.config, dtype=torch.bfloat16).eval()
    model.load_state_dict({k: v.bfloat16() for k, v in hf.state_dict().items()})
    return model


@X86
@pytest.mark.parametrize("attention", ["auto", *sorted(INVARIANTS)])
def test_bfloat16_tokens_are_bitwise_the_same_alone_and_in_any_batch(hf, attention):
    """Batch invariance, the x86 backend's in bfloat16: each token's logits are exactly those of
    decoding it alone, whether it comes in a k-token verify (also one longer than SHORT), next
    to other requests and a prompt chunk, or after a prompt prefilled in two chunks (speculative
    decoding in bfloat16 then commits exactly plain decoding's tokens). Per-query attention is
    invariant by construction; grouped where its probe passes here (auto: what the plan
    picks)."""
    model = bfloat16(hf)
    c = model.config
    if attention == "grouped" and not attention_invariant(
            "grouped", c.num_attention_heads, c.num_key_value_heads,
            getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            torch.bfloat16):
        pytest.skip("grouped attention is not batch invariant on this machine's kernels")
    fwd = forward_of(model, backend="x86", attention=attention, slots=5)
    assert fwd.rows is not None  # by pieces, in bfloat16
    prompt, draft = seq(11, 50), seq(40, 51)
    a = fwd.pool.acquire()
    fwd([Row(a, prompt, logits_at=[10])])
    alone = [fwd([Row(a, [t], logits_at=[0])])[0].logits[0] for t in draft]

    def same(out, n):
        assert all(torch.equal(out.logits[i], alone[i]) for i in range(n))

    others = [fwd.pool.acquire() for _ in range(3)]
    for slot, n in zip(others, (3, 30, 7), strict=True):
        fwd([Row(slot, seq(n, 60 + n), logits_at=[n - 1])])
    for k in (2, 5, 9, 17, 20, 40):  # 40: past SHORT, a long row that is not a prompt chunk
        fwd.pool.crop(a, len(prompt))
        same(fwd([Row(a, draft[:k], logits_at=range(k))])[0], k)
        fwd.pool.crop(a, len(prompt))
        chunk = fwd.pool.acquire()
        batch = [Row(slot, seq(n, k + n), logits_at=[0])
                 for slot, n in zip(others, (1, 4, 2), strict=True)]
        out = fwd([*batch, Row(a, draft[:k], logits_at=range(k)),
                   Row(chunk, seq(40, k), logits_at=[39], chunk=True)])
        same(out[3], k)
        fwd.pool.release(chunk)
        for row in batch:
            fwd.pool.crop(row.slot, fwd.pool.lengths[row.slot] - len(row.ids))
    b = fwd.pool.acquire()
    fwd([Row(b, prompt[:4], logits_at=[3])])
    fwd([Row(b, prompt[4:], logits_at=[6])])
    same(fwd([Row(b, draft[:6], logits_at=range(6))])[0], 6)


@X86
def test_the_plan_attends_grouped_only_where_the_probe_passes(hf, monkeypatch):
    """bfloat16 on the x86 backend: ``attention: auto`` is grouped where its invariance probe
    passes, else per query; asked for, grouped runs unprobed; passes that are not batch
    invariant (the torch backend) cannot attend grouped, and an unknown kind is refused."""
    model = bfloat16(hf)
    s = Weights.from_hf(model).shape

    def plan(**knobs):
        return plan_of(model, **({"backend": "x86", "slots": 1} | knobs))

    passes = attention_invariant("grouped", s.heads, s.kv_heads, s.head_dim, torch.bfloat16)
    auto = plan()
    assert auto.attention == ("grouped" if passes else "per_query") and auto.batch_invariant
    assert load_forward(model, auto).attention.kind == auto.attention
    monkeypatch.setattr(invariance, "attention_invariant", lambda *args: False)
    assert plan().attention == "per_query"
    assert plan(attention="grouped").attention == "grouped"  # asked for: no probe
    with pytest.raises(PlanError, match="attention: grouped needs the x86 backend"):
        plan(backend="torch", attention="grouped")
    with pytest.raises(PlanError, match="attention must be one of"):
        plan(attention="blocked")


def test_the_attention_probe_finds_a_kernel_that_is_not_batch_invariant(monkeypatch):
    """A stand-in for a kernel that rounds a query otherwise in a bigger batch: its outputs move
    by one bfloat16 step when the batch holds more than one token. The probe must say so."""
    lay_out, attend = INVARIANTS["per_query"]

    def varies(queries, keys, values, mask, scale):
        out = attend(queries, keys, values, mask, scale)
        return out if queries.shape[0] * queries.shape[1] == 1 else out * (1 + 2 ** -7)

    monkeypatch.setitem(INVARIANTS, "per_query", Invariant(lay_out, varies))
    assert not attention_invariant("per_query", 4, 2, 16, torch.bfloat16)
    monkeypatch.setitem(INVARIANTS, "per_query", Invariant(lay_out, attend))
    assert attention_invariant("per_query", 4, 2, 16, torch.bfloat16)


@pytest.mark.parametrize("kind", sorted(INVARIANTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_the_additive_mask_attends_bitwise_as_the_boolean_one(kind, dtype):
    """``Invariant.mask`` lays a group's mask out once a step as 0 / -inf; SDPA must give every
    query bitwise what it gives with the boolean mask it would otherwise convert in each layer:
    ragged rows, padded queries and keys, at SmolLM2's head shapes (9 heads over 3)."""
    attention = INVARIANTS[kind]
    gen = torch.Generator().manual_seed(0)
    B, T, C, heads, kv_heads, d = 5, 6, 192, 9, 3, 64
    q = torch.randn(B, T, heads, d, generator=gen).to(dtype)
    k, v = (torch.randn(B, kv_heads, C, d, generator=gen).to(dtype) for _ in "kv")
    seen = torch.zeros(B, 1, T, C, dtype=torch.bool)
    seen[..., 0] = True
    for b, (cached, n) in enumerate([(0, 6), (17, 1), (100, 4), (150, 6), (63, 2)]):
        for t in range(n):
            seen[b, 0, t, :cached + t + 1] = True
    boolean = attention.lay_out(seen, kv_heads, heads // kv_heads)
    additive = attention.mask(seen, kv_heads, heads // kv_heads, dtype)
    assert additive.dtype == dtype and additive.shape == boolean.shape
    assert torch.equal(additive == 0, boolean) and bool(additive[~boolean].isneginf().all())
    with torch.inference_mode():
        assert torch.equal(attention.attend(q, k, v, additive, d ** -0.5),
                           attention.attend(q, k, v, boolean, d ** -0.5))


@X86
def test_batch_invariance_by_pieces_is_the_x86_plans_only_in_bfloat16(hf):
    """On the x86 backend's default knobs, bfloat16 passes are batch invariant by pieces and key
    blocks; float64 ones are not batch invariant; float32 ones are by their kernels (panel
    linears and the attention kernel, where they build), never by pieces."""
    for dtype, on in ((torch.float64, False), (torch.float32, False), (torch.bfloat16, True)):
        model = AutoModelForCausalLM.from_config(hf.config, dtype=dtype).eval()
        fwd = forward_of(model, backend="x86", slots=1)
        assert (fwd.rows is not None) == on and (fwd.key_block is not None) == on
        plan = plan_of(model, backend="x86", slots=1)
        kernels = plan.linears in ("panels", "quantized", "int8") and plan.attention == "kernel"
        assert plan.batch_invariant == (on or dtype == torch.float32 and kernels)


@X86
@pytest.mark.slow
def test_smollm2_bfloat16_verifies_of_any_length_are_bitwise_decoding():
    """The real target in bfloat16: a 40-token verify (past SHORT: a long row that is not a
    prompt chunk) and a 17-token one beside another request and a 60-token prompt chunk give
    each token exactly its logits from decoding it alone (on the AMX Xeon of 2026-12-02 a
    40-token verify computed as one piece differed at every position)."""
    from specdec.engine.loading import load_target

    target = load_target("smollm2-135m", dtype="bfloat16", kv_slots=3, backend="x86")
    fwd, pool = target.runtime, target.runtime.pool
    assert fwd.rows is not None
    prompt, draft = seq(50, 70), seq(40, 71)
    a, b, c = pool.acquire(), pool.acquire(), pool.acquire()
    fwd([Row(a, prompt, logits_at=[49], chunk=True)])
    fwd([Row(b, prompt[:20], logits_at=[19])])
    alone = [fwd([Row(a, [t], logits_at=[0])])[0].logits[0] for t in draft]
    pool.crop(a, len(prompt))
    out = fwd([Row(a, draft, logits_at=range(40))])[0]
    assert all(torch.equal(out.logits[i], alone[i]) for i in range(40))
    pool.crop(a, len(prompt))
    out = fwd([Row(b, draft[:3], logits_at=[0]), Row(a, draft[:17], logits_at=range(17)),
               Row(c, seq(60, 72), logits_at=[59], chunk=True)])[1]
    assert all(torch.equal(out.logits[i], alone[i]) for i in range(17))
