"""The tiny Llama pair in float64, loaded once for the training tests."""

from __future__ import annotations

import pytest

from specdec.engine.loading import load_pair


@pytest.fixture(scope="module")
def pair64(tiny_llama):
    return load_pair(tiny_llama["target"], tiny_llama["block-drafter"], dtype="float64")
