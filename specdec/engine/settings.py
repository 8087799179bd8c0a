"""Per-request settings: how to draft, how to verify, how much to generate.

Plain frozen dataclasses, validated on construction so that bad input fails before any model
runs. The serving and training layers wrap these in their own strict schemas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.algorithms.policies import POLICIES
from specdec.algorithms.sampling import Warp
from specdec.algorithms.verify import VERIFIERS


@dataclass(frozen=True)
class SpecSettings:
    """Speculative settings of one request. ``verify=None`` picks strict greedy at temperature
    0 and rejection sampling above it."""

    policy: str = "fixed"
    gamma: int = 4  # fixed window; also the heuristic schedule's first length
    block_size: int = 4  # PACER b
    threshold: float = 0.5  # PACER t_1
    growth: float = 1.1  # PACER rho
    max_draft: int = 16  # PACER / heuristic cap on one round's draft
    verify: str | None = None
    asd_budget: float = 0.0  # B (0 = strict)
    asd_gate: float = 0.25  # g
    asd_max_exceptions: int = 2  # M
    asd_normalized: bool = False  # q_i = (K - i) / K instead of K - i
    # suffix drafter (SuffixDecoding): budget min(max_draft, floor(factor * match + offset))
    suffix_factor: float = 2.0
    suffix_offset: float = 0.0
    suffix_min_prob: float = 0.05  # stop the walk below this path probability
    hybrid_skip: float = 4.0  # hybrid: a suffix score at least this skips the block drafter

    def __post_init__(self):
        POLICIES.get(self.policy)  # an unknown name raises, listing the known ones
        if self.verify is not None:
            VERIFIERS.get(self.verify)
        checks = [
            (self.gamma >= 1, f"gamma must be >= 1, got {self.gamma}"),
            (self.block_size >= 1, f"block size must be >= 1, got {self.block_size}"),
            (0 <= self.threshold <= 1, f"threshold must be in [0, 1], got {self.threshold}"),
            (self.growth >= 1, f"growth rho must be >= 1, got {self.growth}"),
            (self.max_draft >= 1, f"max draft length must be >= 1, got {self.max_draft}"),
            (self.asd_budget >= 0, f"ASD budget B must be >= 0, got {self.asd_budget}"),
            (self.asd_gate >= 0, f"ASD gate g must be >= 0, got {self.asd_gate}"),
            (self.asd_max_exceptions >= 0,
             f"ASD max exceptions M must be >= 0, got {self.asd_max_exceptions}"),
            (self.suffix_factor >= 0, f"suffix factor must be >= 0, got {self.suffix_factor}"),
            (0 <= self.suffix_min_prob <= 1,
             f"suffix min token prob must be in [0, 1], got {self.suffix_min_prob}"),
            (self.hybrid_skip >= 0, f"hybrid skip score must be >= 0, got {self.hybrid_skip}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def verifier_name(self, temperature: float) -> str:
        name = self.verify or ("strict" if temperature == 0 else "sample")
        samples = "temperature" in VERIFIERS.get(name).needs
        if samples and temperature == 0:
            raise ValueError(f"verify={name} needs temperature > 0")
        if not samples and temperature > 0:
            raise ValueError(f"verify={name} is greedy; use verify=sample for temperature > 0")
        return name

    def verifier_params(self, temperature: float, **warp) -> dict:
        """Keyword arguments of the verifier; ``warp`` (top_k, top_p, min_p) goes to sampling."""
        name = self.verifier_name(temperature)
        if name == "asd":
            return dict(budget=self.asd_budget, gate=self.asd_gate,
                        max_exceptions=self.asd_max_exceptions, normalized=self.asd_normalized)
        if name == "sample":
            return dict(temperature=temperature, **warp)
        return {}

    def policy_params(self) -> dict:
        if self.policy == "fixed":
            return dict(gamma=self.gamma)
        if self.policy == "heuristic":
            return dict(initial=min(self.gamma, self.max_draft), max_len=self.max_draft)
        return dict(block_size=self.block_size, threshold=self.threshold, growth=self.growth,
                    max_len=self.max_draft)


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    spec: SpecSettings = field(default_factory=SpecSettings)
    top_k: int = 0  # sampling truncation (see specdec.algorithms.sampling.Warp); greedy ignores it
    top_p: float = 1.0
    min_p: float = 0.0
    stop_token_ids: frozenset[int] = frozenset()  # end the output like EOS does
    logprobs: int | None = None  # None: none; n >= 0: each token's and the top-n alternatives'

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        self.warp  # noqa: B018 -- validates top_k, top_p, min_p
        self.spec.verifier_name(self.temperature)  # fail early on a verifier/temperature clash

    @property
    def warp(self) -> Warp:
        return Warp(self.temperature, self.top_k, self.top_p, self.min_p)

    def warp_params(self) -> dict:
        """The truncation settings, as keywords of ``Sampling`` and the sampling verifier."""
        return dict(top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
