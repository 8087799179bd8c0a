"""The engine harness's config and its checks: everything is checked before any model loads.

``BenchmarkConfig`` is the strict schema of ``configs/bench/*.yaml``; ``check`` turns one into a
``Plan``: local model paths, the methods that run and those that do not (with the reason), the
prompts (the corpus's ``benchmark`` split only: the first HumanEval problems by task number and a
seeded choice of ShareGPT ones), PACER's and ASD's settings (the evaluate sweep's
``pacer_defaults.json`` picks win when named). Bad input fails here, naming the config key.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa
from pydantic import Field, create_model, model_serializer

from bench import humaneval
from bench.methods import Method, Prompt, method_table
from pipelines.common.config import MlflowSettings, Strict, default_output
from pipelines.common.settings import PacerSettings
from pipelines.common.tables import read_table
from specdec.engine.settings import FLAT, flat_knob
from specdec.knobs import pydantic_field

PROMPTS = pa.schema([("id", pa.string()), ("source", pa.string()), ("split", pa.string()),
                     ("prompt_ids", pa.list_(pa.int32()))])
QUICK = {"humaneval": 3, "sharegpt": 2, "max_new_tokens": 64}  # and 1 repeat


class Workload(Strict):
    count: int = Field(40, ge=0)  # 0 leaves the workload out


class Workloads(Strict):
    humaneval: Workload = Workload()  # the first `count` problems by task number
    sharegpt: Workload = Workload()  # a seeded choice from the held-out benchmark split


# ASD's knobs but its budget B (swept: ``budgets``), by flat key (asd_gate -> gate, ...)
ASD_FLAT = {key: name for key, ((section, name), *_) in FLAT.items()
            if section == "asd" and name != "budget"}
HASHED = ("gate", "max_exceptions")  # the ASD knobs every journal of before hashed


class _Asd(Strict):
    budgets: list[float] = [2.0, 4.0, 8.0]  # B, one method each

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """Knobs other than ``HASHED`` are dumped only when set, so the journal fingerprint of a
        config that leaves them out is the one it had before they existed."""
        return {k: v for k, v in handler(self).items()
                if k in HASHED or k == "budgets" or v is not None}

    def knobs(self) -> dict:
        """The ASD methods' flat settings but the budget (unset knobs: the config's default)."""
        return {key: getattr(self, name) for key, name in ASD_FLAT.items()
                if getattr(self, name) is not None}


# g and M with ASD's defaults (the authors'; pacer_defaults.json's pick wins), every other ASD
# knob optional; each with its AsdConfig type, bounds and help
AsdSettings = create_model("AsdSettings", __base__=_Asd, **{
    name: pydantic_field(*flat_knob(key), optional=name not in HASHED)
    for key, name in ASD_FLAT.items()})


class BenchmarkConfig(Strict):
    target: str = "smollm2-135m"
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    device: str = "cpu"
    torch_threads: int = Field(2, ge=1)
    drafter: str = "artifacts/smollm2-135m/drafter"  # a block-drafter checkpoint (D-PACE)
    preverifier: str = "artifacts/smollm2-135m/preverifier"  # a checkpoint, or "untrained"
    drafter_dflash: str | None = None  # the DFlash-loss drafter (D-PACE claim)
    preverifier_no_position: str | None = None  # trained without position embedding (ablation)
    # the suffix drafter's offline index (a directory or models:/NAME@ALIAS); None: local tree only
    suffix_index: str | None = None
    # suffix_warm's warm-up: the target's greedy outputs by prompt id (JSON {id: [token ids]});
    # None: computed untimed with the plain engine
    warm_outputs: str | None = None
    # the suffix drafter's acceptance model (a directory or models:/NAME@ALIAS; None: no
    # suffix_pacer) and the PACER setting its rule runs with
    acceptance: str | None = None
    acceptance_pacer: PacerSettings = PacerSettings()
    # the suffix walk's stop for the suffix and hybrid methods (None: the knob's default)
    suffix_min_prob: float | None = Field(None, gt=0, le=1)
    prompts: str = Field(default_factory=lambda: str(default_output("corpus") / "benchmark.parquet"))
    workloads: Workloads = Workloads()
    seed: int = 0  # the ShareGPT choice
    max_new_tokens: int = Field(128, ge=1)
    repeats: int = Field(3, ge=1)
    warmup_tokens: int = Field(8, ge=1)  # one untimed call per method first
    methods: list[str] | None = None  # None: all; ``ar`` is always run (the baseline)
    fixed_gammas: list[int] = [2, 4, 8, 15]
    ngram_gamma: int = Field(4, ge=1)
    prompt_lookup_tokens: int = Field(10, ge=1)  # HF prompt_lookup_num_tokens
    heuristic_initial: int = Field(5, ge=1)
    pacer: PacerSettings = PacerSettings()
    pacer_defaults: str | None = None  # pacer_defaults.json from the evaluate sweep: overrides pacer
    # rho of the rho ablation's growing side when PACER's own setting has rho = 1
    ablation_growth: float = Field(1.1, gt=1)
    asd: AsdSettings = AsdSettings()
    humaneval_timeout_s: float = Field(5.0, gt=0)
    out_dir: str = "docs/benchmarks/engine"
    quick_out_dir: str = "docs/benchmarks/engine-quick"
    progress: bool = True
    mlflow: MlflowSettings = MlflowSettings()

    def quick(self) -> BenchmarkConfig:
        data = self.model_dump()
        for w in ("humaneval", "sharegpt"):
            data["workloads"][w]["count"] = min(QUICK[w], data["workloads"][w]["count"])
        data |= {"repeats": 1, "max_new_tokens": min(QUICK["max_new_tokens"], self.max_new_tokens),
                 "out_dir": self.quick_out_dir}
        return BenchmarkConfig.model_validate(data)


@dataclass(frozen=True)
class Plan:
    """Everything checked before any model loads."""

    refs: dict[str, str | None]  # local paths; None for an optional model that is absent
    methods: list[Method]  # those that will run
    missing: dict[str, str]  # method -> "not measured: missing ..."
    prompts: list[Prompt]
    pacer: PacerSettings
    asd: AsdSettings
    block: int  # B of the main block drafter (it drafts at most B - 1 tokens per round)
    dflash_block: int | None  # B of the DFlash-loss drafter, when present


# ---- checks, before any model loads ---------------------------------------------------------
def tuned(cfg: BenchmarkConfig) -> dict:
    """The evaluate sweep's picks (``pacer_defaults``), or {} when the config names none."""
    if not cfg.pacer_defaults:
        return {}
    path = Path(cfg.pacer_defaults)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark.pacer_defaults: {path} does not exist")
    return json.loads(path.read_text())


