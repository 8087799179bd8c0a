"""Job: acceptance evaluation of a drafter (+ pre-verifier), and the tuning of PACER and ASD.

Runs the single-process ``specdec.engine.Engine`` (the reference path) in a Ray Data actor pool
over held-out prompts, once per setting, and aggregates the per-request stats: mean accepted
length (tokens committed per target pass), per-position acceptance, the draft-length
distribution, and for ASD the regret spent and the accepted mismatches. The sweep runs on the
``dev`` split, which is disjoint from the benchmark split, and picks by estimated speedup

    speedup ~= committed / (rounds + c_v * drafted)

(one target pass costs 1 decode step plus c_v per verified draft token; c_v = 0.075: a pass
verifying 8 tokens costs about 1.6 decode steps on a CPU; drafter cost ignored):
first every PACER (b, t, rho) of a grid, then ASD's gate g and exception cap M around the
authors' (0.25, 2) at one budget B, on the picked PACER setting. The ASD authors ask that these
controls be frozen on disjoint data; the budget B stays the caller's choice (it is the quality
knob). The pick, PACER's settings plus ``asd_gate`` and ``asd_max_exceptions`` (verification
stays strict unless a request asks for ASD), is evaluated on the benchmark split next to the
fixed windows and logged as ``pacer_defaults.json``.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Literal

import pyarrow as pa
from pydantic import Field

from pipelines.common.config import Device, MlflowSettings, Strict, cli_config
from pipelines.common.formats import check_tokenizer, load_prompts
from pipelines.common.pools import ActorSettings, map_prompts
from pipelines.common.settings import PacerSettings, VerifierSettings, fixed, pacer

ROWS = pa.schema([
    ("setting", pa.string()), ("request", pa.string()), ("committed", pa.int64()),
    ("rounds", pa.int64()), ("drafted", pa.int64()), ("accepted", pa.int64()),
    ("accepted_at", pa.list_(pa.int64())), ("drafted_at", pa.list_(pa.int64())),
    ("draft_lengths", pa.string()), ("regret_spent", pa.float64()), ("exceptions", pa.int64()),
])


class SweepSettings(Strict):
    prompts: str  # the dev split: disjoint from the benchmark
    limit: int | None = 16
    block_sizes: list[int] = [2, 4]
    thresholds: list[float] = [0.3, 0.5, 0.7]
    growths: list[float] = [1.0, 1.1, 1.3]
    # ASD controls, on the picked PACER setting at budget asd_budget; the first pair is the
    # authors' config (the pick on a tie). Empty lists skip the ASD sweep.
    asd_budget: float = Field(4.0, gt=0)
    asd_gates: list[float] = [0.25, 0.5]
    asd_max_exceptions: list[int] = [2, 1, 4]


class EvaluateConfig(Strict):
    target: str = "smollm2-135m"
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    device: Device = "cpu"  # each actor's (actors.num_gpus > 0: its GPU is cuda)
    # positions a request's KV slot holds (the target's plan); None: what memory allows
    max_model_len: int | None = Field(None, ge=1)
    drafter: str  # directory or models:/NAME@ALIAS
    preverifier: str | None = None  # directory or models:/NAME@ALIAS; needed for PACER
    prompts: str  # the benchmark split
    limit: int | None = 16
    max_new_tokens: int = Field(64, ge=1)
    verifier: VerifierSettings = VerifierSettings()
    fixed_gammas: list[int] = [2, 4, 7]
    pacer: PacerSettings | None = None  # evaluate this PACER setting (skipped by a sweep pick)
    sweep: SweepSettings | None = None
    verify_cost_per_token: float = 0.075  # c_v
    actors: ActorSettings = ActorSettings()
    mlflow: MlflowSettings = MlflowSettings()


def grid(s: SweepSettings, max_draft: int) -> list[dict]:
    return [pacer(PacerSettings(block_size=b, threshold=t, growth=r, max_draft=max_draft))
            for b, t, r in itertools.product(s.block_sizes, s.thresholds, s.growths)]


def asd_grid(s: SweepSettings, base: dict) -> list[dict]:
    """``base`` (a PACER setting) verified by ASD at ``s.asd_budget`` under every (g, M)."""
    return [base | {"verify": "asd", "asd_budget": s.asd_budget, "asd_gate": g,
                    "asd_max_exceptions": m}
            for g, m in itertools.product(s.asd_gates, s.asd_max_exceptions)]


def best(results: dict[str, dict]) -> dict:
    """The setting with the highest estimated speedup (the first such on a tie)."""
    return json.loads(max(results, key=lambda s: results[s]["speedup_est"]))


class Evaluator:
    """A Ray Data callable class: runs the engine over each prompt under every setting."""

    def __init__(self, config: dict, refs: dict, settings: list[dict]):
        import torch

        from specdec.engine.engine import Engine
        from specdec.engine.loading import load_pair

        self.cfg = EvaluateConfig.model_validate(config)
        torch.set_num_threads(self.cfg.actors.torch_threads)
        pair = load_pair(self.cfg.target, refs["drafter"], refs["preverifier"], self.cfg.dtype,
                         self.cfg.device, max_model_len=self.cfg.max_model_len)
        self.engine = Engine(pair.target, pair.drafter, pair.preverifier)
        self.settings = settings

    def params(self, setting: dict):
        from specdec.engine.settings import GenerationParams, SpecSettings

        v = self.cfg.verifier  # a setting's own verify / asd_* keys win
        params = v.params()
        spec = SpecSettings(verify=v.name, **({v.name: params} if params else {}))
        spec = spec.updated(**setting)
        return GenerationParams(max_new_tokens=self.cfg.max_new_tokens, spec=spec)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = []
        for rid, prompt in zip(batch.column("id").to_pylist(),
                               batch.column("prompt_ids").to_pylist(), strict=True):
            for setting in self.settings:
                s = self.engine.generate(prompt, self.params(setting)).stats
                rows.append(dict(setting=json.dumps(setting, sort_keys=True), request=rid,
                                 committed=s.committed, rounds=s.rounds, drafted=s.drafted,
                                 accepted=s.accepted, accepted_at=list(s.accepted_at),
                                 drafted_at=list(s.drafted_at),
                                 draft_lengths=json.dumps(dict(s.draft_lengths)),
                                 regret_spent=s.regret_spent, exceptions=s.exceptions))
        return pa.Table.from_pylist(rows, schema=ROWS)


def summarise(table: pa.Table, c_v: float) -> dict[str, dict]:
    """Per setting: mean accepted length, estimated speedup, per-position acceptance, histogram,
    and the mean ASD regret spent and accepted mismatches per request."""
    out: dict[str, dict] = {}
    for row in table.to_pylist():
        agg = out.setdefault(row["setting"], {"requests": 0, "committed": 0, "rounds": 0,
                                              "drafted": 0, "regret_spent": 0.0,
                                              "exceptions": 0, "accepted_at": Counter(),
                                              "drafted_at": Counter(), "draft_lengths": Counter()})
        agg["requests"] += 1
        for key in ("committed", "rounds", "drafted", "regret_spent", "exceptions"):
            agg[key] += row[key]
        agg["accepted_at"].update(dict(enumerate(row["accepted_at"])))
        agg["drafted_at"].update(dict(enumerate(row["drafted_at"])))
        agg["draft_lengths"].update({int(k): v for k, v in json.loads(row["draft_lengths"]).items()})
    for agg in out.values():
        rounds = max(agg["rounds"], 1)
        agg["mean_accepted_length"] = agg["committed"] / rounds
        agg["speedup_est"] = agg["committed"] / (rounds + c_v * agg["drafted"])
        agg["regret_per_request"] = agg["regret_spent"] / agg["requests"]
        agg["exceptions_per_request"] = agg["exceptions"] / agg["requests"]
        n = len(agg["drafted_at"])
        agg["acceptance_at"] = [agg["accepted_at"][i] / max(agg["drafted_at"][i], 1)
                                for i in range(n)]
    return out


def evaluate_settings(cfg: EvaluateConfig, refs: dict, settings: list[dict], prompts_path: str,
                      limit: int | None) -> dict[str, dict]:
    prompts = load_prompts(prompts_path, limit, "evaluate.prompts")
    table = map_prompts(prompts, Evaluator, {"config": cfg.model_dump(), "refs": refs,
                                             "settings": settings}, cfg.actors, ROWS)
    return summarise(table, cfg.verify_cost_per_token)


def resolve_refs(cfg: EvaluateConfig) -> dict:
    from specdec.models.registry import resolve_model_ref

    refs = {"drafter": resolve_model_ref(cfg.drafter, cfg.mlflow.tracking_uri),
            "preverifier": resolve_model_ref(cfg.preverifier, cfg.mlflow.tracking_uri)}
    if (cfg.sweep or cfg.pacer) and not refs["preverifier"]:
        raise ValueError("evaluate: PACER settings (pacer / sweep) need a preverifier")
    return refs


SUMMARY = ("mean_accepted_length", "speedup_est", "regret_per_request", "exceptions_per_request")


def log_summary(results: dict[str, dict], prefix: str) -> None:
    import mlflow

    from pipelines.common.plots import acceptance_figure, histogram_figure
    from pipelines.common.tracking import log_figure

    for i, (setting, agg) in enumerate(sorted(results.items())):
        name = f"{prefix}{i}"
        mlflow.log_metrics({f"{name}.{k}": agg[k] for k in SUMMARY})
        log_figure(acceptance_figure(agg["acceptance_at"], setting), f"{name}-acceptance")
        log_figure(histogram_figure(dict(agg["draft_lengths"]), setting), f"{name}-draft-lengths")
    table = {s: {k: agg[k] for k in (*SUMMARY, "acceptance_at")}
             | {"draft_lengths": dict(agg["draft_lengths"])} for s, agg in results.items()}
    mlflow.log_dict(table, f"{prefix}results.json")


def run(cfg: EvaluateConfig) -> dict:
    import mlflow

    from pipelines.common.tracking import log_params, log_plan, start_run
    from specdec.runtime import RuntimeConfig

    for path in [cfg.prompts] + ([cfg.sweep.prompts] if cfg.sweep else []):
        load_prompts(path, None, "evaluate.prompts")  # fail fast on bad files
        check_tokenizer(path, cfg.target, "evaluate.prompts")
    refs = resolve_refs(cfg)
    out: dict = {}
    with start_run(cfg.mlflow, "evaluate"):
        log_params(cfg.model_dump())
        log_plan(cfg.target, RuntimeConfig(cfg.device, cfg.dtype, max_model_len=cfg.max_model_len))
        settings = [fixed(g) for g in cfg.fixed_gammas]
        if cfg.sweep:
            max_draft = (cfg.pacer or PacerSettings()).max_draft
            swept = evaluate_settings(cfg, refs, grid(cfg.sweep, max_draft), cfg.sweep.prompts,
                                      cfg.sweep.limit)
            log_summary(swept, "sweep")
            picked = best(swept)
            if cfg.sweep.asd_gates and cfg.sweep.asd_max_exceptions:
                tuned = evaluate_settings(cfg, refs, asd_grid(cfg.sweep, picked),
                                          cfg.sweep.prompts, cfg.sweep.limit)
                log_summary(tuned, "asd_sweep")
                out["asd_sweep"] = tuned
                asd = best(tuned)
                picked |= {k: asd[k] for k in ("asd_gate", "asd_max_exceptions")}
            out["pacer_defaults"] = picked
            mlflow.log_dict(picked, "pacer_defaults.json")
            settings.append(picked)
        elif cfg.pacer:
            settings.append(pacer(cfg.pacer))
        out["benchmark"] = evaluate_settings(cfg, refs, settings, cfg.prompts, cfg.limit)
        log_summary(out["benchmark"], "bench")
    return out


def main(argv=None) -> None:
    out = run(cli_config(EvaluateConfig, argv, "Evaluate acceptance; sweep PACER."))
    for setting, agg in sorted(out["benchmark"].items()):
        print(f"{setting}: mean accepted length {agg['mean_accepted_length']:.3f}, "
              f"speedup est {agg['speedup_est']:.3f}")
    if "pacer_defaults" in out:
        print("PACER defaults:", json.dumps(out["pacer_defaults"]))


if __name__ == "__main__":
    main()
