"""The float32 panel linear (specdec/runtime/x86/panels.cpp) against float64 matmuls: shapes across
its row tiles (12 rows) and its panel pairs (32 outputs), outputs that pad the last panels, a
bias, leading dimensions; every row bitwise its result alone; bad input refused; and which
linears a config's ``linears`` gives."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime.x86 import panels

pytestmark = pytest.mark.skipif(panels.unavailable() is not None,
                                reason=f"panel kernel: {panels.unavailable()}")


def case(rows: int, inputs: int, outputs: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inputs, generator=gen, dtype=torch.float64)
    w = torch.randn(outputs, inputs, generator=gen, dtype=torch.float64)
    b = torch.randn(outputs, generator=gen, dtype=torch.float64)
    return x, w, b


@pytest.mark.parametrize("rows,inputs,outputs", [
    (1, 576, 960), (5, 37, 100), (12, 64, 32), (13, 64, 16), (29, 96, 33), (40, 1536, 576)])
def test_the_panel_linear_equals_a_float64_matmul(rows, inputs, outputs):
    x, w, b = case(rows, inputs, outputs)
    packed = panels.pack(w.float())
    assert packed.shape[0] % panels.PANELS == 0 and packed.shape[0] * panels.WIDTH >= outputs
    tol = dict(rtol=0, atol=2e-6 * inputs ** 0.5 * 4)  # float32 sums of `inputs` unit products
    torch.testing.assert_close(panels.linear(x.float(), packed, outputs).double(), x @ w.T, **tol)
    with_bias = panels.linear(x.float(), packed, outputs, b.float()).double()
    torch.testing.assert_close(with_bias, x @ w.T + b, **tol)


def test_leading_dimensions_and_a_strided_input_are_taken_as_rows():
    x, w, _ = case(6, 48, 64)
    packed = panels.pack(w.float())
    flat = panels.linear(x.float(), packed, 64)
    assert torch.equal(panels.linear(x.float().view(2, 3, 48), packed, 64), flat.view(2, 3, 64))
    wide = torch.cat([x.float(), torch.ones(6, 5)], dim=1)[:, :48]  # not contiguous
    assert torch.equal(panels.linear(wide, packed, 64), flat)


def test_every_row_is_bitwise_its_result_alone():
    """In batches of 2 to 40 rows (across row tiles of 12), each row's outputs equal the row's
    outputs when it is alone: no other row changes how its sums round."""
    x, w, b = case(40, 576, 200, seed=1)
    packed, x, b = panels.pack(w.float()), x.float(), b.float()
    alone = torch.cat([panels.linear(x[i:i + 1], packed, 200, b) for i in range(40)])
    for rows in (2, 11, 12, 13, 25, 40):
        assert torch.equal(panels.linear(x[:rows], packed, 200, b), alone[:rows]), rows
    assert torch.equal(panels.linear(x[7:30], packed, 200, b), alone[7:30])


def test_bad_input_is_refused_with_the_reason():
    x, w, _ = case(3, 32, 32)
    packed = panels.pack(w.float())
    with pytest.raises(RuntimeError, match="float32"):
        panels.linear(x, packed, 32)  # float64
    with pytest.raises(RuntimeError, match="inputs"):
        panels.linear(torch.randn(3, 31), packed, 32)
    with pytest.raises(RuntimeError, match="does not fit"):
        panels.linear(x.float(), packed, 33)
    with pytest.raises(RuntimeError, match="bias"):
        panels.linear(x.float(), packed, 32, torch.randn(31))


def test_a_config_picks_the_linears_and_a_bad_choice_names_the_field():
    from pydantic import ValidationError
    from transformers import LlamaConfig

    from cluster.schema import ServeArgs
    from specdec.runtime import PlanError, RuntimeConfig, resolve_plan

    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)

    def linears(name: str, blocks: bool = False) -> str:
        plan = resolve_plan(RuntimeConfig(device="cpu", dtype="float32", backend="x86",
                                          linears=name, max_model_len=128), config, blocks)
        return plan.linears

    assert linears("panels") == "panels"
    assert linears("auto") == "panels"  # float32 without GGUF blocks, where panels build
    assert linears("torch", blocks=True) == "torch"
    assert linears("onednn", blocks=True) == "onednn"
    with pytest.raises(PlanError, match="linears must be one of"):
        RuntimeConfig(linears="mkl")
    assert ServeArgs(target="t", linears="torch").linears == "torch"
    with pytest.raises(ValidationError, match="linears"):
        ServeArgs(target="t", linears="mkl")
