"""The engine harness's methods, the models behind them, and the interleaved measurement.

A ``Method`` is a name and a recipe: our engine (a target and a drafter side, with
``SpecSettings`` fields) or HF ``generate`` (with generation settings). Every drafter loads once
and engines share them; a target that taps layers loads on its own (the same plan and weights as
the plain one, so the same numerics), the others share one. ``measure`` runs one call at a time,
the methods' order rotated from prompt to prompt so that drift hits every method alike; each call
is timed on the wall clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from pipelines.common.settings import PacerSettings, fixed, pacer

BF16_ENGINES = {"plain_bf16", "suffix_bf16"}  # the target in bfloat16


@dataclass(frozen=True)
class Method:
    name: str
    # the engine ``load_models`` builds: plain(_bf16), ngram, main (block drafter + PACER),
    # no_position, dflash, suffix(_warm, _bf16, _acceptance), hybrid; None = HF generate
    engine: str | None
    settings: dict = field(default_factory=dict)  # SpecSettings fields, or HF generation settings
    strict: bool = True  # lossless: must reproduce ``reference``'s tokens exactly
    reference: str = "ar"  # the plain decoding of the same target and dtype
    # the strict method it approximates (ASD: its verifier's strict twin); None for the rest
    approximates: str | None = None
    needs: str | None = None  # the optional config field that names its model
    note: str = ""


@dataclass(frozen=True)
class Prompt:
    id: str  # corpus row id (the HumanEval task id for HumanEval)
    workload: str  # "humaneval" | "sharegpt"
    ids: list[int]  # chat-templated prompt token ids


@dataclass(frozen=True)
class Record:  # one timed generation
    method: str
    workload: str
    prompt: str
    repeat: int
    tokens: list[int]  # generated tokens, the prompt excluded
    seconds: float  # wall time of the call
    stats: object | None  # RequestStats (our engine) or None (HF generate)


def method_table(cfg, p: PacerSettings, asd, drafter_block: int = 8,
                 dflash_block: int | None = None) -> list[Method]:
    """Every method of ``cfg`` (a ``BenchmarkConfig``) in report order, with PACER's settings
    ``p`` and the ASD controls ``asd``; the block drafter drafts at most B - 1 tokens a round."""
    lookup, gamma, first = cfg.prompt_lookup_tokens, cfg.ngram_gamma, cfg.heuristic_initial
    knobs, budgets = asd.knobs(), asd.budgets
    cap, dflash = drafter_block - 1, (dflash_block or drafter_block) - 1
    methods = [
        Method("ar", "plain", note="our engine, no drafter: the baseline"),
        Method("ar_bf16", "plain_bf16", strict=False,
               note="our engine in bfloat16, no drafter (another dtype: not lossless vs ar)"),
        Method("hf_generate", None, note="HF generate, greedy"),
        Method("hf_prompt_lookup", None, {"prompt_lookup_num_tokens": lookup},
               note=f"HF generate, prompt_lookup_num_tokens={lookup}"),
        Method("ngram", "ngram", fixed(gamma), note=f"our n-gram drafter, gamma {gamma}"),
    ]
    for g in cfg.fixed_gammas:
        note = f"gamma {g}" if g <= cap else f"gamma {g}, capped at B-1 = {cap} by the drafter"
        methods.append(Method(f"fixed_{g}", "main", fixed(g), note=note))
    heuristic = {"policy": "heuristic", "gamma": first, "max_draft": p.max_draft}
    rho = rho_ablation(p, cfg.ablation_growth)
    methods += [
        Method("heuristic", "main", heuristic, note=f"HF's schedule from {first}"),
        Method("pacer", "main", pacer(p), note=pacer_note(p)),
        Method("pacer_no_position", "no_position", pacer(p), needs="preverifier_no_position",
               note="PACER, pre-verifier without position embedding"),
        Method("pacer_rho_ablation", "main", pacer(rho),
               note=f"{pacer_note(rho)}: PACER with rho = {rho.growth:g} (the ablation)"),
        Method("dflash_fixed", "dflash", fixed(dflash), needs="drafter_dflash",
               note=f"DFlash-loss drafter, gamma {dflash} (B-1)"),
    ]
    suffix = {} if cfg.suffix_min_prob is None else {"suffix_min_prob": cfg.suffix_min_prob}
    return (methods + suffix_methods(p, knobs, budgets, suffix)
            + acceptance_methods(cfg.acceptance_pacer, cfg.fixed_gammas, suffix))


def asd_methods(strict: str, engine: str, settings: dict, asd: dict,
                budgets: list[float]) -> list[Method]:
    """``strict``'s method with ASD verification, one per budget B (``{strict}_asd_{B}``)."""
    knobs = f"g={asd['asd_gate']:g}, M={asd['asd_max_exceptions']}"
    return [Method(f"{strict}_asd_{b:g}", engine,
                   settings | {"verify": "asd", "asd_budget": b, **asd}, strict=False,
                   approximates=strict, note=f"{strict} + ASD, B={b:g}, {knobs}")
            for b in budgets]


