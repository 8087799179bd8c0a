"""The specdec command line, run in-process; the real SmolLM2 target in one slow test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specdec.cli import main


def test_models_tiny_then_generate_json(tmp_path, capsys):
    assert main(["models", "tiny", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    code = main(["generate", "--target", str(tmp_path / "m/target"), "--drafter",
                 str(tmp_path / "m/drafter"), "--gamma", "3", "--max-new-tokens", "12",
                 "--dtype", "float64", "--prompt", "hello", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == out["stats"]["committed"] <= 12
    assert set(out) == {"text", "token_ids", "finish_reason", "stats", "plan"}
    plan = out["plan"]  # the target's resolved runtime plan
    assert (plan["dtype"], plan["numerics"], plan["device"]) == ("float64", "float64", "cpu")
    assert plan["memory"]["kv_pool"] > 0 and plan["memory"]["fits"]


@pytest.mark.parametrize("args,match", [
    (["--prompt", "  "], "empty"),
    (["--prompt", "x", "--gamma", "0"], "gamma"),
    (["--prompt", "x", "--verify", "asd", "--asd-budget", "-1"], "budget"),
    (["--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens"),
    (["--prompt", "x", "--policy", "pacer"], "preverifier"),
])
def test_bad_input_exits_2_with_a_message(tiny_llama, capsys, args, match):
    assert main(["generate", "--target", tiny_llama["target"], *args]) == 2
    assert match in capsys.readouterr().err


def test_unknown_policy_is_rejected_by_the_parser(tiny_llama):
    with pytest.raises(SystemExit):
        main(["generate", "--target", tiny_llama["target"], "--policy", "x", "--prompt", "x"])


@pytest.mark.slow
def test_smollm2_with_ngram_prints_sensible_text(capsys):
    code = main(["generate", "--target", "smollm2-135m", "--drafter", "ngram", "--chat",
                 "--max-new-tokens", "48", "--json", "--prompt",
                 "Write a Python function that adds two numbers."])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert "def " in out["text"] and "return" in out["text"]
    assert out["stats"]["mean_accepted_length"] >= 1.0


def test_pacer_with_an_untrained_preverifier_runs(tiny_llama, capsys):
    code = main(["generate", "--target", tiny_llama["target"], "--drafter",
                 tiny_llama["block-drafter"], "--policy", "pacer", "--preverifier", "untrained",
                 "--max-new-tokens", "10", "--prompt", "abc", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["stats"]["committed"] == 10


def test_pacer_on_an_acceptance_model_runs(tiny_llama, capsys):
    code = main(["generate", "--target", tiny_llama["target"], "--drafter", "ngram", "--policy",
                 "pacer", "--acceptance", "untrained", "--max-new-tokens", "10", "--prompt",
                 "abc abc abc", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["stats"]["committed"] == 10


def test_suffix_with_an_index_and_hybrid_run(tiny_llama, tmp_path, capsys):
    from specdec.models.suffix_index import SuffixIndex
    from specdec.models.target import TargetModel

    target = tiny_llama["target"]
    base = ["generate", "--target", target, "--dtype", "float64", "--max-new-tokens", "16",
            "--gamma", "16", "--prompt", "abc abc", "--json"]
    assert main([*base, "--drafter", "suffix"]) == 0  # no index: the local tree only
    first = json.loads(capsys.readouterr().out)
    vocab_size = TargetModel.from_pretrained(target).vocab_size
    SuffixIndex((tuple(first["token_ids"]),), "tiny", vocab_size).save(tmp_path / "idx")
    assert main([*base, "--drafter", "suffix", "--suffix-index", str(tmp_path / "idx")]) == 0
    warm = json.loads(capsys.readouterr().out)
    assert warm["token_ids"] == first["token_ids"]
    assert warm["stats"]["accepted"] > first["stats"]["accepted"]
    assert warm["stats"]["draft_sources"]["suffix"] >= 1
    assert main([*base, "--drafter", "hybrid", "--block-drafter", tiny_llama["block-drafter"],
                 "--preverifier", "untrained"]) == 0
    hybrid = json.loads(capsys.readouterr().out)
    assert hybrid["token_ids"] == first["token_ids"]


def test_suffix_index_without_a_suffix_drafter_is_an_error(tiny_llama, capsys):
    assert main(["generate", "--target", tiny_llama["target"], "--suffix-index", "x",
                 "--prompt", "x"]) == 2
    assert "--suffix-index needs --drafter suffix or hybrid" in capsys.readouterr().err


def test_generate_starts_again_with_the_plans_openmp_variables_and_threads(tiny_llama):
    """The program, not in-process: started without OMP_WAIT_POLICY and asked for passive, it
    runs in a process started with it (OpenMP reads it only when torch loads), on the CPUs it
    may use."""
    from specdec.runtime.plan import usable_cpus

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    run = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "--target",
                          tiny_llama["target"], "--dtype", "float64", "--max-new-tokens", "2",
                          "--prompt", "a", "--omp-wait-policy", "passive", "--json"], env=env,
                         capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)["plan"]
    assert (plan["omp_wait_policy"], plan["threads"]) == ("passive", usable_cpus()[0])
    assert "omp_wait_policy: passive, as the environment's OMP_WAIT_POLICY says" in plan["reasons"]
    assert "OpenMP wait policy passive" in run.stderr  # the plan it printed at start
