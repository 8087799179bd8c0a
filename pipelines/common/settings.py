"""Speculative settings as the job and benchmark YAML files write them: the verifier of an SD
simulation or evaluation, and a PACER setting.

Nothing here declares a knob: ``VerifierSettings`` has the greedy verifiers' names and their
configs' knobs by field name (``budget``, ``gate``, ... of ``AsdConfig``), ``PacerSettings`` the
flat keys of PACER's config (``block_size``, ``threshold``, ``growth``, ``max_draft``), each
with its config's default, bounds and help (``specdec.engine.settings``). ``fixed(gamma)`` and
``pacer(settings)`` turn them into the engine's flat ``SpecSettings`` keys (the flat dict an HTTP
request's ``speculative`` takes too). The evaluate job sweeps PACER settings, the simulate and
evaluate jobs verify with ``VerifierSettings``, and the benchmark (``bench/``) measures the same
settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import create_model

from pipelines.common.config import Strict
from specdec.algorithms.verify import VERIFIERS
from specdec.engine.settings import flat_fields
from specdec.knobs import knobs, pydantic_field

# the greedy verifiers (a simulation replays the target's greedy tokens)
GREEDY = VERIFIERS.names(without="temperature")
_CONFIGS = [VERIFIERS.get(n).config_class() for n in GREEDY if VERIFIERS.get(n).config]


class _Verifier(Strict):
    name: Literal[GREEDY] = "strict"  # type: ignore[valid-type]

    def params(self) -> dict:
        """The chosen verifier's config fields (``make_verifier`` keywords); {} for strict."""
        cls = VERIFIERS.get(self.name).config_class()
        return {} if cls is None else {f.name: getattr(self, f.name) for f in knobs(cls)}


# name, then every greedy verifier's knobs by field name (ASD: budget, gate, max_exceptions, ...)
VerifierSettings = create_model(
    "VerifierSettings", __base__=_Verifier,
    **{f.name: pydantic_field(cls, f) for cls in _CONFIGS for f in knobs(cls)})

PacerSettings = create_model("PacerSettings", __base__=Strict, **flat_fields("pacer"))


def fixed(gamma: int) -> dict:
    return {"policy": "fixed", "gamma": gamma}


def pacer(p: PacerSettings) -> dict:
    return {"policy": "pacer", **p.model_dump()}
