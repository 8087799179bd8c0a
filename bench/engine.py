"""The engine harness: how much faster each method (``bench.methods``) decodes the same target.

    python -m bench.engine --config configs/bench/default.yaml [--quick] [--set KEY=VALUE]

Every method on the same prompts (``bench.config``), in this process, one call at a time (no
Ray: timing must not share cores), interleaved per prompt; a method whose optional model is not
configured is reported as not measured, never estimated. Writes ``results.json`` and
``results.md`` to ``out_dir``; ``--quick``: 3 HumanEval + 2 ShareGPT prompts, once, at most 64
new tokens, into ``quick_out_dir``. Every timed call is journaled as it
completes (``bench.journal``): the same command after an interruption continues where it
stopped, and over a finished journal it only scores and reports it again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.config import BenchmarkConfig, Plan, check
from bench.journal import Journal, fingerprint, inputs
from pipelines.common.config import load_config
from pipelines.common.tracking import git_state

__all__ = ["BenchmarkConfig", "check", "main", "run"]


def measure_all(cfg: BenchmarkConfig, plan: Plan):
    """Load the models, warm every method up, measure; then score the replies."""
    import torch

    from bench import methods as bm
    from bench.metrics import mean_log_likelihood, pass_at_1, summarise

    torch.set_num_threads(cfg.torch_threads)
    models = bm.load_models(plan.refs, {m.engine for m in plan.methods if m.engine}, cfg.dtype,
                            cfg.device)
    run = bm.runners(plan.methods, models, plan.prompts, cfg.max_new_tokens, cfg.warm_outputs)
    for runner in run.values():  # one untimed call each
        runner(plan.prompts[0].ids, cfg.warmup_tokens)
    key = fingerprint(cfg.model_dump(), [p.id for p in plan.prompts],
                      inputs(plan.methods, plan.refs))
    journal = Journal(Path(cfg.out_dir) / "records.jsonl", key)
    if journal.done:
        print(f"benchmark: resuming, {len(journal.done)} calls already in {journal.path}")
    records = bm.measure(plan.prompts, plan.methods, run, cfg.max_new_tokens, cfg.repeats,
                         cfg.progress, journal)
    summary = summarise(records, plan.methods)
    if "humaneval" in summary:
        decode = lambda ids: models.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        for name, score in pass_at_1(records, decode, cfg.humaneval_timeout_s,
                                     cfg.progress).items():
            summary["humaneval"][name]["pass_at_1"] = score
    for (w, name), value in mean_log_likelihood(records, plan.prompts, models.hf_model,
                                                cfg.progress).items():
        summary[w][name]["target_log_likelihood"] = value
    return summary


def comparisons(cfg: BenchmarkConfig, plan: Plan, summary: dict,
                default: str | None) -> dict[str, list[dict]]:
    """The research claims, and the goals of ``default`` (the fastest lossless method) against
    the plain decoding of its own dtype, evaluated on this run's summary."""
    from bench.metrics import claims, default_goals, dtype_claims, evaluate

    # D-PACE's side of the loss comparison: the fixed window that drafts as many tokens per
    # round as dflash_fixed does (B - 1, the engine caps longer windows at that)
    gamma = min(plan.block, plan.dflash_block or plan.block) - 1
    dpace = next((f"fixed_{g}" for g in sorted(cfg.fixed_gammas)
                  if min(g, plan.block - 1) == gamma), None)
    missing = dict(plan.missing)
    if dpace is None:
        missing.setdefault("dflash_fixed",
                           f"not measured: no fixed window drafts {gamma} tokens per round")
    reference = next((m.reference for m in plan.methods if m.name == default), "ar")
    fixed = [f"fixed_{g}" for g in cfg.fixed_gammas]
    asd = {m.name: m.approximates for m in plan.methods if m.approximates}  # -> its strict twin
    made = {"claims": claims(asd, fixed, dpace, rho_grows=plan.pacer.growth > 1.0)
            + dtype_claims(), "goals": default_goals(default, reference)}
    return {kind: [row for c in cs for row in evaluate(c, summary, missing)]
            for kind, cs in made.items()}


def results_dict(cfg: BenchmarkConfig, plan: Plan, summary: dict, command: str,
                 quick: bool) -> dict:
    from bench import report
    from bench.metrics import fastest_lossless

    meta = {"date": report.now(), "command": command, "quick": quick,
            "machine": report.machine(cfg.device), "git": git_state(),
            **{k: getattr(cfg, k) for k in ("target", "dtype", "drafter", "preverifier",
                                            "drafter_dflash", "preverifier_no_position",
                                            "prompts", "max_new_tokens", "repeats", "seed",
                                            "pacer_defaults")},
            "pacer": plan.pacer.model_dump(), "asd": plan.asd.model_dump(),
            "drafter_block_size": plan.block}
    methods = {m.name: {"engine": m.engine or "HF generate", "settings": m.settings,
                        "strict": m.strict, "note": m.note}
               for m in plan.methods}
    workloads = {w: {"prompts": [p.id for p in plan.prompts if p.workload == w],
                     "methods": per_method} for w, per_method in summary.items()}
    # the served default: the fastest lossless method that our engine (so the server) runs
    default = fastest_lossless(summary, [m.name for m in plan.methods
                                         if m.strict and m.engine not in (None, "plain")])
    return {"meta": meta, "methods": methods, "not_measured": plan.missing,
            "fastest_lossless": default, "workloads": workloads,
            **comparisons(cfg, plan, summary, default)}


def run(cfg: BenchmarkConfig, command: str = "", quick: bool = False) -> dict:
    from bench.report import markdown, write

    plan = check(cfg)
    results = results_dict(cfg, plan, measure_all(cfg, plan), command, quick)
    write(Path(cfg.out_dir), "results", results, markdown(results))
    return results


def main(argv=None) -> None:
    from bench.report import command

    ap = argparse.ArgumentParser(description="Engine benchmark: every method on the same prompts.")
    ap.add_argument("--config", required=True, help="YAML file (configs/bench/default.yaml)")
    ap.add_argument("--quick", action="store_true",
                    help="3 HumanEval + 2 ShareGPT prompts, 1 repeat, <= 64 tokens, quick_out_dir")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (dotted; YAML value), e.g. --set repeats=1")
    args = ap.parse_args(argv)
    cfg = load_config(BenchmarkConfig, args.config, args.set)
    cfg = cfg.quick() if args.quick else cfg
    run(cfg, command("bench.engine", argv), args.quick)
    print((Path(cfg.out_dir) / "results.md").read_text())


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError) as err:  # bad input: the message says what and where
        sys.exit(f"benchmark: {err}")
