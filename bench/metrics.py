"""The engine harness's numbers per method and workload, then the claims and the goals.

- tokens/s: per repeat, the workload's generated tokens over the summed wall time of its calls
  (prefill included; long outputs weigh more, as in a stream of requests); median over repeats.
  ratio to ar: over ``ar``'s, same workload, same run.
- mean accepted length: tokens committed per verify round (1.0 for ``ar``); the counts come from
  repeat 0 (greedy outputs repeat). Target passes per 100 tokens: the prefill included.
- time shares: drafter / pre-verifier / target seconds of the engine's stats over its total;
  overhead is the rest (verification glue, bookkeeping, Python).
- same as ar: the share of (prompt, repeat) outputs equal token for token to the method's
  reference, plain decoding of its target and dtype (``ar``, or ``ar_bf16``); strict must be 1.0.
- pass@1: repeat-0 HumanEval replies that pass the problem's tests.
- target log-likelihood: the target's mean log-probability per token of the method's repeat-0
  outputs (teacher forcing, the run's dtype), a reference-free measure of an approximate
  method's drift when pass@1 cannot tell budgets apart; a lossless method scores ``ar``'s.
- draft sources: rounds by the drafter that proposed them (the hybrid's mix).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from tqdm import tqdm

from bench import humaneval
from bench.methods import Method, Prompt, Record


def tokens_per_s(records) -> float:
    seconds = sum(r.seconds for r in records)
    return sum(len(r.tokens) for r in records) / seconds if seconds else 0.0


def speed(records: list[Record]) -> list[float]:
    """tokens/s of each repeat, in repeat order."""
    repeats = sorted({r.repeat for r in records})
    return [tokens_per_s([r for r in records if r.repeat == k]) for k in repeats]


def engine_counts(records: list[Record]) -> dict:
    """Speculation counts from the engine's stats (repeat 0) and time shares (all repeats)."""
    first = [r.stats for r in records if r.repeat == 0]
    rounds = sum(s.rounds for s in first)
    committed = sum(s.committed for s in first)
    drafted, accepted = sum(s.drafted for s in first), sum(s.accepted for s in first)
    at_d, at_a, lengths = Counter(), Counter(), Counter()
    for s in first:
        at_d.update(dict(enumerate(s.drafted_at)))
        at_a.update(dict(enumerate(s.accepted_at)))
        lengths.update(s.draft_lengths)
    times = {k: sum(getattr(r.stats, f"{k}_s") for r in records)
             for k in ("drafter", "preverifier", "target", "total")}
    total = times.pop("total") or 1.0
    shares = {k: v / total for k, v in times.items()}
    shares["overhead"] = max(0.0, 1.0 - sum(shares.values()))
    return {
        "mean_accepted_length": committed / rounds if rounds else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "target_passes_per_100_tokens": 100 * sum(s.target_passes for s in first) / max(committed, 1),
        "acceptance_at": [at_a[i] / at_d[i] for i in range(len(at_d))],
        "draft_lengths": {int(k): v for k, v in sorted(lengths.items())},
        "draft_sources": dict(sorted(sum((s.draft_sources for s in first), Counter()).items())),
        "time_share": shares,
        "regret_per_request": sum(s.regret_spent for s in first) / max(len(first), 1),
        "exceptions_per_request": sum(s.exceptions for s in first) / max(len(first), 1),
    }


def method_metrics(records: list[Record], reference: dict, m: Method) -> dict:
    tps = speed(records)
    same = [r.tokens == reference.get((r.workload, r.prompt, r.repeat)) for r in records]
    out = {"tokens_per_s": statistics.median(tps), "tokens_per_s_repeats": tps,
           "tokens": sum(len(r.tokens) for r in records if r.repeat == 0),
           "seconds": sum(r.seconds for r in records), "same_as_ar": sum(same) / len(same),
           "strict": m.strict, "reference": m.reference}
    if m.engine is not None:
        out |= engine_counts(records)
    if m.strict:
        out["lossless"] = out["same_as_ar"] == 1.0
    return out