def pacer_settings(cfg: BenchmarkConfig) -> PacerSettings:
    found = tuned(cfg)
    return PacerSettings.model_validate(cfg.pacer.model_dump() | {
        k: found[k] for k in PacerSettings.model_fields if k in found})


def asd_settings(cfg: BenchmarkConfig) -> AsdSettings:
    """The config's ASD controls, with g and M from the sweep's picks when it made them."""
    found = tuned(cfg)
    return AsdSettings.model_validate(cfg.asd.model_dump() | {ours: found[k] for k, ours
                                                              in ASD_FLAT.items() if k in found})


def check_methods(cfg: BenchmarkConfig) -> list[str]:
    names = [m.name for m in method_table(cfg, cfg.pacer, cfg.asd)]
    chosen = cfg.methods if cfg.methods is not None else names
    unknown = [m for m in chosen if m not in names]
    if unknown:
        raise ValueError(f"benchmark.methods: unknown method(s) {unknown}; choose from {names}")
    return ["ar", *[m for m in chosen if m != "ar"]]


def required_ref(key: str, ref: str, tracking_uri: str | None) -> str:
    from specdec.models.block_drafter import BlockDrafter
    from specdec.models.preverifier import UNTRAINED
    from specdec.models.registry import resolve_model_ref

    if key in ("preverifier", "acceptance") and ref == UNTRAINED:
        return ref
    path = resolve_model_ref(ref, tracking_uri)
    if not Path(path).exists():
        raise FileNotFoundError(f"benchmark.{key}: {path} does not exist (train the default "
                                f"pair with `make train-default`, or point {key} at a checkpoint)")
    drafter = "drafter" in key
    if not (BlockDrafter.is_checkpoint(path) if drafter
            else (Path(path) / "preverifier.json").is_file()):
        raise ValueError(f"benchmark.{key}: {path} is not a "
                         f"{'block-drafter' if drafter else 'pre-verifier'} checkpoint")
    return path


