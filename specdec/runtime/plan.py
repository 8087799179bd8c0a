"""One resolved plan: what the target runs, decided once, from a config and the model's config.

``resolve_plan(RuntimeConfig, model_config, blocks=...)`` turns the runtime's knobs -- device,
dtype, backend, linears, attention, KV dtype, the x86 kernels' instruction set, context length,
slots -- into a frozen ``Plan``: the device and backend, the numerics (said plainly when they
are not the checkpoint's float32), the linear and attention kinds, the KV dtype, the
instruction set specdec's x86 kernels run on, whether passes are batch invariant (so greedy SD
commits exactly plain decoding's tokens), and the memory it takes. Every ``auto`` is decided
here and nowhere else; a knob that does not apply to the plan's backend is an error naming it,
and a plan that does not fit its device is an error naming the fields to change
(``PlanError``). It reads the model's config only, never its weights, so ``specdec plan`` can
plan for a device that is not present.

Backends: ``torch`` runs anywhere torch does (CUDA, any CPU, ``meta``): ``F.linear`` on one
``[out, in]`` weight, SDPA, not batch invariant. ``x86`` (``specdec.runtime.x86``) runs x86-64
CPUs: specdec's kernels on AVX-512 or AVX2 (all but the float32 panels on AVX2 too), oneDNN's
packed linears, batch invariance by probes in bfloat16. ``auto`` is x86 on an x86-64 CPU, torch
elsewhere. A plan whose backend is torch never imports the x86 package.

Threads and waiting (any backend): ``threads`` is torch's intra-op thread count (default: the
CPUs this process may use, ``usable_cpus``); ``omp_wait_policy`` is how OpenMP's threads wait at
the end of a parallel region: ``default`` (libgomp's own: they spin a short while, then sleep),
``passive`` (they sleep at once) or ``active`` (they spin until the next region). libgomp,
torch's OpenMP, reads ``OMP_WAIT_POLICY`` once, when it loads with torch, so setting it later in
a process changes nothing: the plan decides, and a process applies it by starting with
``omp_env``'s variables (the served app puts them in its actors' ``runtime_env``; ``specdec
generate`` starts itself again with them; a program that runs the engine in-process sets them
before it imports torch). A variable the user set is respected, and the plan says so.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.runtime.weights import Shape, unsupported

BACKENDS = ("auto", "torch", "x86")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
DTYPE_NAMES = (*sorted(DTYPES), "auto")
LINEARS = ("auto", "torch", "onednn", "panels", "quantized", "int8")
ATTENTIONS = ("auto", "sdpa", "kernel", "grouped", "per_query")
KV_CACHE_DTYPES = ("auto", "model", "float16")
WAIT_POLICIES = ("auto", "default", "active", "passive")
SWITCHES = ("auto", "on", "off")
CGROUP = Path("/sys/fs/cgroup")  # a container's own cgroup (a Kubernetes pod's CPU limit)
ISAS = ("auto", "avx512", "avx2")  # the instruction sets specdec's x86 kernels are built for
ROUND_LEN = 256  # an automatic max_model_len is a multiple of this
# the share of a GPU's memory a plan may take (the rest: CUDA's context, the allocator's slack)
GPU_SHARE = 0.9
# bytes a weight takes as GGUF codes (SmolLM2's GGUF: Q4_1 linears, a Q8_0 embedding)
CODE_BYTES = {"layers": 20 / 32, "lm_head": 34 / 32}


class PlanError(ValueError):
    """A config that cannot run as asked: the message names the fields to change."""


@dataclass(frozen=True)
class RuntimeConfig:
    """The runtime's knobs, as a serve config, a pipeline config or the CLI give them."""

    device: str = "auto"  # cpu, cuda, cuda:N, meta, or auto (the GPU when torch sees one)
    dtype: str = "float32"  # float32, bfloat16, float64, or auto
    backend: str = "auto"  # torch, x86, or auto
    linears: str = "auto"  # torch, onednn, panels, quantized, int8 (x86 but torch), or auto
    attention: str = "auto"  # sdpa, kernel, grouped, per_query (x86 but sdpa), or auto
    kv_cache_dtype: str = "auto"  # model, float16 (x86's attention kernel), or auto
    max_model_len: int | None = None  # positions a KV slot holds; None: what memory allows
    slots: int = 8  # KV slots: requests held at once
    threads: int | None = None  # torch's intra-op threads; None: the CPUs this process may use
    omp_wait_policy: str = "auto"  # how OpenMP's threads wait: default, passive, active, or auto
    # each pass on 1 thread or on ``threads``, whichever runs faster now (specdec.runtime.threads)
    threads_by_load: str = "auto"  # on, off, or auto (on where a pass's bits do not depend on it)
    # x86: the instruction set specdec's kernels run on: avx512 (all of them), avx2 (all but the
    # float32 panels, as on a CPU without AVX-512), or auto (the CPU's)
    isa: str = "auto"

    def __post_init__(self):
        for name, allowed in (("dtype", DTYPE_NAMES), ("backend", BACKENDS),
                              ("linears", LINEARS), ("attention", ATTENTIONS),
                              ("kv_cache_dtype", KV_CACHE_DTYPES),
                              ("omp_wait_policy", WAIT_POLICIES), ("isa", ISAS),
                              ("threads_by_load", SWITCHES)):
            if getattr(self, name) not in allowed:
                raise PlanError(f"{name} must be one of {list(allowed)}, "
                                f"not {getattr(self, name)!r}")
        if self.slots < 1:
            raise PlanError(f"slots (kv_slots) must be >= 1, got {self.slots}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise PlanError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.threads is not None and (isinstance(self.threads, bool)
                                         or not isinstance(self.threads, int) or self.threads < 1):
            raise PlanError(f"threads (torch's intra-op threads) must be an integer >= 1, "
                            f"got {self.threads!r}")