def summarise(records: list[Record], methods: list[Method]) -> dict[str, dict[str, dict]]:
    """workload -> method -> metrics; ``ratio_to_ar`` added where ``ar`` was measured."""
    names = {m.reference for m in methods}
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    references: dict[str, dict] = defaultdict(dict)  # reference method -> (w, prompt, repeat) -> tokens
    for r in records:
        groups[(r.workload, r.method)].append(r)
        if r.method in names:
            references[r.method][(r.workload, r.prompt, r.repeat)] = r.tokens
    workloads = list(dict.fromkeys(r.workload for r in records))
    out: dict[str, dict[str, dict]] = {w: {} for w in workloads}
    for m in methods:  # report order: the method table's
        for w in workloads:
            if (w, m.name) in groups:
                out[w][m.name] = method_metrics(groups[(w, m.name)], references[m.reference], m)
    for per_method in out.values():
        ar = per_method.get("ar", {}).get("tokens_per_s")
        for metrics in per_method.values():
            metrics["ratio_to_ar"] = metrics["tokens_per_s"] / ar if ar else None
    return out


def pass_at_1(records: list[Record], decode: Callable[[list[int]], str], timeout_s: float,
              progress: bool = True) -> dict[str, float]:
    """method -> HumanEval pass@1 over repeat 0; identical replies are executed once."""
    todo = [r for r in records if r.workload == "humaneval" and r.repeat == 0]
    verdicts: dict[tuple[str, str], bool] = {}
    passed: dict[str, list[bool]] = defaultdict(list)
    for r in tqdm(todo, desc="humaneval tests", disable=not progress):
        key = (r.prompt, decode(r.tokens))
        if key not in verdicts:
            verdicts[key] = humaneval.passes(humaneval.problems()[r.prompt], key[1], timeout_s)
        passed[r.method].append(verdicts[key])
    return {m: sum(v) / len(v) for m, v in passed.items()}


def token_log_likelihoods(model, prompt_ids: list[int], tokens: list[int]) -> list[float]:
    """log p(tokens[i] | prompt, tokens[:i]) under ``model`` (an HF causal LM), one pass."""
    import torch

    if not tokens:
        return []
    ids = torch.tensor([prompt_ids + tokens], dtype=torch.long, device=model.device)
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt_ids) - 1: -1].double()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(tokens, device=logp.device)[:, None])[:, 0].tolist()


def mean_log_likelihood(records: list[Record], prompts: list[Prompt], model,
                        progress: bool = True) -> dict[tuple[str, str], float]:
    """(workload, method) -> the target's mean log-likelihood per generated token of the
    repeat-0 outputs, token weighted; identical outputs are scored once."""
    by_id = {p.id: p.ids for p in prompts}
    scored: dict[tuple[str, tuple[int, ...]], list[float]] = {}
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for r in tqdm([r for r in records if r.repeat == 0], desc="target log-likelihood",
                  disable=not progress):
        key = (r.prompt, tuple(r.tokens))
        if key not in scored:
            scored[key] = token_log_likelihoods(model, by_id[r.prompt], r.tokens)
        sums[(r.workload, r.method)][0] += sum(scored[key])
        sums[(r.workload, r.method)][1] += len(r.tokens)
    return {k: s / n for k, (s, n) in sums.items() if n}


# ---- claims and goals -----------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    """``num`` against ``den`` on one metric: a ratio, or a difference in points (x100)."""

    title: str
    metric: str  # a key of the per-method metrics
    num: str  # method name
    den: tuple[str, ...]  # method name, or candidates: the best of them on the metric
    workloads: tuple[str, ...] = ("humaneval", "sharegpt")
    minimum: float | None = None  # a goal: passes when the value is at least this
    points: bool = False  # value = 100 * (num - den) instead of num / den