def suffix_methods(p: PacerSettings, asd: dict, budgets: list[float],
                   suffix: dict) -> list[Method]:
    """Suffix cold / warm and the hybrid, strict and with ASD: the window is the suffix
    budget's own (max_draft); the hybrid's block draft runs PACER with ``p``. ``suffix``: the
    suffix walk's flat settings (suffix_min_prob, ...) for all of them."""
    window = {"policy": "fixed", "gamma": p.max_draft, "max_draft": p.max_draft} | suffix
    hybrid = window | {"block_size": p.block_size, "threshold": p.threshold, "growth": p.growth}
    walk = "".join(f", {k.removeprefix('suffix_')} {v:g}" for k, v in suffix.items())
    return [
        Method("suffix_cold", "suffix", window, note=f"suffix drafter, offline index only{walk}"),
        Method("suffix_warm", "suffix_warm", window,
               note=f"suffix drafter, index + the workload's other prompts' outputs{walk}"),
        Method("suffix_cold_bf16", "suffix_bf16", window, reference="ar_bf16",
               note=f"suffix drafter, offline index only{walk}, the target in bfloat16 "
                    "(checked against ar_bf16)"),
        Method("hybrid_pacer", "hybrid", hybrid, note=f"hybrid: suffix{walk} or {pacer_note(p)}"),
        *asd_methods("hybrid_pacer", "hybrid", hybrid, asd, budgets),
    ]


def acceptance_methods(p: PacerSettings, gammas: list[int], suffix: dict) -> list[Method]:
    """The suffix drafter cut by PACER's rule on its acceptance model (``suffix_pacer``), and
    the fixed windows it is held against (``suffix_fixed_{g}``)."""
    walk = "".join(f", {k.removeprefix('suffix_')} {v:g}" for k, v in suffix.items())
    return [
        *(Method(f"suffix_fixed_{g}", "suffix", fixed(g) | suffix,
                 note=f"suffix drafter, offline index only{walk}, fixed window {g}")
          for g in gammas),
        Method("suffix_pacer", "suffix_acceptance", pacer(p) | suffix, needs="acceptance",
               note=f"suffix drafter{walk}, {pacer_note(p)} on its acceptance model"),
    ]


def rho_ablation(p: PacerSettings, grown: float) -> PacerSettings:
    """The paper's ablation of the growing threshold: PACER's setting with rho = 1 or, when
    that setting has rho = 1 already (a sweep may pick it), with rho = ``grown``."""
    return p.model_copy(update={"growth": 1.0 if p.growth > 1.0 else grown})


def pacer_note(p: PacerSettings) -> str:
    return (f"PACER b={p.block_size}, t={p.threshold:g}, rho={p.growth:g}, "
            f"max {p.max_draft}")