@dataclass(frozen=True)
class Memory:
    """Bytes the plan takes on its device."""

    weights: int  # the checkpoint's weights in the plan's dtype and the copies its linears run on
    kv_pool: int  # slots x max_model_len positions of keys and values, every layer
    workspace: int  # one pass's activations and logits, at most ``slots`` x 256 tokens
    total: int
    device: int | None  # what the plan may take of the device (None: no bound, e.g. meta)
    kv_per_token: int  # one position of one slot, every layer

    @property
    def fits(self) -> bool:
        return self.device is None or self.total <= self.device


@dataclass(frozen=True)
class Plan:
    device: str
    backend: str  # torch | x86
    dtype: str  # the passes' dtype
    numerics: str  # what the logits are computed in, said plainly
    linears: str  # torch | onednn | panels | quantized | int8
    attention: str  # sdpa | kernel | grouped | per_query
    kv_cache_dtype: str
    batch_invariant: bool  # a token's outputs are bitwise its outputs alone, in any batch
    fused: bool  # the element-wise steps run fused (x86's float32 kernels)
    max_model_len: int
    slots: int
    memory: Memory
    threads: int  # torch's intra-op threads
    omp_wait_policy: str  # default | passive | active: how OpenMP's threads wait between regions
    reasons: tuple[str, ...] = ()  # how each auto was decided
    isa: str = ""  # x86: the instruction set its kernels run on (avx512 | avx2 | none); else ""
    threads_by_load: bool = False  # each pass on 1 thread or ``threads``, the faster now

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        return {**DTYPES, "float16": torch.float16}[self.kv_cache_dtype]

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["memory"]["fits"] = self.memory.fits
        out["reasons"] = list(self.reasons)
        return out

    def describe(self) -> str:
        """The plan as the lines printed at start."""
        return describe(self.to_dict())


def describe(plan: dict) -> str:
    """A plan's dict (``Plan.to_dict``, as ``/health`` returns it) as the lines printed at start."""
    m = plan["memory"]
    room = "no bound" if m["device"] is None else gib(m["device"])
    isa = f" ({plan['isa']} kernels)" if plan.get("isa") else ""
    lines = [f"plan: {plan['backend']} backend{isa} on {plan['device']}, numerics: "
             f"{plan['numerics']}",
             f"  linears {plan['linears']}, attention {plan['attention']}, KV caches "
             f"{plan['kv_cache_dtype']}, batch invariant: "
             f"{'yes' if plan['batch_invariant'] else 'no'}"
             f"{', fused element-wise steps' if plan['fused'] else ''}",
             f"  {plan['slots']} slots x {plan['max_model_len']} positions; memory: weights "
             f"{gib(m['weights'])}, KV pool {gib(m['kv_pool'])}, workspace "
             f"{gib(m['workspace'])}, total {gib(m['total'])} of {room}"]
    if "threads" in plan:  # a plan of before these fields (an older server's /health) has none
        by_load = " (or 1, by load)" if plan.get("threads_by_load") else ""
        lines.append(f"  {plan['threads']} torch threads{by_load}, OpenMP wait policy "
                     f"{plan['omp_wait_policy']}")
    return "\n".join(lines + [f"  ({r})" for r in plan["reasons"]])


def gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def parse_size(text: str | int | None) -> int | None:
    """Bytes from ``80GiB``, ``80GB``, ``512MiB`` or a plain number of bytes."""
    if text is None or isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?)B?\s*", text, re.IGNORECASE)
    if not m:
        raise PlanError(f"device memory {text!r} is not a size such as 80GiB")
    unit = 1024 if m.group(3) or not m.group(2) else 1000
    power = " KMGT".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * unit ** power)


def parse_device(name: str | torch.device | None, present: bool = True) -> torch.device:
    """``cpu``, ``cuda`` (``cuda:N``), ``meta`` or ``auto`` (the GPU when torch sees one);
    ``present``: the device must be here (not so for ``specdec plan``)."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if present and device.type == "cuda" and not torch.cuda.is_available():
        raise PlanError(f"device {str(name)!r} asked for, but torch sees no CUDA device")
    return device


def device_memory(device: torch.device) -> int | None:
    """What a plan may take of ``device``: a share of a GPU's memory, a CPU's physical memory
    (its KV pages are only taken when touched, so this bound is conservative there)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device.index or 0).total_memory * GPU_SHARE)
    if device.type == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def x86_cpu() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def resolve_plan(config: RuntimeConfig, model_config, blocks: bool = False,
                 memory: int | str | None = None, present: bool = True,
                 environ: Mapping[str, str] | None = None) -> Plan:
    """The plan of ``config`` for a model of ``model_config`` (``blocks``: whether its GGUF
    blocks are beside it, which the x86 backend's int8 and quantized linears run);
    ``memory``: what the plan may take of the device (None: ``device_memory``, unknown for a GPU
    that is not here: no bound; a size such as ``80GiB``); ``present``: the device is here;
    ``environ``: the environment the process runs in (None: this one's)."""
    reason = unsupported(model_config)
    if reason:
        raise PlanError(f"the runtime cannot run this model: {reason}")
    device = parse_device(config.device, present)
    backend = pick_backend(config.backend, device)
    reasons = []
    if backend == "x86":
        from specdec.runtime.x86.plan import resolve_kinds
    else:
        resolve_kinds = torch_kinds
    shape = Shape.from_config(model_config)
    kinds = resolve_kinds(config, shape, blocks, reasons)
    bound = parse_size(memory) if memory is not None else device_memory(device)
    max_len, mem = fit(config, model_config, shape, kinds, bound, reasons)
    threads = pick_threads(config.threads, reasons)
    policy = pick_wait_policy(config.omp_wait_policy, environ, reasons)
    by_load = pick_threads_by_load(config.threads_by_load, device, threads,
                                   kinds.get("thread_invariant", False), reasons)
    return Plan(str(device), backend, kinds["dtype"], kinds["numerics"], kinds["linears"],
                kinds["attention"], kinds["kv_cache_dtype"], kinds["batch_invariant"],
                kinds["fused"], max_len, config.slots, mem, threads, policy, tuple(reasons),
                kinds["isa"], by_load)


def pick_backend(name: str, device: torch.device) -> str:
    if name == "x86" and (device.type != "cpu" or not x86_cpu()):
        raise PlanError(f"backend x86 runs x86-64 CPUs; this plan's device is {device} on "
                        f"{platform.machine()} (backend: torch or auto)")
    if name == "auto":
        return "x86" if device.type == "cpu" and x86_cpu() else "torch"
    return name


def torch_kinds(config: RuntimeConfig, shape: Shape, blocks: bool, reasons: list) -> dict:
    """The torch backend's choices: it has one of each, so every knob but auto and its own
    names is an error naming the knob."""
    for knob, own in (("linears", "torch"), ("attention", "sdpa"), ("kv_cache_dtype", "model"),
                      ("isa", "auto")):
        value = getattr(config, knob)
        if value not in ("auto", own):
            ok = "auto" if own == "auto" else f"auto or {own}"
            raise PlanError(f"{knob}: {value} needs the x86 backend; this plan's backend is "
                            f"torch ({knob}: {ok})")
    dtype = "float32" if config.dtype == "auto" else config.dtype
    if config.dtype == "auto":
        reasons.append("dtype auto: float32 on the torch backend")
    return dict(dtype=dtype, numerics=dtype, linears="torch", attention="sdpa",
                kv_cache_dtype=dtype, batch_invariant=False, fused=False, isa="")


