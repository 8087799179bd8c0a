"""Model references, dtypes and devices."""

from __future__ import annotations

import pytest
import torch

from specdec.models.sources import parse_device, parse_dtype, resolve


def test_dtypes_by_name():
    assert parse_dtype("float64") is torch.float64
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("float8")


def test_dtype_auto_is_the_plans_to_decide():
    with pytest.raises(ValueError, match="plan"):
        parse_dtype("auto")


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