def evaluate(c: Comparison, summary: dict, missing: dict[str, str]) -> list[dict]:
    rows = []
    for w in c.workloads:
        have = summary.get(w, {})
        row = {"title": c.title, "workload": w, "metric": c.metric, "numerator": c.num,
               "value": None, "minimum": c.minimum, "passed": None, "points": c.points}
        dens = [d for d in c.den if have.get(d, {}).get(c.metric) is not None]
        absent = [n for n in (c.num, *c.den) if n in missing or n not in have]
        if have.get(c.num, {}).get(c.metric) is None or not dens:
            name = next((n for n in absent if n in missing), absent[0] if absent else c.num)
            row["note"] = missing.get(name, f"not measured: {name} was not run or has no {c.metric}")
            rows.append(row)
            continue
        den = max(dens, key=lambda d: have[d][c.metric])
        a, b = have[c.num][c.metric], have[den][c.metric]
        value = 100 * (a - b) if c.points else (a / b if b else None)
        row |= {"denominator": den, "num_value": a, "den_value": b, "value": value}
        if c.minimum is not None and value is not None:
            row["passed"] = value >= c.minimum
        rows.append(row)
    return rows


def claims(asd_methods: dict[str, str], fixed_methods: list[str], dpace_fixed: str | None,
           rho_grows: bool = True) -> list[Comparison]:
    """``asd_methods``: ASD method -> the strict method it approximates. ``rho_grows``: PACER's
    own setting has rho > 1, so its rho ablation runs rho = 1 (else the ablation is the side
    that grows)."""
    tps, mal = "tokens_per_s", "mean_accepted_length"
    grown, constant = ("pacer", "pacer_rho_ablation") if rho_grows else ("pacer_rho_ablation",
                                                                         "pacer")
    out = [
        Comparison("D-PACE vs DFlash loss: mean accepted length at gamma B-1", mal,
                   dpace_fixed or "dflash_fixed", ("dflash_fixed",)),
        Comparison("PACER vs the best fixed gamma: tokens/s", tps, "pacer", tuple(fixed_methods)),
        *(Comparison(f"{title}: {what}", metric, num, (den,))
          for title, num, den in (("PACER vs PACER without position embedding", "pacer",
                                   "pacer_no_position"),
                                  ("PACER, growing threshold (rho > 1) vs rho = 1", grown, constant))
          for metric, what in ((tps, "tokens/s"), (mal, "mean accepted length"))),
    ]
    for m, strict in asd_methods.items():
        out += [Comparison(f"{m} vs {strict} strict: tokens/s", tps, m, (strict,)),
                Comparison(f"{m} vs {strict} strict: HumanEval pass@1 (points)", "pass_at_1",
                           m, (strict,), ("humaneval",), points=True)]
    return out


def fastest_lossless(summary: dict, candidates: list[str]) -> str | None:
    """The candidate (strict methods of our engine) with the highest geometric mean of its
    ratios to ``ar`` over the workloads, measured on every one of them and lossless on every
    one (its outputs equal its reference's); None if none was."""
    def score(name: str) -> float | None:
        if not all(w.get(name, {}).get("lossless") for w in summary.values()):
            return None
        ratios = [w[name].get("ratio_to_ar") for w in summary.values()]
        if not ratios or any(r is None or r <= 0 for r in ratios):
            return None
        return statistics.geometric_mean(ratios)

    scored = {k: v for k in candidates if (v := score(k)) is not None}
    return max(scored, key=scored.get) if scored else None


def default_goals(default: str | None, reference: str = "ar") -> list[Comparison]:
    """The served default's goals (``goals: default``): the fastest lossless method of the run
    against ``reference``, the plain decoding of its own dtype."""
    tps, name = "tokens_per_s", default or "(no lossless method)"
    return [
        Comparison(f"the default ({name}) >= 2.5x {reference} on HumanEval", tps, name,
                   (reference,), ("humaneval",), 2.5),
        Comparison(f"the default ({name}) >= 1.8x {reference} on chat", tps, name, (reference,),
                   ("sharegpt",), 1.8),
        Comparison(f"the default ({name}) >= 3x HF generate (float32)", tps, name,
                   ("hf_generate",), minimum=3.0),
    ]


def dtype_claims() -> list[Comparison]:
    tps = "tokens_per_s"
    return [Comparison("our AR in bfloat16 vs float32: tokens/s", tps, "ar_bf16", ("ar",)),
            Comparison("the suffix drafter (cold) in bfloat16 vs float32: tokens/s", tps,
                       "suffix_cold_bf16", ("suffix_cold",)),
            Comparison("the suffix drafter (cold) in bfloat16 vs AR in bfloat16: tokens/s", tps,
                       "suffix_cold_bf16", ("ar_bf16",))]
