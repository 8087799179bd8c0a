"""The GPU check's own logic, run on the CPU with the tiny pair: every strict method reproduces
plain AR in float32, and the report says so per dtype and method."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from bench import gpu_check
from pipelines.common.formats import CORPUS_SCHEMA
from pipelines.common.tables import write_table


@pytest.fixture(scope="module")
def bench_prompts(tmp_path_factory):
    rows = [dict(id=f"{src}-{i}", source=src, split="benchmark", prompt_ids=list(text),
                 input_ids=list(text), prompt_len=len(text))
            for i, (src, text) in enumerate([("humaneval", b"def f(x):\n    return"),
                                             ("sharegpt", b"hello world, hello")])]
    path = tmp_path_factory.mktemp("gpu-check") / "benchmark.parquet"
    return str(write_table(pa.Table.from_pylist(rows, schema=CORPUS_SCHEMA), path))


def test_report_on_the_tiny_pair(tiny_pair_sources, bench_prompts, tmp_path):
    out = tmp_path / "gpu_check.json"
    gpu_check.main(["--device", "cpu", "--target", tiny_pair_sources["target"],
                    "--drafter", tiny_pair_sources["drafter"],
                    "--preverifier", tiny_pair_sources["preverifier"],
                    "--prompts", bench_prompts, "--n", "1", "--max-new-tokens", "10",
                    "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["lossless_float32"] is True and report["prompts"] == 2
    f32 = report["dtypes"]["float32"]
    assert set(f32) == {"ar", "hf_generate", "fixed_4", "fixed_8", "fixed_15", "pacer"}
    assert all(f32[m]["same_as_ar"] == 1.0 for m in f32)
    assert f32["ar"]["vs_ar"] == 1.0 and f32["ar"]["mean_accepted_length"] == 1.0
    assert set(report["dtypes"]["bfloat16"]) == set(f32)


def test_no_cuda_is_a_clear_error(bench_prompts):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_check.main(["--drafter", "x", "--prompts", bench_prompts])
