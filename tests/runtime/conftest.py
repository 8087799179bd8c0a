"""Shared by the runtime's tests: the tiny float64 models compared with transformers (``hf``,
one per config), the cacheless reference, and a forward built from a resolved plan on the CPU."""

from __future__ import annotations

import hashlib

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from specdec.runtime import Forward, RuntimeConfig, load_forward, resolve_plan
from specdec.runtime.plan import DTYPES, x86_cpu

# for the tests that ask for the x86 backend by name (elsewhere auto is the torch backend)
X86 = pytest.mark.skipif(not x86_cpu(), reason="the x86 backend runs x86-64 CPUs")


def per_isa(unavailable) -> list:
    """One pytest param per ISA specdec's kernels are built for (``kernels.ISAS``), each skipped
    where ``unavailable(isa)`` gives the reason its build cannot run here."""
    from specdec.runtime.x86 import kernels

    return [pytest.param(isa, marks=pytest.mark.skipif(unavailable(isa) is not None,
                                                       reason=f"{isa}: {unavailable(isa)}"))
            for isa in kernels.ISAS]


def first_isa(unavailable) -> str | None:
    """The first ISA (``kernels.ISAS``'s order) whose build runs here, or None."""
    from specdec.runtime.x86 import kernels

    return next((isa for isa in kernels.ISAS if unavailable(isa) is None), None)


def both_builds(unavailable):
    """A mark that skips a test comparing the ISAs' builds where either cannot run here."""
    from specdec.runtime.x86 import kernels

    reasons = [f"{isa}: {unavailable(isa)}" for isa in kernels.ISAS if unavailable(isa)]
    return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons))
TOL = dict(rtol=0, atol=1e-9)
TAPS = (0, 2)
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              initializer_range=0.2)
CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON, tie_word_embeddings=True, rope_scaling={
        "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}),
    "mha": lambda: LlamaConfig(**(COMMON | {"num_key_value_heads": 4})),  # one query per kv head
    "qwen2": lambda: Qwen2Config(**COMMON, tie_word_embeddings=False),
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=False,
                                 rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def hf(request):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[request.param](), dtype=torch.float64).eval()
    if request.param == "qwen2":  # random biases, so a dropped bias cannot pass
        with torch.no_grad():
            for block in model.model.layers:
                for proj in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    return model


@pytest.fixture(scope="package", autouse=True)
def rows_probed_once():
    """The linear-rows probe (``invariant_rows``, as the backend calls it) is a function of the
    probed linears' tensors, the kernels and the thread count; these tests load the same bfloat16 models again and again,
    so each distinct one is probed once (the probe itself runs as the backend runs it)."""
    if not x86_cpu():
        yield
        return
    from specdec.runtime.x86 import backend, invariance

    probe, found = invariance.invariant_rows, {}

    def once(weights):  # the backend's call: the probe's defaults
        key = (torch.get_num_threads(), *map(fingerprint, invariance.probed(weights)))
        if key not in found:
            found[key] = probe(weights)
        return found[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend, "invariant_rows", once)
        yield


def fingerprint(linear) -> tuple:
    """A linear's kind and the bytes of every plain tensor it holds (its weight, bias, codes;
    a packed copy is made from them)."""
    tensors = sorted((k, v) for k, v in vars(linear).items()
                     if isinstance(v, torch.Tensor) and v.layout == torch.strided)
    digest = hashlib.sha256()
    for name, t in tensors:
        digest.update(f"{name}{t.dtype}{tuple(t.shape)}".encode())
        digest.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return type(linear).__name__, digest.hexdigest()


def dtype_name(model) -> str:
    dtype = next(model.parameters()).dtype
    return next(name for name, d in DTYPES.items() if d == dtype)


def plan_of(model, blocks: dict | None = None, **knobs):
    """The plan of ``model`` on the CPU, in its dtype unless ``dtype`` says otherwise, with
    ``knobs`` (``RuntimeConfig``'s);
    its KV slots hold the model's context unless ``max_model_len`` says otherwise."""
    knobs.setdefault("max_model_len", model.config.max_position_embeddings)
    knobs.setdefault("dtype", dtype_name(model))
    config = RuntimeConfig(device="cpu", **knobs)
    return resolve_plan(config, model.config, blocks is not None)


def forward_of(model, taps=(), blocks: dict | None = None, **knobs) -> Forward:
    """``model``'s forward as its plan (``plan_of``) says."""
    return load_forward(model, plan_of(model, blocks, **knobs), blocks, taps)


def reference(model, ids: list[int], taps=TAPS):
    """Cacheless HF forward: logits [n, V] and taps [n, len(taps) * H] for every position."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    tapped = torch.cat([out.hidden_states[layer + 1][0] for layer in taps], dim=-1)
    return out.logits[0], tapped


def seq(n, seed):
    return torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
