"""Model references, dtypes and devices."""

from __future__ import annotations

import pytest
import torch

from specdec.models import sources
from specdec.models.sources import parse_device, parse_dtype, resolve


def test_dtypes_by_name():
    assert parse_dtype("float64") is torch.float64
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("float8")


@pytest.mark.parametrize("amx", [True, False])
def test_auto_dtype_is_bfloat16_only_on_a_cpu_with_amx(monkeypatch, amx):
    monkeypatch.setattr(sources, "cpu_has_amx", lambda: amx)
    assert parse_dtype("auto") is (torch.bfloat16 if amx else torch.float32)
    assert parse_dtype("auto", "cpu") is parse_dtype("auto")
    assert sources.auto_dtype(torch.device("cuda")) is torch.float32  # not batch invariant there


@pytest.mark.parametrize("amx", [True, False])
def test_auto_dtype_is_float32_for_a_model_on_int8_rows(monkeypatch, amx):
    """A model whose linears run int8 rows on its GGUF codes is served in float32, AMX or not
    (its rows beat bfloat16's on AMX); on a GPU there are no int8 rows."""
    monkeypatch.setattr(sources, "cpu_has_amx", lambda: amx)
    assert parse_dtype("auto", int8_rows=True) is torch.float32
    assert parse_dtype("bfloat16", int8_rows=True) is torch.bfloat16  # a name is a name
    assert sources.auto_dtype(torch.device("cuda"), int8_rows=True) is torch.float32



def test_auto_device_is_the_gpu_only_when_one_is_visible():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert parse_device("auto").type == expected
    assert parse_device("cpu").type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA"):
        parse_device("cuda")


def test_missing_directories_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve("./no/such/model")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve(str(tmp_path))
