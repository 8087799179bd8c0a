"""Training checkpoints as plain files: a model directory (safetensors), the optimiser state
(safetensors + JSON, no pickle) and ``state.json`` with the step counter.

Checkpoints live under ``<run_dir>/checkpoints/step_NNNNNNN`` and are also handed to Ray Train
(``ray.train.report``), which restores the newest after a worker failure; an explicit resume
(``resume: true``) picks the newest step directory of the same run directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

STATE_FILE = "state.json"
OPTIM_FILE = "optimizer.safetensors"
OPTIM_META = "optimizer.json"


def save_optimizer(opt: torch.optim.Optimizer, out: Path) -> None:
    """Tensors of the optimiser state to safetensors; scalars and param groups to JSON."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, state in sd["state"].items():
        for key, value in state.items():
            if torch.is_tensor(value):
                tensors[f"{pid}.{key}"] = value.contiguous()
            else:
                scalars[f"{pid}.{key}"] = value
    save_file(tensors, out / OPTIM_FILE)
    (out / OPTIM_META).write_text(json.dumps({"scalars": scalars, "groups": sd["param_groups"]}))


def load_optimizer(opt: torch.optim.Optimizer, src: Path) -> None:
    tensors = load_file(src / OPTIM_FILE)
    meta = json.loads((src / OPTIM_META).read_text())
    state: dict[int, dict] = {}
    for name, value in [*tensors.items(), *meta["scalars"].items()]:
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    opt.load_state_dict({"state": state, "param_groups": meta["groups"]})


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:07d}"


def latest(run_dir: Path) -> Path | None:
    found = sorted((run_dir / "checkpoints").glob("step_*/" + STATE_FILE))
    return found[-1].parent if found else None


def write_state(out: Path, step: int, **extra) -> None:
    (out / STATE_FILE).write_text(json.dumps({"step": step, **extra}))


def read_state(src: Path) -> dict:
    return json.loads((Path(src) / STATE_FILE).read_text())


def restore(run_dir: Path, run_id: str, resume: bool = False) -> Path | None:
    """The checkpoint a Ray Train loop continues from: Ray's (after a worker failure), else the
    newest in ``run_dir`` when it belongs to this run (a restart whose last report Ray never
    received, e.g. a worker killed right after reporting) or when ``resume`` is set."""
    import ray.train

    given = ray.train.get_checkpoint()
    if given is not None:
        return Path(given.path)
    newest = latest(run_dir)
    if newest and (resume or read_state(newest).get("run_id") == run_id):
        return newest
    return None
