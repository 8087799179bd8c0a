"""The stand-in CUDA device raises where a real GPU would, and only there."""

import pytest
import torch

from tests.device_guard import DeviceMixing, GuardedCuda


def test_it_raises_on_mixing_and_allows_what_cuda_allows():
    guard = GuardedCuda()
    with guard:
        x = torch.arange(6.0).cuda()  # on the stand-in GPU
        y = torch.ones(6, device=x.device)
        assert x.device.type == "cuda" and (x + y).is_cuda
        assert float((x * torch.tensor(2.0)).sum()) == 30.0  # a CPU scalar is fine; one sync
        assert x[torch.tensor([1, 2])].is_cuda  # CPU indices into a GPU tensor
        assert not x.cpu().is_cuda and not torch.ones(2).is_cuda
        with pytest.raises(DeviceMixing, match="CPU tensors of shape"):
            x == torch.ones(6)  # noqa: B015
        with pytest.raises(DeviceMixing, match="indexed with a CUDA tensor"):
            torch.ones(6)[x.long()]
        with pytest.raises(DeviceMixing, match="CPU generator"):
            torch.multinomial(x + 1, 1, generator=torch.Generator())
    assert guard.syncs == 1


def test_modules_move_with_their_parameters():
    guard = GuardedCuda()
    with guard:
        net = torch.nn.Linear(3, 2).to("cuda")
        assert net.weight.is_cuda and net(torch.ones(1, 3, device="cuda")).is_cuda
        with pytest.raises(DeviceMixing):
            net(torch.ones(1, 3))
