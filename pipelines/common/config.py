"""Strict job configs: pydantic models with ``extra="forbid"``, loaded from YAML, and the
sections every job shares (``MlflowSettings``, ``Scaling``).

Every job has one schema; an unknown or misspelt key fails at load time with the file and the
key's dotted path in the message, before any model loads. Strings may use ``$VAR`` / ``${VAR}``
(expanded from the environment), so the tiny configs can point at models built at test time.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Annotated, ClassVar, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from specdec.models.registry import DEFAULT_EXPERIMENT
from specdec.models.sources import NAMED_SOURCES, specdec_home


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEVICE = re.compile(r"cpu|auto|cuda(:\d+)?")


def _device(value: str) -> str:
    """A torch device name a job may run on; whether it exists is checked where it loads."""
    if not DEVICE.fullmatch(value):
        raise ValueError(f"a device is cpu, cuda, cuda:N or auto (a GPU when one is visible), "
                         f"got {value!r}")
    return value


Device = Annotated[str, AfterValidator(_device)]


class MlflowSettings(Strict):
    tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///$SPECDEC_HOME/mlflow.db
    experiment: str = DEFAULT_EXPERIMENT
    run_name: str | None = None
    register_model: bool = True  # register the trained model in the MLflow registry
    model_name: str | None = None  # default: <target>-block-drafter / <target>-preverifier
    champion: bool = False  # move the alias ``champion`` to the new version


class Scaling(Strict):
    num_workers: int = 0  # 0 runs the train loop in the driver (fast tests)
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    # Ray custom resources each worker asks for, e.g. {"trainer": 1} on nodes offering one each:
    # one worker per node
    resources_per_worker: dict[str, float] = {}
    max_failures: int = 0  # FailureConfig: worker-group restarts from the last checkpoint
    torch_threads: int = 2

    def worker_resources(self) -> dict[str, float]:
        """``ScalingConfig.resources_per_worker``: the CPUs and the custom resources."""
        return {"CPU": self.cpus_per_worker, **self.resources_per_worker}


class TrainJob(Strict):
    """A Ray Train job's config: ``batch_size`` is the step's global batch, split evenly over
    ``scaling.num_workers`` and drawn from ``data_shards`` shards of the training rows
    (``pipelines.common.shards``; checked); its outputs go to ``run_dir`` (default: the job's
    folder under $SPECDEC_HOME)."""

    JOB: ClassVar[str] = ""  # the job's name, for its default output folder

    # shards of the training rows, a multiple of the workers; None: one per worker. What a run
    # trains depends on it, not on the workers: W workers with S shards train what one does.
    data_shards: int | None = Field(None, ge=1)

    def output(self) -> Path:
        return Path(self.run_dir) if self.run_dir else default_output(self.JOB)

    def shards(self) -> int:
        return self.data_shards or max(1, self.scaling.num_workers)

    @model_validator(mode="after")
    def _batch_splits(self):
        workers, shards = max(1, self.scaling.num_workers), self.shards()
        if shards % workers:
            raise ValueError(f"data_shards {shards} must be a multiple of scaling.num_workers "
                             f"{workers} (each worker holds whole shards)")
        if self.batch_size % shards:
            raise ValueError(f"batch_size {self.batch_size} must be divisible by data_shards "
                             f"{shards} (one shard per run of batch_size / data_shards slots; "
                             "data_shards defaults to scaling.num_workers)")
        return self


def loop_device(scaling: Scaling, device: str = "cpu"):
    """The device of a Ray Train loop's model and batches: on a worker (num_workers > 0) the
    one Ray gave it (``ray.train.torch.get_device``: its GPU under use_gpu, else the CPU); in
    the driver (num_workers 0) ``device``."""
    from specdec.models.sources import parse_device

    if scaling.num_workers > 0:
        from ray.train.torch import get_device

        return get_device()
    return parse_device(device)


C = TypeVar("C", bound=BaseModel)


_VAR = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def _expand(value, key: str = ""):
    """Expand $VAR / ${VAR} in strings ($SPECDEC_HOME defaults to specdec's home); an unset
    variable is an error naming the key."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{key}.{i}") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    env = {"SPECDEC_HOME": str(specdec_home()), **os.environ}

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in env:
            raise ValueError(f"{key}: environment variable ${name} is not set")
        return env[name]

    return _VAR.sub(sub, value)


def describe(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        what = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  {key}: {what}")
    return f"invalid config {source}:\n" + "\n".join(lines)


def parse_config(schema: type[C], data: dict, source: str = "<dict>") -> C:
    if not isinstance(data, dict):
        raise ValueError(f"config {source} must be a mapping, got {type(data).__name__}")
    try:
        return schema.model_validate(_expand(data))
    except ValidationError as err:  # (a ValueError too: caught first)
        raise ValueError(describe(err, source)) from None
    except ValueError as err:
        raise ValueError(f"invalid config {source}: {err}") from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """``["repeats=1", "workloads.sharegpt.count=5"]`` -> a copy of ``data`` with those keys set
    (dotted keys; values parsed as YAML, so ``[2, 4]`` is a list and ``null`` is None)."""
    out = dict(data)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not KEY=VALUE")
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[leaf] = yaml.safe_load(value)
    return out


def load_config(schema: type[C], path: str | Path, overrides: list[str] | None = None) -> C:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"config {path} is not valid YAML: {err}") from None
    if overrides and isinstance(data, dict):
        data = apply_overrides(data, overrides)
    return parse_config(schema, data, str(path))


def cli_config(schema: type[C], argv=None, description: str = "") -> C:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="YAML file for this job")
    return load_config(schema, parser.parse_args(argv).config)


def target_name(ref: str) -> str:
    """A short name for registered models: the named source, or the directory's name."""
    return ref if ref in NAMED_SOURCES else Path(ref).name or "target"


def default_output(job: str) -> Path:
    return specdec_home() / "pipelines" / job