# ---- models ---------------------------------------------------------------------------------
@dataclass
class Models:
    engines: dict  # key -> Engine
    hf_model: object  # the target's HF model (shared by every engine)
    tokenizer: object
    eos: list[int]


def load_models(refs: dict[str, str | None], engines: set[str], dtype: str,
                device: str) -> Models:
    """Each model loaded once, the ``engines`` built (``refs``: local paths, None if absent).
    The suffix drafters are cold (the offline index); ``warm_runner`` warms one per call."""
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_drafter, load_preverifier, target_taps
    from specdec.models.acceptance import acceptance_taps, load_acceptance
    from specdec.models.hybrid import HybridDrafter
    from specdec.models.ngram import NgramDrafter
    from specdec.models.suffix import SuffixConfig, SuffixDrafter
    from specdec.models.suffix_index import SuffixIndex
    from specdec.models.target import TargetModel

    base = TargetModel.from_pretrained(refs["target"], dtype=dtype, device=device)
    bf16 = (TargetModel.from_pretrained(refs["target"], dtype="bfloat16", device=device)
            if engines & BF16_ENGINES else None)
    index = SuffixIndex.load(refs["suffix_index"]) if refs.get("suffix_index") else None

    def tapped(taps: tuple[int, ...]) -> TargetModel:
        """The target again (its own load: the same plan and weights, GGUF codes included),
        tapping ``taps``."""
        return TargetModel.from_pretrained(refs["target"], dtype=dtype, device=device,
                                           tap_layers=taps)

    def cold() -> SuffixDrafter:
        return SuffixDrafter(base.vocab_size, SuffixConfig(online=False), index)

    out = {"plain": Engine(base), "ngram": Engine(base, NgramDrafter(base.vocab_size))}
    out |= {k: Engine(base, cold()) for k in ("suffix", "suffix_warm") if k in engines}
    if "suffix_acceptance" in engines:
        drafter = cold()
        target = tapped(acceptance_taps(base.num_layers, ()))
        out["suffix_acceptance"] = Engine(target, drafter, acceptance=load_acceptance(
            refs["acceptance"], "suffix", drafter, target))
    if "plain_bf16" in engines:
        out["plain_bf16"] = Engine(bf16)
    if "suffix_bf16" in engines:
        out["suffix_bf16"] = Engine(bf16, cold())
    if engines & {"main", "no_position", "hybrid"}:
        target = tapped(target_taps(refs["drafter"]))
        drafter = load_drafter(refs["drafter"], target, dtype)
        pre = load_preverifier(refs["preverifier"], drafter)
        out["main"] = Engine(target, drafter, pre)
        if "no_position" in engines:
            out["no_position"] = Engine(
                target, drafter, load_preverifier(refs["preverifier_no_position"], drafter))
        if "hybrid" in engines:
            out["hybrid"] = Engine(target, HybridDrafter(cold(), drafter, pre))
    if "dflash" in engines:
        target = tapped(target_taps(refs["drafter_dflash"]))
        out["dflash"] = Engine(target, load_drafter(refs["drafter_dflash"], target, dtype))
    return Models(out, base.model, base.tokenizer, sorted(base.eos_token_ids))


# ---- one timed call -------------------------------------------------------------------------
Runner = Callable[[list[int], int], tuple[list[int], object | None]]  # (ids, n) -> tokens, stats


def engine_runner(engine, settings: dict) -> Runner:
    from specdec.engine.settings import GenerationParams, SpecSettings

    spec = SpecSettings(**settings)

    def run(prompt_ids: list[int], max_new_tokens: int):
        out = engine.generate(prompt_ids, GenerationParams(max_new_tokens, spec=spec))
        return out.token_ids, out.stats

    return run


def hf_runner(model, eos: list[int], settings: dict) -> Runner:
    import torch
    from transformers import GenerationConfig

    def run(prompt_ids: list[int], max_new_tokens: int):
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
        config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                  eos_token_id=eos, pad_token_id=eos[0] if eos else None,
                                  **settings)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 generation_config=config)
        return out[0, len(prompt_ids):].tolist(), None

    return run


