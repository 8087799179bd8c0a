"""Speculative settings as the job and benchmark YAML files write them: the verifier of an SD
simulation or evaluation, and a PACER setting.

``fixed(gamma)`` and ``pacer(settings)`` turn them into the engine's ``SpecSettings`` fields
(the flat dict an HTTP request's ``speculative`` takes too). The evaluate job sweeps PACER
settings, the simulate and evaluate jobs verify with ``VerifierSettings``, and the benchmark
(``bench/``) measures the same settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipelines.common.config import Strict
from specdec.algorithms.verify import VERIFIERS


class VerifierSettings(Strict):
    # the greedy verifiers (a simulation replays the target's greedy tokens)
    name: Literal[VERIFIERS.names(without="temperature")] = "strict"  # type: ignore[valid-type]
    budget: float = 0.0  # ASD B
    gate: float = 0.25  # ASD g
    max_exceptions: int = 2  # ASD M

    def params(self) -> dict:
        if self.name == "strict":
            return {}
        return dict(budget=self.budget, gate=self.gate, max_exceptions=self.max_exceptions)


class PacerSettings(Strict):
    block_size: int = Field(4, ge=1)
    threshold: float = Field(0.5, ge=0, le=1)
    growth: float = Field(1.1, ge=1)
    max_draft: int = Field(16, ge=1)


def fixed(gamma: int) -> dict:
    return {"policy": "fixed", "gamma": gamma}


def pacer(p: PacerSettings) -> dict:
    return {"policy": "pacer", "block_size": p.block_size, "threshold": p.threshold,
            "growth": p.growth, "max_draft": p.max_draft}
