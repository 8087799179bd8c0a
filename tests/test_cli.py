"""The specdec command line, run in-process; the real SmolLM2 target in one slow test."""

from __future__ import annotations

import json

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
    assert set(out) == {"text", "token_ids", "finish_reason", "stats"}


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