def warm_runner(engine, settings: dict, prompts: list[Prompt], outputs: dict[str, list[int]]) -> Runner:
    """The suffix drafter with the target's outputs of the *other* prompts of the same workload
    in its global tree (as if they had been served first); the prompt's own output never."""
    drafter, run = engine.draft_worker.draft_model, engine_runner(engine, settings)
    keys = {p.id: drafter.remember(outputs[p.id]) for p in prompts}
    by_ids = {tuple(p.ids): p for p in prompts}

    def warm(prompt_ids: list[int], max_new_tokens: int):
        own = by_ids[tuple(prompt_ids)]
        others = [p for p in prompts if p.workload != own.workload]
        for p in [own, *others]:  # only this workload's other outputs stay in the tree
            drafter.forget(keys[p.id])
        try:
            return run(prompt_ids, max_new_tokens)
        finally:
            for p in [own, *others]:
                keys[p.id] = drafter.remember(outputs[p.id])

    return warm


def recorded_outputs(path: str, prompts: list[Prompt]) -> dict[str, list[int]]:
    """Greedy outputs recorded earlier ({prompt id: token ids}); every prompt must be there."""
    outputs = json.loads(Path(path).read_text())
    missing = [p.id for p in prompts if p.id not in outputs]
    if missing:
        raise ValueError(f"benchmark.warm_outputs: {path} has no output for {missing[:3]}")
    return {p.id: list(outputs[p.id]) for p in prompts}


def runners(methods: list[Method], models: Models, prompts: list[Prompt] | None = None,
            max_new_tokens: int = 0, warm_outputs: str | None = None) -> dict[str, Runner]:
    """A runner per method; suffix_warm first gets every prompt's greedy output (recorded in
    ``warm_outputs``, else computed untimed: strict SD serves exactly these)."""
    from specdec.engine.settings import GenerationParams

    out = {}
    for m in methods:
        if m.engine == "suffix_warm":
            plain = models.engines["plain"]
            outputs = recorded_outputs(warm_outputs, prompts) if warm_outputs else {
                p.id: plain.generate(p.ids, GenerationParams(max_new_tokens)).token_ids
                for p in prompts}
            out[m.name] = warm_runner(models.engines[m.engine], m.settings, prompts, outputs)
        elif m.engine:
            out[m.name] = engine_runner(models.engines[m.engine], m.settings)
        else:
            out[m.name] = hf_runner(models.hf_model, models.eos, m.settings)
    return out


# ---- the measurement ------------------------------------------------------------------------
def measure(prompts: list[Prompt], methods: list[Method], run: dict[str, Runner],
            max_new_tokens: int, repeats: int, progress: bool = True,
            journal=None) -> list[Record]:
    """Every method on every prompt, ``repeats`` times, interleaved and rotated. Calls already
    in ``journal`` (a ``bench.journal.Journal``) are taken from it; new ones are added to it."""
    records = []
    bar = tqdm(total=repeats * len(prompts) * len(methods), desc="benchmark", disable=not progress)
    for r in range(repeats):
        for i, prompt in enumerate(prompts):
            shift = (r * len(prompts) + i) % len(methods)
            for m in methods[shift:] + methods[:shift]:
                record = journal.get(r, prompt.id, m.name) if journal is not None else None
                if record is None:
                    record = timed_call(run[m.name], m, prompt, r, max_new_tokens)
                    if journal is not None:
                        journal.add(record)
                records.append(record)
                bar.update()
    bar.close()
    return records


def timed_call(runner: Runner, m: Method, prompt: Prompt, repeat: int, n: int) -> Record:
    t0 = time.perf_counter()
    tokens, stats = runner(prompt.ids, n)
    return Record(m.name, prompt.workload, prompt.id, repeat, tokens, time.perf_counter() - t0,
                  stats)
