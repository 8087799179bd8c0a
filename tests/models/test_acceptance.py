from __future__ import annotations

import pytest
import torch

from specdec.models.acceptance import (
    AcceptanceConfig,
    AcceptanceModel,
    acceptance_features,
    acceptance_taps,
    root_of,
    survival,
)
from specdec.models.preverifier import PreVerifier, PreVerifierConfig

H, D, V = 6, 4, 10


def make(seed: int = 0) -> AcceptanceModel:
    config = AcceptanceConfig("suffix", H, D, width=8, heads=2, max_positions=8)
    torch.manual_seed(seed)
    embedding = torch.randn(V, H, dtype=torch.float64)
    return AcceptanceModel(config, PreVerifier(config.net_config()), embedding)


def test_features_are_root_embedding_and_signals_per_token():
    model, root = make(), torch.arange(H, dtype=torch.float64)
    tokens, signals = torch.tensor([3, 7, 3]), torch.rand(3, D)
    f = model.features(root, tokens, signals)
    assert f.shape == (3, 2 * H + D) and f.dtype == torch.float32
    assert (f[:, :H] == root.float()).all()
    torch.testing.assert_close(f[:, H:2 * H], model.embedding[tokens].float())
    torch.testing.assert_close(f[:, 2 * H:], signals)
    empty = acceptance_features(root, model.embedding, tokens[:0], signals[:0])
    assert empty.shape == (0, 2 * H + D)


def test_root_is_the_last_taps_row_deepest_layer_or_zeros():
    taps = torch.arange(3 * 2 * H, dtype=torch.float64).reshape(3, 2 * H)  # two tapped layers
    torch.testing.assert_close(root_of(taps, H), taps[-1, H:].float())
    assert (root_of(None, H) == 0).all() and (root_of(taps[:0], H) == 0).all()
    with pytest.raises(ValueError, match="width"):
        root_of(taps[:, :2], H)
    assert acceptance_taps(30, ()) == (29,) and acceptance_taps(30, (1, 14, 27)) == (1, 14, 27)


def test_the_input_layer_in_parts_equals_the_net_on_the_features():
    """Served: the root's term once, the embedding's from the table, the signals' per token;
    the same scores as the whole features through the pre-verifier's forward."""
    model = make()
    taps, tokens = torch.randn(3, H, dtype=torch.float64), torch.tensor([1, 9, 3])
    signals = torch.rand(3, D)
    features = model.features(root_of(taps, H), tokens, signals)
    served = model.score(model.inputs(model.root(taps), tokens, signals))
    torch.testing.assert_close(served, model.net.score_reference(features), atol=1e-6, rtol=1e-5)
    first = model.score(model.inputs(model.root(None), tokens[:1], signals[:1]))  # no taps: zeros
    want = model.net.score(model.features(torch.zeros(H), tokens[:1], signals[:1]))
    torch.testing.assert_close(first, want, atol=1e-6, rtol=1e-5)


def test_scores_are_probabilities_causal_and_survival_is_their_product():
    model = make()
    x = model.inputs(model.root(torch.randn(1, H)), torch.tensor([1, 2, 3, 4]), torch.rand(4, D))
    p = model.score(x)
    assert p.shape == (4,) and ((p > 0) & (p < 1)).all()
    torch.testing.assert_close(model.score(x[:2]), p[:2])
    s = survival(p)
    assert s[0] == pytest.approx(float(p[0])) and s[-1] == pytest.approx(float(p.double().prod()))


def test_parts_are_normalised_apart():
    """Scaling one part (a residual-stream state) leaves the scores alone: its own LayerNorm."""
    model = make()
    torch.nn.init.ones_(model.net.norm.norms[0].weight)
    f = model.features(torch.randn(H), torch.tensor([1, 2]), torch.rand(2, D))
    scaled = f.clone()
    scaled[:, :H] *= 1000
    torch.testing.assert_close(model.net.score(scaled), model.net.score(f), atol=1e-4, rtol=1e-4)


def test_save_load_roundtrip_in_bfloat16(tmp_path):
    model = make()
    f = model.features(torch.randn(H), torch.tensor([5, 6, 7]), torch.rand(3, D))
    back = AcceptanceModel.load(model.save(tmp_path / "a", dtype=torch.bfloat16), model.embedding)
    assert back.config == model.config and back.net.c.parts == (H, H, D)
    torch.testing.assert_close(back.net.score(f), model.net.score(f), atol=0.02, rtol=0)
    with pytest.raises(FileNotFoundError, match="acceptance"):
        AcceptanceModel.load(PreVerifier(PreVerifierConfig(8)).save(tmp_path / "pv"),
                             model.embedding)


def test_bad_shapes_fail_naming_the_field():
    with pytest.raises(ValueError, match="parts"):
        PreVerifierConfig(8, parts=(3, 4))
    with pytest.raises(ValueError, match="root_size"):
        AcceptanceConfig("ngram", 0, 4)
    config = AcceptanceConfig("ngram", H, D)
    with pytest.raises(ValueError, match="wide embedding"):
        AcceptanceModel(config, PreVerifier(config.net_config()), torch.zeros(V, H + 1))
