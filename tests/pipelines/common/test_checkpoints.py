"""Optimiser state round-trips through safetensors + JSON (no pickle) and training continues
exactly as if it had never stopped."""

from __future__ import annotations

import torch

from pipelines.common import checkpoints


def make(seed: int):
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 3)
    return net, torch.optim.AdamW(net.parameters(), lr=0.1)


def steps(net, opt, n: int) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        opt.zero_grad()
        net(torch.randn(5, 4, generator=gen)).pow(2).sum().backward()
        opt.step()


def test_optimizer_round_trip_continues_identically(tmp_path):
    net, opt = make(0)
    steps(net, opt, 3)
    checkpoints.save_optimizer(opt, tmp_path)
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    steps(net, opt, 2)

    net2, opt2 = make(1)
    net2.load_state_dict(weights)
    checkpoints.load_optimizer(opt2, tmp_path)
    steps(net2, opt2, 2)
    for a, b in zip(net.parameters(), net2.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_latest_picks_the_highest_step(tmp_path):
    assert checkpoints.latest(tmp_path) is None
    for step in (2, 10, 4):
        out = checkpoints.step_dir(tmp_path, step)
        out.mkdir(parents=True)
        checkpoints.write_state(out, step)
    assert checkpoints.read_state(checkpoints.latest(tmp_path))["step"] == 10