def optional_ref(key: str, ref: str | None, tracking_uri: str | None) -> tuple[str | None, str]:
    """(path, "") when present; (None, why) when not configured, not registered or not there."""
    from specdec.models.acceptance import UNTRAINED
    from specdec.models.registry import resolve_model_ref

    if not ref:
        return None, f"not measured: missing {key} (not configured)"
    if ref == UNTRAINED and key == "acceptance":  # random weights: nothing to resolve
        return ref, ""
    try:
        path = resolve_model_ref(ref, tracking_uri)
    except FileNotFoundError:  # not in the MLflow registry
        return None, f"not measured: missing {key} ({ref} is not registered)"
    if not Path(path).exists():
        return None, f"not measured: missing {key} ({ref} does not exist)"
    path = required_ref(key, path, tracking_uri)
    if key == "preverifier_no_position":
        use_position = json.loads((Path(path) / "preverifier.json").read_text()).get("use_position")
        if use_position is not False:
            raise ValueError(f"benchmark.{key}: {path} uses the position embedding "
                             "(use_position is not false); it cannot serve as the ablation")
    return path, ""


def suffix_index_ref(ref: str | None, tracking_uri: str | None) -> str | None:
    """The index as a local directory, read once here so a bad one fails before any model."""
    from specdec.models.registry import resolve_model_ref
    from specdec.models.suffix_index import SuffixIndex

    if not ref:
        return None
    path = resolve_model_ref(ref, tracking_uri)
    try:
        SuffixIndex.load(path)
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"benchmark.suffix_index: {err}") from None
    return path


def check_target(ref: str) -> None:
    from specdec.models.sources import NAMED_SOURCES

    if ref not in NAMED_SOURCES and not (Path(ref) / "config.json").is_file():
        raise FileNotFoundError(f"benchmark.target: {ref!r} is neither a named source "
                                f"({sorted(NAMED_SOURCES)}) nor a model directory")


def load_prompts(cfg: BenchmarkConfig) -> list[Prompt]:
    """The fixed HumanEval subset and the ShareGPT choice, from the benchmark split only."""
    rows = [r for r in read_table(cfg.prompts, PROMPTS, "benchmark.prompts").to_pylist()
            if r["split"] == "benchmark"]
    by_source = {s: sorted((r for r in rows if r["source"] == s), key=lambda r: r["id"])
                 for s in ("humaneval", "sharegpt")}
    for w, have in by_source.items():
        want = getattr(cfg.workloads, w).count
        if len(have) < want:
            raise ValueError(f"benchmark.workloads.{w}.count: {want} asked for, but "
                             f"{cfg.prompts} has {len(have)} {w} rows in the benchmark split")
    bad = [r["id"] for r in by_source["humaneval"] if r["id"] not in humaneval.problems()]
    if bad:
        raise ValueError(f"benchmark.prompts: HumanEval rows {bad[:3]} are not HumanEval task ids")
    he = sorted(by_source["humaneval"], key=lambda r: humaneval.task_number(r["id"]))
    he = he[: cfg.workloads.humaneval.count]
    chat = random.Random(cfg.seed).sample(by_source["sharegpt"], cfg.workloads.sharegpt.count)
    prompts = [Prompt(r["id"], r["source"], list(r["prompt_ids"])) for r in he + chat]
    if not prompts:
        raise ValueError("benchmark.workloads: no prompts asked for")
    return prompts


def check(cfg: BenchmarkConfig) -> Plan:
    """Every input, checked before any model loads; returns what will run."""
    from pipelines.common.formats import check_tokenizer
    from specdec.models.block_drafter import BlockDrafter

    names = check_methods(cfg)
    check_target(cfg.target)
    uri = cfg.mlflow.tracking_uri
    refs = {"target": cfg.target, "drafter": required_ref("drafter", cfg.drafter, uri),
            "preverifier": required_ref("preverifier", cfg.preverifier, uri)}
    p, asd = pacer_settings(cfg), asd_settings(cfg)
    why = {}
    for key in ("drafter_dflash", "preverifier_no_position", "acceptance"):
        refs[key], why[key] = optional_ref(key, getattr(cfg, key), uri)
    refs["suffix_index"] = suffix_index_ref(cfg.suffix_index, uri)
    prompts = load_prompts(cfg)
    check_tokenizer(cfg.prompts, cfg.target, "benchmark.prompts")
    block = BlockDrafter.read_config(refs["drafter"])[0].block_size
    dflash = refs["drafter_dflash"] and BlockDrafter.read_config(refs["drafter_dflash"])[0].block_size
    methods = [m for m in method_table(cfg, p, asd, block, dflash and min(dflash, block))
               if m.name in names]
    missing = {m.name: why[m.needs] for m in methods if m.needs and refs[m.needs] is None}
    return Plan(refs, [m for m in methods if m.name not in missing], missing, prompts, p, asd,
                block, dflash or None)
