"""The engine benchmark end to end on the tiny pair (float64, in-process, no Ray), its checks of
bad input before any model loads, and the HumanEval scorer on a real problem."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from bench import config as bench_config
from bench import engine, humaneval
from bench import methods as bench_methods
from bench import metrics as bench_metrics
from pipelines.common.config import load_config
from pipelines.common.formats import CORPUS_SCHEMA
from pipelines.common.tables import write_table
from specdec.models.preverifier import PreVerifier, PreVerifierConfig
from specdec.models.tiny import byte_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "bench" / "tiny.yaml"
HUMANEVAL_IDS = ["HumanEval/10", "HumanEval/2", "HumanEval/0"]  # the subset is HumanEval/0, /2


def row(rid: str, source: str, split: str, text: str) -> dict:
    tok = byte_tokenizer()
    ids = list(tok.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True, tokenize=True, return_dict=False))
    return dict(id=rid, source=source, split=split, prompt_ids=ids, input_ids=ids,
                prompt_len=len(ids))


def write_bench_inputs(out: Path) -> None:
    """A small benchmark split (short prompts: the tiny models' context is 512 bytes), a
    training row that must never be picked, and an untrained no-position pre-verifier."""
    problems = humaneval.problems()
    rows = [row(t, "humaneval", "benchmark", problems[t]["prompt"][:150]) for t in HUMANEVAL_IDS]
    rows += [row(f"chat-{i}", "sharegpt", "benchmark", f"say hello to {i}, hello {i}")
             for i in range(3)]
    rows.append(row("train-0", "sharegpt", "train", "training data"))
    write_table(pa.Table.from_pylist(rows, schema=CORPUS_SCHEMA), out / "benchmark.parquet")
    PreVerifier(PreVerifierConfig(input_size=64, use_position=False)).save(
        out / "preverifier-no-position")


@pytest.fixture(scope="module")
def env(tiny_llama, tmp_path_factory, store):
    out = tmp_path_factory.mktemp("bench")
    write_bench_inputs(out)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_TINY", str(Path(tiny_llama["target"]).parent))
        mp.setenv("SPECDEC_TINY_BENCH", str(out))
        mp.setenv("MLFLOW_TRACKING_URI", store["tracking_uri"])
        yield out


def tiny_config(*overrides: str) -> engine.BenchmarkConfig:
    return load_config(engine.BenchmarkConfig, TINY, list(overrides))


@pytest.fixture(scope="module")
def results(env):
    return engine.run(tiny_config(), "test", quick=False)


def test_writes_results_json_and_markdown(results, env):
    out = env / "out"
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["workloads"].keys() == {"humaneval", "sharegpt"}
    md = (out / "results.md").read_text()
    assert "### humaneval (2 prompts)" in md and "| pacer |" in md and "## Goals" in md
    meta = on_disk["meta"]
    assert meta["machine"]["cores"] and meta["machine"]["torch"] and meta["git"]["commit"]


def test_fixed_subsets_from_the_benchmark_split_only(results):
    prompts = {w: x["prompts"] for w, x in results["workloads"].items()}
    assert prompts["humaneval"] == ["HumanEval/0", "HumanEval/2"]  # by task number
    assert len(prompts["sharegpt"]) == 2 and "train-0" not in prompts["sharegpt"]


def test_every_strict_method_reproduces_ar(results):
    for w, x in results["workloads"].items():
        methods = x["methods"]
        assert {"ar", "hf_generate", "hf_prompt_lookup", "ngram", "fixed_15", "pacer",
                "pacer_no_position", "pacer_rho_ablation", "hybrid_pacer_asd_4", "dflash_fixed",
                "suffix_cold", "suffix_warm", "suffix_cold_bf16", "hybrid_pacer", "suffix_fixed_2",
                "suffix_pacer"} <= methods.keys()
        for name, m in methods.items():
            assert m["tokens"] > 0, (w, name)
            if m["strict"]:
                assert m["same_as_ar"] == 1.0 and m["lossless"], (w, name)
        assert methods["suffix_cold_bf16"]["reference"] == "ar_bf16"
    assert results["not_measured"] == {}


def test_metrics_are_consistent(results):
    he = results["workloads"]["humaneval"]["methods"]
    assert he["ar"]["ratio_to_ar"] == pytest.approx(1.0)
    assert he["ar"]["mean_accepted_length"] == pytest.approx(1.0)
    assert he["ar"]["target_passes_per_100_tokens"] >= 100
    assert max(he["fixed_15"]["draft_lengths"]) <= 7  # block 8 drafts at most 7 per round
    assert "capped at B-1 = 7" in results["methods"]["fixed_15"]["note"]
    pacer = he["pacer"]
    assert sum(pacer["time_share"].values()) == pytest.approx(1.0)
    assert pacer["time_share"]["preverifier"] > 0
    assert all(0 <= a <= 1 for a in pacer["acceptance_at"])
    for name, m in he.items():  # random models write no working code
        assert m["pass_at_1"] == 0.0, name
    assert he["hybrid_pacer_asd_2"]["regret_per_request"] >= 0
    assert he["suffix_pacer"]["time_share"]["preverifier"] > 0  # the acceptance model ran


def test_each_output_is_scored_by_the_target(results):
    for w, x in results["workloads"].items():
        methods = x["methods"]
        assert methods["ar"]["target_log_likelihood"] < 0, w
        for name, m in methods.items():  # the same tokens score the same
            if m["strict"]:
                ref = methods[m["reference"]]["target_log_likelihood"]
                assert m["target_log_likelihood"] == pytest.approx(ref, abs=1e-9), (w, name)
        assert methods["ar_bf16"]["target_log_likelihood"] is not None
        assert sum(methods["hybrid_pacer"]["draft_sources"].values()) > 0


def test_the_log_likelihood_of_greedy_tokens_is_each_steps_maximum(tiny_llama):
    import torch

    from bench.metrics import token_log_likelihoods
    from specdec.models.target import TargetModel

    model = TargetModel.from_pretrained(tiny_llama["target"], dtype="float64",
                                        backend="transformers").model
    prompt = [5, 17, 99, 3]
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                             min_new_tokens=6, eos_token_id=None)
        tokens = out[0, len(prompt):].tolist()
        logp = torch.log_softmax(model(out).logits[0, len(prompt) - 1: -1], dim=-1)
    picked = token_log_likelihoods(model, prompt, tokens)
    assert picked == pytest.approx(logp.max(dim=-1).values.tolist(), abs=1e-9)
    other = [(tokens[0] + 1) % logp.shape[-1]]  # not the greedy first token: less likely
    assert token_log_likelihoods(model, prompt, other)[0] < picked[0]


def test_asd_is_compared_with_the_strict_method_it_approximates(results):
    rows = {(r["title"], r["workload"]): r for r in results["claims"]}
    for asd, strict in [("hybrid_pacer_asd_2", "hybrid_pacer"),
                        ("hybrid_pacer_asd_4", "hybrid_pacer")]:
        row = rows[(f"{asd} vs {strict} strict: tokens/s", "humaneval")]
        assert row["denominator"] == strict and row["value"] is not None
    assert results["methods"]["hybrid_pacer_asd_4"]["settings"]["verify"] == "asd"


def test_the_default_is_the_fastest_lossless_method_on_every_workload():
    ok = {"lossless": True}
    summary = {"humaneval": {"ar": {"ratio_to_ar": 1.0}, "a": {"ratio_to_ar": 3.0, **ok},
                             "b": {"ratio_to_ar": 2.0, **ok}, "c": {"ratio_to_ar": 9.0, **ok},
                             "d": {"ratio_to_ar": 9.0, **ok}},
               "sharegpt": {"ar": {"ratio_to_ar": 1.0}, "a": {"ratio_to_ar": 1.0, **ok},
                            "b": {"ratio_to_ar": 1.6, **ok},  # c: not measured on chat
                            "d": {"ratio_to_ar": 9.0, "lossless": False}}}  # d: broken
    assert bench_metrics.fastest_lossless(summary, ["a", "b", "c", "d"]) == "b"  # √3.2 > √3
    assert bench_metrics.fastest_lossless(summary, ["c", "d"]) is None
    for tps in ({"humaneval": 30.0, "sharegpt": 20.0}, {"humaneval": 10.0, "sharegpt": 10.0}):
        have = {w: {"ar": {"tokens_per_s": 10.0}, "hf_generate": {"tokens_per_s": 8.0},
                    "b": {"tokens_per_s": tps[w]}} for w in tps}
        rows = [r for c in bench_metrics.default_goals("b")
                for r in bench_metrics.evaluate(c, have, {})]
        assert [r["workload"] for r in rows] == ["humaneval", "sharegpt", "humaneval", "sharegpt"]
        assert [r["passed"] for r in rows] == ([True, True, True, False] if tps["humaneval"] == 30
                                               else [False, False, False, False])
    # a bfloat16 default is held to bfloat16 AR, its own dtype's plain decoding
    have = {"humaneval": {"ar": {"tokens_per_s": 10.0}, "ar_bf16": {"tokens_per_s": 20.0},
                          "b": {"tokens_per_s": 30.0}}}
    row = bench_metrics.evaluate(bench_metrics.default_goals("b", "ar_bf16")[0], have, {})[0]
    assert row["denominator"] == "ar_bf16" and row["value"] == pytest.approx(1.5)


def test_a_strict_method_is_checked_against_the_plain_decoding_of_its_dtype():
    def rec(method, tokens):
        return bench_methods.Record(method, "w", "p", 0, tokens, 1.0, None)

    methods = [bench_methods.Method("ar", None), bench_methods.Method("ar_bf16", None, strict=False),
               bench_methods.Method("sd_bf16", None, reference="ar_bf16"),
               bench_methods.Method("sd", None)]
    records = [rec("ar", [1, 2, 3]), rec("ar_bf16", [1, 2, 4]), rec("sd_bf16", [1, 2, 4]),
               rec("sd", [1, 2, 4])]
    got = bench_metrics.summarise(records, methods)["w"]
    assert got["sd_bf16"]["lossless"] and got["sd_bf16"]["reference"] == "ar_bf16"
    assert not got["sd"]["lossless"]  # float32 SD that decodes bf16 AR's tokens is broken
    assert got["ar_bf16"]["same_as_ar"] == 0.0 and "lossless" not in got["ar_bf16"]


def test_claims_and_goals_are_measured_ratios(results):
    default = results["fastest_lossless"]  # the goals are the served default's
    assert default is not None and results["methods"][default]["strict"]
    goal = results["goals"][0]
    assert goal["numerator"] == default and goal["workload"] == "humaneval"
    assert goal["value"] == pytest.approx(
        results["workloads"]["humaneval"]["methods"][default]["ratio_to_ar"])
    assert goal["passed"] == (goal["value"] >= 2.5)
    best = next(r for r in results["claims"] if "best fixed" in r["title"]
                and r["workload"] == "sharegpt")
    fixed = {k: m["tokens_per_s"] for k, m in results["workloads"]["sharegpt"]["methods"].items()
             if k.startswith("fixed_")}
    assert best["denominator"] == max(fixed, key=fixed.get)
    # the stand-in DFlash drafter is the D-PACE checkpoint: the same window gives the same length
    dpace = [r for r in results["claims"] if r["title"].startswith("D-PACE")]
    assert len(dpace) == 2 and all(r["numerator"] == "fixed_8" for r in dpace)
    assert all(r["value"] == 1.0 for r in dpace)


def test_missing_optional_model_is_reported_not_measured(env):
    cfg = tiny_config("methods=[ar, fixed_4, pacer_no_position, dflash_fixed]",
                      f"drafter_dflash={env / 'no-such-drafter'}", "preverifier_no_position=null",
                      f"out_dir={env / 'out-missing'}")
    results = engine.run(cfg, "test")
    why = results["not_measured"]
    assert why["dflash_fixed"].startswith("not measured: missing drafter_dflash (")
    assert why["pacer_no_position"] == ("not measured: missing preverifier_no_position "
                                        "(not configured)")
    for x in results["workloads"].values():
        assert set(x["methods"]) == {"ar", "fixed_4"}
    rows = [r for r in results["claims"] + results["goals"] if "D-PACE" in r["title"]]
    assert rows and all(r["value"] is None and "missing drafter_dflash" in r["note"] for r in rows)
    md = (env / "out-missing" / "results.md").read_text()
    assert "missing drafter_dflash" in md and "missing preverifier_no_position" in md


# ---- bad input fails before any model loads -------------------------------------------------
@pytest.fixture
def no_models(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(bench_methods, "load_models", refuse)


def test_unknown_method_fails_fast(env, no_models):
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['warp'\]"):
        engine.run(tiny_config("methods=[ar, warp]"))


def test_missing_files_fail_fast(env, no_models, tmp_path):
    with pytest.raises(FileNotFoundError, match="benchmark.drafter: .*nope does not exist"):
        engine.run(tiny_config(f"drafter={tmp_path / 'nope'}"))
    with pytest.raises(FileNotFoundError, match="pacer_defaults"):
        engine.run(tiny_config(f"pacer_defaults={tmp_path / 'p.json'}"))
    with pytest.raises(FileNotFoundError, match="benchmark.prompts"):
        engine.run(tiny_config(f"prompts={tmp_path / 'p.parquet'}"))
    with pytest.raises(ValueError, match="sharegpt.count: 9 asked for"):
        engine.run(tiny_config("workloads.sharegpt.count=9"))
    with pytest.raises(ValueError, match="workloadz: unknown key"):
        tiny_config("workloadz=1")


def test_ablation_preverifier_must_lack_the_position_embedding(env, no_models, tmp_path):
    PreVerifier(PreVerifierConfig(input_size=64)).save(tmp_path / "with-position")
    with pytest.raises(ValueError, match="uses the position embedding"):
        engine.check(tiny_config(f"preverifier_no_position={tmp_path / 'with-position'}"))


def test_default_config_without_trained_pair_fails_clearly(monkeypatch, tmp_path, no_models):
    monkeypatch.chdir(tmp_path)  # no artifacts/ here, whatever the repository holds
    with pytest.raises(FileNotFoundError, match="artifacts/smollm2-135m/drafter does not exist"):
        engine.main(["--config", str(ROOT / "configs/bench/default.yaml"), "--quick"])


def test_quick_is_small_and_writes_elsewhere(env):
    cfg = tiny_config("workloads.humaneval.count=40", "repeats=3", "max_new_tokens=128").quick()
    assert (cfg.workloads.humaneval.count, cfg.workloads.sharegpt.count) == (3, 2)
    assert cfg.repeats == 1 and cfg.max_new_tokens == 64
    assert cfg.out_dir == str(env / "out-quick")


def test_pacer_defaults_file_overrides_the_config(env, tmp_path):
    path = tmp_path / "pacer_defaults.json"
    path.write_text(json.dumps({"policy": "pacer", "block_size": 3, "threshold": 0.7,
                                "growth": 1.3, "max_draft": 16}))
    cfg = tiny_config(f"pacer_defaults={path}", "asd.gate=0.1")
    p = bench_config.pacer_settings(cfg)
    assert (p.block_size, p.threshold, p.growth, p.max_draft) == (3, 0.7, 1.3, 16)
    assert bench_config.asd_settings(cfg).gate == 0.1  # no ASD pick in the file: the config's
    tuned = json.loads(path.read_text()) | {"asd_gate": 0.5, "asd_max_exceptions": 4}
    path.write_text(json.dumps(tuned))
    asd = bench_config.asd_settings(cfg)
    assert (asd.gate, asd.max_exceptions, asd.budgets) == (0.5, 4, cfg.asd.budgets)


def test_rho_ablation_runs_the_other_side_of_pacers_own_rho():
    from pipelines.common.settings import PacerSettings

    grows, constant = PacerSettings(growth=1.3), PacerSettings(growth=1.0)
    assert bench_methods.rho_ablation(grows, 1.1).growth == 1.0
    assert bench_methods.rho_ablation(constant, 1.1).growth == 1.1
    for rho_grows, num, den in [(True, "pacer", "pacer_rho_ablation"),
                                (False, "pacer_rho_ablation", "pacer")]:
        c = next(c for c in bench_metrics.claims({}, [], None, rho_grows) if "rho" in c.title)
        assert (c.num, c.den) == (num, (den,))


def test_the_journal_key_follows_the_checkpoints_contents(tmp_path):
    from bench.journal import fingerprint, inputs

    ckpt = tmp_path / "drafter"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"one")
    config, refs = {"drafter": str(ckpt)}, {"drafter": str(ckpt), "target": "smollm2-135m"}

    def key(threshold: float) -> str:
        method = bench_methods.Method("pacer", "main", {"policy": "pacer", "threshold": threshold})
        return fingerprint(config, ["p0"], inputs([method], refs))

    first = key(0.5)
    assert key(0.5) == first
    assert key(0.7) != first  # a new sweep pick behind the same pacer_defaults path
    (ckpt / "model.safetensors").write_bytes(b"two")  # retrained, same path
    assert key(0.5) != first


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "bench").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_bench_configs_parse(path, monkeypatch):
    monkeypatch.setenv("SPECDEC_TINY", "/tmp/tiny")
    monkeypatch.setenv("SPECDEC_TINY_BENCH", "/tmp/tiny-bench")
    assert "$" not in load_config(engine.BenchmarkConfig, path).model_dump_json()


# ---- HumanEval pass@1 -----------------------------------------------------------------------
def test_humaneval_scorer_on_a_real_problem():
    problem = humaneval.problems()["HumanEval/0"]
    assert humaneval.passes(problem, problem["canonical_solution"], timeout_s=5)
    chat = ("Here is the function:\n```python\ndef has_close_elements(numbers, threshold):\n"
            "    return any(abs(a - b) < threshold\n"
            "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```\nDone.")
    assert humaneval.passes(problem, chat, timeout_s=5)
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    assert not humaneval.passes(problem, wrong, timeout_s=5)
    assert not humaneval.passes(problem, "    while True:\n        pass\n", timeout_s=1)


def test_program_takes_the_first_fenced_block_even_unclosed():
    problem = {"entry_point": "f", "prompt": "def f(x):\n    \"\"\"doc\"\"\"\n"}
    assert humaneval.program(problem, "x\n```py\ndef f(x):\n    return 1") == \
        "\ndef f(x):\n    return 1"
    assert humaneval.program(problem, "    return x\n") == "    return x\n"


def test_a_rerun_resumes_from_the_journal(results, env):
    """The module's run journaled every call; cut its last line as an interruption would, and a
    rerun measures only that call again and reports the same tokens."""
    journal = env / "out" / "records.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    calls = len(lines) - 1
    journal.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    seen = []
    original = bench_methods.timed_call

    def counting(*args):
        seen.append(args[1].name)
        return original(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench_methods, "timed_call", counting)
        again = engine.run(tiny_config(), "test", quick=False)
    assert len(seen) == 1  # only the cut call ran again
    assert len(journal.read_text().splitlines()) - 1 == calls
    for w, x in again["workloads"].items():
        for name, m in x["methods"].items():
            assert m["same_as_ar"] == results["workloads"][w]["methods"][name]["same_as_ar"]


def test_a_changed_config_does_not_reuse_the_journal(env, tmp_path):
    from bench.journal import Journal

    path = tmp_path / "records.jsonl"
    Journal(path, "a")
    path.write_text(path.read_text() + "{}\n")
    assert not Journal(path, "b").done and path.with_suffix(".stale").exists()


def test_recorded_warm_outputs_cover_every_prompt(tmp_path):
    prompts = [bench_methods.Prompt("HumanEval/0", "humaneval", [1, 2]),
               bench_methods.Prompt("sharegpt/7", "sharegpt", [3])]
    path = tmp_path / "greedy.json"
    path.write_text(json.dumps({"HumanEval/0": [5, 6], "sharegpt/7": [7], "extra": [8]}))
    assert bench_methods.recorded_outputs(str(path), prompts) == {"HumanEval/0": [5, 6],
                                                                 "sharegpt/7": [7]}
    path.write_text(json.dumps({"HumanEval/0": [5, 6]}))
    with pytest.raises(ValueError, match="sharegpt/7"):
        bench_methods.recorded_outputs(str(path), prompts)
