"""Reading ``pipelines.simulate``'s rows (``STEPS_SCHEMA``): the drafts (rounds) they hold, and
what their acceptance features are. Read by the jobs that train and evaluate on them."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipelines.common.formats import ACCEPTANCE_META
from pipelines.common.tables import metadata


def acceptance_of(path: str, what: str) -> dict | None:
    """What the rows' acceptance features are (``pipelines.simulate``'s ``specdec.acceptance``
    metadata: the drafter kind and the root width, the signals' width added from a row), or
    None for a pre-verifier's rows (``what`` names the config key in errors)."""
    meta = metadata(path).get(ACCEPTANCE_META)
    if meta is None:
        return None
    info = json.loads(meta)
    first = pq.read_table(path, columns=["hidden"]).slice(0, 1).column("hidden").to_pylist()
    if not first:
        raise ValueError(f"{what}: {path} has no rows")
    signals = len(first[0]) - 2 * info["root_size"]
    if signals < 1:
        raise ValueError(f"{what}: {path} rows of {len(first[0])} features hold "
                         f"no drafter signals past two {info['root_size']}-wide parts")
    return {**info, "signal_size": signals}


def steps_of(table: pa.Table, reached: bool = False) -> list:
    """The steps (rounds) of rows of ``STEPS_SCHEMA``, ordered by request and step; with
    ``reached``, each cut after its first rejected token (an acceptance model's labels: a token
    accepted given its predecessors were)."""
    from specdec.training.preverifier_data import Step

    table = table.sort_by([("request", "ascending"), ("step", "ascending"),
                           ("position", "ascending")])
    cols = {name: table.column(name).to_pylist() for name in ("request", "step", "accepted")}
    hidden = torch.tensor(table.column("hidden").to_pylist(), dtype=torch.float32)  # [rows, D]
    steps, start = [], 0
    for i in range(1, table.num_rows + 1):
        key = (cols["request"][start], cols["step"][start])
        if i < table.num_rows and (cols["request"][i], cols["step"][i]) == key:
            continue
        labels = torch.tensor(cols["accepted"][start:i], dtype=torch.float32)
        end = i
        rejected = (labels == 0).nonzero()
        if reached and len(rejected):  # the first rejection and the tokens before it
            end = start + int(rejected[0]) + 1
        steps.append(Step(hidden[start:end], labels[:end - start]))
        start = i
    return steps
