"""Every YAML under configs/train parses against its job's schema; bad keys fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.common.config import load_config, parse_config
from pipelines.jobs import schema_for
from pipelines.train_drafter import TrainDrafterConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "train").rglob("*.yaml"))


def test_there_are_configs_for_every_job():
    from pipelines.jobs import SCHEMAS

    assert {p.stem.split(".")[0] for p in CONFIGS} == set(SCHEMAS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[2])))
def test_config_parses(path, monkeypatch):
    monkeypatch.setenv("SPECDEC_TINY", "/tmp/tiny")
    cfg = load_config(schema_for(path.stem), path)
    assert "$" not in cfg.model_dump_json()


def test_unknown_key_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("corpus: c.parquet\nloss: {name: dpace, alpah: 0.3}\nstepz: 3\n")
    with pytest.raises(ValueError) as err:
        load_config(TrainDrafterConfig, path)
    message = str(err.value)
    assert str(path) in message and "loss.alpah: unknown key" in message
    assert "stepz: unknown key" in message


def test_bad_values_and_unset_variables_are_named():
    with pytest.raises(ValueError, match="loss.name"):
        parse_config(TrainDrafterConfig, {"corpus": "c", "loss": {"name": "ce"}})
    with pytest.raises(ValueError, match="loss.gamma"):
        parse_config(TrainDrafterConfig, {"corpus": "c", "loss": {"name": "dflash"},
                                          "drafter": {"block_size": 6}})
    with pytest.raises(ValueError, match=r"corpus: environment variable \$NOPE_X is not set"):
        parse_config(TrainDrafterConfig, {"corpus": "$NOPE_X/c"})


def test_the_gpu_session_script_parses_and_names_configs_that_exist():
    import re
    import subprocess

    script = Path(__file__).resolve().parents[2] / "pipelines" / "train_default_gpu.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    named = re.findall(r"configs/train/[\w.]+\.yaml", script.read_text())
    assert named and all((script.parents[1] / n).is_file() for n in named), named
