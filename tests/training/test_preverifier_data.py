import pytest
import torch

from specdec.models.preverifier import PreVerifier, PreVerifierConfig
from specdec.training.preverifier_data import Step, pack_order, pack_steps


def test_pack_order_keeps_steps_whole():
    assert pack_order([3, 2, 4, 1, 0, 5], 5) == [[0, 1], [2, 3], [5]]
    with pytest.raises(ValueError, match="pack_len"):
        pack_order([6], 5)


def test_packed_steps_score_as_if_alone():
    gen = torch.Generator().manual_seed(0)
    steps = [Step(torch.randn(k, 8, generator=gen), (torch.rand(k, generator=gen) > 0.5).float())
             for k in (3, 2, 4)]
    packed = pack_steps(steps, pack_len=6)
    torch.manual_seed(0)
    net = PreVerifier(PreVerifierConfig(input_size=8, width=16, heads=2)).eval()
    with torch.no_grad():
        logits = net(packed.hidden, packed.positions, packed.step_ids)
    flat = logits[packed.valid]
    alone = torch.cat([net(s.hidden[None], torch.arange(len(s.labels))[None])[0] for s in steps])
    torch.testing.assert_close(flat, alone.detach(), rtol=1e-5, atol=1e-6)
    assert packed.labels[packed.valid].tolist() == torch.cat([s.labels for s in steps]).tolist()