def parameters(model_config) -> dict[str, int]:
    """The model's weights by kind, counted from its config: ``layers`` (the layers' linears),
    ``lm_head`` (its own, or the embedding when tied), ``other`` (embedding, norms, biases)."""
    s = Shape.from_config(model_config)
    inter = model_config.intermediate_size
    qkv = s.hidden * (s.heads + 2 * s.kv_heads) * s.head_dim
    linears = qkv + s.heads * s.head_dim * s.hidden + 3 * s.hidden * inter
    bias = (s.heads + 2 * s.kv_heads) * s.head_dim if model_config.model_type == "qwen2" else 0
    norms = 2 * s.hidden + (2 * s.head_dim if model_config.model_type == "qwen3" else 0)
    tied = getattr(model_config, "tie_word_embeddings", False)
    embed = s.vocab * s.hidden
    return {"layers": s.layers * linears, "lm_head": embed,
            "other": (0 if tied else embed) + s.layers * (bias + norms) + s.hidden}


def weight_bytes(model_config, kinds: dict) -> int:
    """The weights in the plan's dtype, and the copies its linears run on (``x86.linears``)."""
    count, size = parameters(model_config), DTYPES[kinds["dtype"]].itemsize
    linear = count["layers"] + count["lm_head"]
    copies = {"torch": 0, "panels": 1, "quantized": 1,
              "onednn": 2 if kinds["dtype"] == "float32" else 1}.get(kinds["linears"], 0)
    codes = 0
    if kinds["linears"] in ("int8", "quantized"):
        codes = int(count["layers"] * CODE_BYTES["layers"] + count["lm_head"] * CODE_BYTES["lm_head"])
    return sum(count.values()) * size + copies * linear * size + codes


