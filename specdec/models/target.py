"""The target model: an HF causal LM behind a small, explicit KV-cache API.

Two ways to run behind one interface (``backend``). Llama-family configs
(``specdec.runtime.unsupported`` says which) run on specdec's own runtime as its resolved
``plan`` says (``specdec.runtime.plan``: device, kernels, numerics, memory; logged at load):
the weights are taken from the loaded transformers model, each request holds a slot of a
preallocated KV pool (``pool_size`` slots of ``max_model_len`` positions; a full pool raises
``PoolFull``), and ``forward_batch`` runs many requests in one ragged pass. Every other
architecture runs on transformers' forward with a ``DynamicCache`` per request (a batch is then
a loop).

Per-request state lives in a ``TargetState`` that the caller owns (the engine, or a serving
actor keyed by request id); ``TargetModel`` itself is stateless between calls, so one model
serves many interleaved requests. The adapter can return the outputs of chosen layers ("taps"),
the context features a DFlash-style block drafter reads.

It knows nothing about drafting or verification.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache

from specdec.models import gguf_blocks
from specdec.models.kv import cached_forward, crop_cache, new_cache
from specdec.models.sources import parse_dtype, resolve
from specdec.runtime import (
    Forward,
    Plan,
    Row,
    RuntimeConfig,
    load_forward,
    resolve_plan,
    unsupported,
)
from specdec.runtime.plan import DTYPES, parse_device

log = logging.getLogger(__name__)
BACKENDS = ("auto", "runtime", "transformers")


@dataclass
class TargetState:
    """One request's KV cache. ``length`` tokens are cached (positions 0..length-1): an HF
    ``cache`` (transformers backend) or a KV pool ``slot`` (runtime backend), given back to the
    pool by ``TargetModel.release`` or, failing that, when the state is garbage collected."""

    cache: DynamicCache | None = None
    length: int = 0
    slot: int | None = None
    release: weakref.finalize | None = None


@dataclass(frozen=True)
class TargetOutput:
    logits: torch.Tensor  # [k, V] raw logits; row i predicts the token after input i
    # (only the last row, [1, V], from a forward with last_logits_only: a prefill)
    taps: torch.Tensor | None  # [k, n_taps * H] outputs of the tapped layers, concatenated


def evenly_spaced_taps(num_layers: int, n: int) -> tuple[int, ...]:
    """n layer indices evenly spaced between layer 1 and L-3 (DFlash's choice); 30 layers, 3 -> 1, 14, 27."""
    if n < 1:
        raise ValueError("need at least one tapped layer")
    lo, hi = 1, max(1, num_layers - 3)
    if n == 1:
        return (hi,)
    return tuple(round(lo + i * (hi - lo) / (n - 1)) for i in range(n))


class TargetModel:
    """Prefill, extend by k tokens, crop; logits and hidden-state taps of every new position."""

    def __init__(self, model, tokenizer, tap_layers: tuple[int, ...] = (), backend: str = "auto",
                 pool_size: int = 8, attention: str = "auto", linears: str = "auto",
                 blocks: dict[str, gguf_blocks.Blocks] | None = None,
                 kv_cache_dtype: str = "auto", max_model_len: int | None = None,
                 runtime_backend: str = "auto", plan: Plan | None = None, isa: str = "auto",
                 threads_by_load: str = "auto"):
        """On the runtime: ``plan`` (resolved from the model's device and dtype and the other
        knobs when not given: ``specdec.runtime.RuntimeConfig``'s fields); ``blocks``: the GGUF
        blocks of the model's linears (``gguf_blocks.load``), which the plan may run."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        config = model.config
        self.num_layers = config.num_hidden_layers
        self.hidden_size = config.hidden_size
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = getattr(config, "max_position_embeddings", None) or 2048
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        bad = [layer for layer in tap_layers if not 0 <= layer < self.num_layers]
        if bad:
            raise ValueError(f"tap layers {bad} outside 0..{self.num_layers - 1}")
        self.tap_layers = tuple(tap_layers)
        self.backend = pick_backend(config, backend)
        self.runtime: Forward | None = None
        self.plan: Plan | None = None
        if self.backend == "runtime":
            self.plan = plan or resolve_plan(RuntimeConfig(
                str(self.device), dtype_name(self.dtype), runtime_backend, linears, attention,
                kv_cache_dtype, max_model_len, pool_size, torch.get_num_threads(), isa=isa,
                threads_by_load=threads_by_load),
                config, blocks is not None)
            self.runtime = load_forward(model, self.plan, blocks, self.tap_layers)
            self.max_length = self.plan.max_model_len
            log.info("%s", self.plan.describe())

    @classmethod
    def from_pretrained(cls, ref: str, dtype="float32", tap_layers: tuple[int, ...] = (),
                        device="cpu", backend: str = "auto", pool_size: int = 8,
                        attention: str = "auto", linears: str = "auto",
                        kv_cache_dtype: str = "auto", max_model_len: int | None = None,
                        runtime_backend: str = "auto", omp_wait_policy: str = "auto",
                        isa: str = "auto", threads_by_load: str = "auto"):
        """The model ``ref`` (``sources.resolve``): on the runtime its plan is resolved first,
        from its config alone, and decides the dtype, the device and which weights load."""
        path = resolve(ref)
        plan = load_plan(path, AutoConfig.from_pretrained(path), dtype, device, backend,
                         runtime_backend=runtime_backend, linears=linears, attention=attention,
                         kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len,
                         slots=pool_size, omp_wait_policy=omp_wait_policy, isa=isa,
                         threads_by_load=threads_by_load)
        torch_dtype = load_dtype(plan, dtype)
        where = torch.device(plan.device) if plan else parse_device(device)
        codes = plan is not None and plan.linears in ("int8", "quantized")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype,
                                                     use_safetensors=True).to(where)
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(model, tokenizer, tap_layers, backend=backend,
                   blocks=gguf_blocks.load(path) if codes else None, plan=plan)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        ids = self.model.generation_config.eos_token_id
        if ids is None:
            ids = self.tokenizer.eos_token_id
        if ids is None:
            return frozenset()
        return frozenset([ids] if isinstance(ids, int) else ids)

    def new_state(self) -> TargetState:
        """A fresh request; on the runtime it takes a KV slot (``PoolFull`` when none is free)."""
        if self.runtime is None:
            return TargetState(cache=new_cache(self.model.config))
        pool = self.runtime.pool
        state = TargetState(slot=pool.acquire())
        state.release = weakref.finalize(state, pool.release, state.slot)
        return state

    def release(self, state: TargetState) -> None:
        """Give the request's KV slot back now (a no-op on transformers, or when done before)."""
        if state.release is not None:
            state.release()

    @torch.inference_mode()
    def forward(self, state: TargetState, ids: list[int], taps: bool = False,
                last_logits_only: bool = False) -> TargetOutput:
        """Append ``ids`` to the request's cache; return logits (and taps) for the new positions.
        ``last_logits_only`` skips the lm_head for all but the last position (a prefill, whose
        logits nobody reads: for a 150-token prompt that is 4 GFLOP saved)."""
        return self.forward_batch([state], [ids], taps, last_logits_only)[0]

    @torch.inference_mode()
    def forward_batch(self, states: Sequence[TargetState], ids: Sequence[list[int]],
                      taps: bool = False,
                      last_logits_only: bool | Sequence[bool] = False) -> list[TargetOutput]:
        """``forward`` for many requests at once: one ragged pass on the runtime.
        ``last_logits_only`` may be given per request (a batch mixing prefills and verifies)."""
        last = ([last_logits_only] * len(states) if isinstance(last_logits_only, bool)
                else list(last_logits_only))
        for state, new in zip(states, ids, strict=True):
            self.check(state, new)
        if self.runtime is None:
            return [self._hf_forward(s, new, taps, only)
                    for s, new, only in zip(states, ids, last, strict=True)]
        want_taps = taps and bool(self.tap_layers)
        rows = [Row(s.slot, new, logits_at=[len(new) - 1] if only else range(len(new)),
                    taps_at=range(len(new)) if want_taps else (), chunk=only)  # a prefill
                for s, new, only in zip(states, ids, last, strict=True)]
        outs = self.runtime(rows)
        for state, new in zip(states, ids, strict=True):
            state.length += len(new)
        return [TargetOutput(o.logits, o.taps) for o in outs]

    def check(self, state: TargetState, ids: list[int]) -> None:
        """Raise ``ValueError`` unless ``ids`` may be appended to the request's cache."""
        if not ids:
            raise ValueError("forward needs at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary of {self.vocab_size}")
        if state.length + len(ids) > self.max_length:
            raise ValueError(f"sequence of {state.length + len(ids)} tokens exceeds the "
                             f"context of {self.max_length} (max_model_len)")

    def _hf_forward(self, state: TargetState, ids: list[int], taps: bool,
                    last_logits_only: bool) -> TargetOutput:
        out = cached_forward(self.model, ids, state.cache, hidden=taps and bool(self.tap_layers),
                             **({"logits_to_keep": 1} if last_logits_only else {}))
        state.length += len(ids)
        tapped = None
        if taps and self.tap_layers:
            # hidden_states[0] is the embedding output; the output of layer l is hidden_states[l + 1]
            tapped = torch.cat([out.hidden_states[layer + 1][0] for layer in self.tap_layers], dim=-1)
        return TargetOutput(logits=out.logits[0], taps=tapped)

    def crop(self, state: TargetState, length: int) -> None:
        """Drop cached positions >= length (rejected draft tokens)."""
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot crop a cache of {state.length} tokens to {length}")
        if self.runtime is None:
            crop_cache(state.cache, length)
        else:
            self.runtime.pool.crop(state.slot, length)
        state.length = length

    def embedding_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight  # [V, H]

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight  # [V, H]

    def final_norm(self) -> torch.nn.Module | None:
        return getattr(getattr(self.model, "model", None), "norm", None)


def load_plan(path, config, dtype, device, backend: str = "auto", runtime_backend: str = "auto",
              present: bool = True, **knobs) -> Plan | None:
    """The plan ``from_pretrained`` resolves for the model at ``path`` (from its config alone;
    ``knobs``: the other ``RuntimeConfig`` fields; ``present``: the device is here), or None
    when transformers runs it. Its threads are torch's in this process, which the process set
    before loading (``specdec generate`` and the served actors set them from their plan)."""
    if pick_backend(config, backend, quiet=True) != "runtime":
        return None
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    knobs.setdefault("threads", torch.get_num_threads())
    return resolve_plan(RuntimeConfig(str(device), name, runtime_backend, **knobs), config,
                        gguf_blocks.present(path), present=present)


def load_dtype(plan: Plan | None, dtype) -> torch.dtype:
    """The dtype a model loads in: its plan's; without one (transformers runs it) the name,
    auto being float32 (what the plan gives a GPU)."""
    if plan is not None:
        return plan.torch_dtype
    return parse_dtype("float32" if dtype == "auto" else dtype)


def dtype_name(dtype: torch.dtype) -> str:
    names = {v: k for k, v in DTYPES.items()}
    if dtype not in names:
        raise ValueError(f"the runtime runs {sorted(DTYPES)} models, not {dtype}")
    return names[dtype]


def pick_backend(config, backend: str, quiet: bool = False) -> str:
    """``runtime`` for the Llama family, ``transformers`` otherwise (``auto``); logged unless
    ``quiet``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown target backend {backend!r}; choose one of {BACKENDS}")
    reason = unsupported(config)
    if backend == "runtime" and reason:
        raise ValueError(f"the runtime cannot run this model: {reason}")
    chosen = "transformers" if backend == "transformers" or reason else "runtime"
    why = f" ({reason})" if reason and backend == "auto" else ""
    if not quiet:
        log.info("target %s runs on the %s backend%s", getattr(config, "model_type", "?"),
                 chosen, why)
    return chosen