def fit(config: RuntimeConfig, model_config, shape: Shape, kinds: dict, bound: int | None,
        reasons: list) -> tuple[int, Memory]:
    """The KV slots' length (``max_model_len``, or the most that fits, at most the model's
    context) and the plan's memory; ``PlanError`` when it does not fit."""
    kv_size = {**DTYPES, "float16": torch.float16}[kinds["kv_cache_dtype"]].itemsize
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * kv_size
    weights = weight_bytes(model_config, kinds)
    tokens = min(config.slots, 64) * 256  # a pass's tokens at most (a step's budget)
    workspace = tokens * (shape.vocab + 4 * model_config.intermediate_size + 6 * shape.hidden) * 4
    fixed = weights + workspace
    max_len = config.max_model_len
    if max_len is None:
        max_len = shape.max_len
        if bound is not None and fixed + config.slots * max_len * per_token > bound:
            room = (bound - fixed) // (config.slots * per_token)
            max_len = min(shape.max_len, room // ROUND_LEN * ROUND_LEN)
            reasons.append(f"max_model_len auto: {max_len} of the model's {shape.max_len} "
                           f"positions fit {config.slots} slots in the device's memory")
    elif max_len > shape.max_len:
        raise PlanError(f"max_model_len {max_len} exceeds the model's context of {shape.max_len}")
    pool = config.slots * max(max_len, 0) * per_token
    mem = Memory(weights, pool, workspace, fixed + pool, bound, per_token)
    if max_len < 1 or not mem.fits:
        raise PlanError(
            f"the plan does not fit its device: weights {gib(weights)} + KV pool "
            f"{gib(pool)} ({config.slots} slots x {max_len} positions x {per_token} bytes) + "
            f"workspace {gib(workspace)} = {gib(mem.total)} > {gib(bound)}: lower max_model_len "
            f"or kv_slots (the batch size of a pipeline), or use a smaller dtype")
    return max_len, mem


def usable_cpus(affinity: int | None = None, cgroup: Path = CGROUP) -> tuple[int, str]:
    """The CPUs this process may keep busy, and how that was found: the CPUs it may run on
    (``affinity``; None: ``os.sched_getaffinity``), at most its cgroup's CPU quota rounded down
    (threads beyond a quota are throttled: each period they stall together until the next one),
    and at least 1."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            os.cpu_count() or 1
    quota = cpu_quota(cgroup)
    if quota is None or quota >= affinity:
        return affinity, f"{affinity} CPUs this process may run on"
    return max(1, math.floor(quota)), f"a cgroup CPU quota of {quota:g} of {affinity} CPUs"


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPU quota of the cgroup mounted at ``cgroup`` in CPUs (cgroup v2 ``cpu.max``: ``QUOTA
    PERIOD`` or ``max PERIOD``; v1 ``cpu/cpu.cfs_quota_us`` and ``cpu.cfs_period_us``), None
    when it sets none."""
    try:
        quota, _, period = (cgroup / "cpu.max").read_text().partition(" ")
    except OSError:
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text()
        except OSError:
            return None
    quota = quota.strip()
    if quota in ("max", "-1"):
        return None
    return int(quota) / int(period)


def pick_threads(asked: int | None, reasons: list) -> int:
    if asked is not None:
        return asked
    n, why = usable_cpus()
    reasons.append(f"threads auto: {n}, {why}")
    return n


def pick_threads_by_load(asked: str, device: torch.device, threads: int, invariant: bool,
                         reasons: list) -> bool:
    """Whether each pass runs on the faster of 1 and ``threads`` threads now: on a CPU, with
    threads to choose between, where a pass's bits do not depend on its threads
    (``invariant``: the backend's kinds say so), so the choice never changes a token. Auto is
    on there, chosen by measurement (docs/RESULTS.md#runtime): beside a busy process a pass on
    every CPU ran several times slower than on one, and alone the choice costs a try now and
    then."""
    why = ("the device is not a CPU" if device.type != "cpu" else
           "there is one thread" if threads < 2 else
           None if invariant else
           "a pass's bits could depend on its threads (only specdec's kernel linears with "
           "batch-invariant attention are known not to)")
    if asked == "on" and why:
        raise PlanError(f"threads_by_load: on, but {why} (threads_by_load: auto or off)")
    if asked == "auto":
        reasons.append(f"threads_by_load auto: off, {why}" if why else
                       f"threads_by_load auto: on, each pass on 1 thread or {threads}, the "
                       f"faster now (a pass's bits do not depend on it)")
    return asked != "off" and why is None


def pick_wait_policy(asked: str, environ: Mapping[str, str] | None, reasons: list) -> str:
    """``$OMP_WAIT_POLICY`` when the environment sets it (libgomp has read it: an asked policy
    that differs is an error); else auto is libgomp's default, chosen by measurement
    (docs/RESULTS.md#runtime): sleeping at once costs a wake-up every parallel region, which
    made a decode pass several times slower alone, and spinning without end holds the cores
    while the actor idles; beside a busy process no policy kept two threads' speed. On a GPU
    the passes run there and OpenMP only runs the host's small steps: the policy matters
    little."""
    environ = os.environ if environ is None else environ
    given = environ.get("OMP_WAIT_POLICY")
    if given:
        value = given.strip().lower()
        if value not in ("active", "passive"):
            raise PlanError(f"OMP_WAIT_POLICY is {given!r} in the environment; OpenMP takes "
                            f"ACTIVE or PASSIVE (or unset it: omp_wait_policy then decides)")
        if asked not in ("auto", value):
            raise PlanError(f"omp_wait_policy: {asked}, but the environment sets "
                            f"OMP_WAIT_POLICY={given}, which OpenMP read when it loaded: unset "
                            f"it, or omp_wait_policy: auto or {value}")
        reasons.append(f"omp_wait_policy: {value}, as the environment's OMP_WAIT_POLICY says")
    elif asked == "auto":
        reasons.append("omp_wait_policy auto: default, libgomp's own (spin a while, then sleep): "
                       "the fastest alone by measurement")
    if environ.get("GOMP_SPINCOUNT"):
        reasons.append(f"GOMP_SPINCOUNT={environ['GOMP_SPINCOUNT']} in the environment: OpenMP's "
                       f"threads spin that long before they sleep, whatever the policy")
    return value if given else "default" if asked == "auto" else asked


def omp_env(asked: str = "auto", environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables a process must start with for the wait policy ``asked``
    (``RuntimeConfig.omp_wait_policy``) to run: libgomp reads them when it loads, before any of
    torch's code runs. A value the environment already sets is kept as it is; libgomp's
    default needs none."""
    environ = os.environ if environ is None else environ
    policy = pick_wait_policy(asked, environ, [])
    if environ.get("OMP_WAIT_POLICY"):
        return {"OMP_WAIT_POLICY": environ["OMP_WAIT_POLICY"]}
    return {} if policy == "default" else {"OMP_WAIT_POLICY": policy.upper()}
