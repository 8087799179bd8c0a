"""Per-request settings: how to draft, how to verify, how much to generate.

A request's speculative settings (``SpecSettings``) are the draft policy's name, the verifier's
name, and one config per *section*: every catalog entry with knobs (``Entry.config``), that is
the policies' (``fixed``, ``heuristic``, ``pacer``), the verifiers' (``asd``; strict has no knobs
and the sampler's temperature / top_k / top_p / min_p are ``GenerationParams`` fields) and the
drafters' options (``suffix``, ``hybrid``). Each config is declared next to its algorithm; no knob
is declared here. The chosen policy is built from its section, the chosen verifier from its; the
suffix drafter reads ``suffix``, the hybrid ``hybrid`` and ``pacer`` (it runs PACER itself).

The flat form (the HTTP ``speculative`` body, the serve YAML and the CLI of before the configs)
keeps working: ``FLAT`` maps each flat key to every knob it sets (``knob(flat=...)``, else
``<section>_<field>``):

    gamma                 -> fixed.gamma, heuristic.initial
    max_draft             -> heuristic.max_len, pacer.max_len, suffix.max_len
    block_size, threshold, growth            -> pacer.block_size, .threshold, .growth
    asd_budget, asd_gate, asd_max_exceptions, asd_normalized -> asd.budget, .gate, ...
    suffix_factor, suffix_offset, suffix_min_prob            -> suffix.factor, .offset, .min_prob
    hybrid_skip           -> hybrid.skip

and, as before, heuristic.initial is at most heuristic.max_len when gamma or max_draft is set
flat. Sections can be given whole instead (``pacer={"threshold": 0.6}`` or a ``PacerConfig``);
in one call a section's fields win over flat keys; ``updated`` lays one call over another (a
request over a server's defaults).

What it is not: no schema. The serving and training layers build their pydantic models from
``FLAT`` and ``SECTIONS`` (``flat_fields``, ``section_models``); these plain frozen dataclasses
are validated on construction so that bad input fails before any model runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specdec.algorithms.policies import POLICIES
from specdec.algorithms.sampling import Warp
from specdec.algorithms.verify import VERIFIERS
from specdec.knobs import knobs, pydantic_field, pydantic_model
from specdec.models.drafters import DRAFTERS

# section name -> the config class of that catalog entry, for every entry with knobs
SECTIONS: dict[str, type] = {e.name: e.config_class() for catalog in (POLICIES, VERIFIERS, DRAFTERS)
                             for e in catalog.entries if e.config is not None}


def _flat_table() -> dict[str, tuple[tuple[str, str], ...]]:
    table: dict[str, list[tuple[str, str]]] = {}
    for section, cls in SECTIONS.items():
        for f in knobs(cls):
            table.setdefault(f.metadata["flat"] or f"{section}_{f.name}", []).append(
                (section, f.name))
    return {key: tuple(targets) for key, targets in table.items()}


# flat key -> the (section, field) knobs it sets; the first one gives its type, default and help
FLAT: dict[str, tuple[tuple[str, str], ...]] = _flat_table()


def flat_knob(key: str) -> tuple[type, dataclasses.Field]:
    """(config class, knob field) of flat key ``key``'s first knob: its type, default, help."""
    section, name = FLAT[key][0]
    return SECTIONS[section], next(f for f in knobs(SECTIONS[section]) if f.name == name)


def flat_fields(*sections: str) -> dict[str, tuple]:
    """``pydantic.create_model`` fields for the flat keys that set a knob of ``sections`` (all
    when none are named), each with its knob's type, default, bounds and help."""
    return {key: pydantic_field(*flat_knob(key)) for key, targets in FLAT.items()
            if not sections or any(s in sections for s, _ in targets)}


def section_models() -> dict[str, tuple]:
    """``pydantic.create_model`` fields for the nested form: each section, optional, as a
    strict model of its config's knobs."""
    return {name: (pydantic_model(cls) | None, None) for name, cls in SECTIONS.items()}


def _samples(verifier: str) -> bool:
    """Whether the verifier samples (it runs only at temperature > 0; the others only at 0)."""
    return "temperature" in VERIFIERS.get(verifier).needs


def _config(section: str, base: Any, values: dict) -> Any:
    cls = SECTIONS[section]
    unknown = set(values) - {f.name for f in knobs(cls)}
    if unknown:
        raise ValueError(f"unknown {section} setting(s) {sorted(unknown)}; known: "
                         f"{', '.join(f.name for f in knobs(cls))}")
    return dataclasses.replace(base, **values)


@dataclass(frozen=True, init=False)
class SpecSettings:
    """Speculative settings of one request. ``verify=None`` picks strict greedy at temperature
    0 and rejection sampling above it. Built from flat keys and/or sections (module docstring);
    ``updated`` layers a request's settings over a server's."""

    policy: str
    verify: str | None
    sections: tuple[tuple[str, Any], ...]  # (section name, its config), every section
    # use the acceptance model (``specdec.models.acceptance``) where one is loaded: PACER's
    # scores and the drafts' survival; False: the drafter's own signals, as without one
    acceptance: bool

    def __init__(self, policy: str = "fixed", verify: str | None = None,
                 sections: tuple[tuple[str, Any], ...] | None = None, acceptance: bool = True,
                 **given: Any):
        POLICIES.get(policy)  # an unknown name raises, listing the known ones
        if not isinstance(acceptance, bool):
            raise ValueError(f"speculative acceptance must be true or false, got {acceptance!r}")
        if verify is not None:
            VERIFIERS.get(verify)
        base = dict(sections) if sections is not None else {n: c() for n, c in SECTIONS.items()}
        unknown = set(given) - set(FLAT) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown speculative setting(s) {sorted(unknown)}; known: "
                             f"{', '.join([*FLAT, *SECTIONS])}")
        values: dict[str, dict] = {name: {} for name in SECTIONS}
        for key, targets in FLAT.items():
            for section, name in targets if key in given else ():
                values[section][name] = given[key]
        configs = {n: _config(n, base[n], values[n]) for n in SECTIONS}
        if "gamma" in given or "max_draft" in given:  # the flat rule of before: at most max_draft
            h = configs["heuristic"]
            configs["heuristic"] = dataclasses.replace(h, initial=min(h.initial, h.max_len))
        for name, section in given.items():
            if name in SECTIONS and section is not None:
                fields = section if isinstance(section, dict) else dataclasses.asdict(section)
                configs[name] = _config(name, configs[name], fields)
        object.__setattr__(self, "policy", policy)
        object.__setattr__(self, "verify", verify)
        object.__setattr__(self, "sections", tuple(configs.items()))
        object.__setattr__(self, "acceptance", acceptance)

    def updated(self, **given: Any) -> SpecSettings:
        """These settings with ``given`` (flat keys, sections, policy, verify, acceptance) laid
        over them."""
        return SpecSettings(given.pop("policy", self.policy), given.pop("verify", self.verify),
                            self.sections, given.pop("acceptance", self.acceptance), **given)

    def section(self, name: str) -> Any:
        """The config of section ``name``; None for an entry without knobs (strict, sample)."""
        return dict(self.sections).get(name)

    @property
    def policy_config(self) -> Any:
        return self.section(self.policy)

    def flat(self) -> dict:
        """The flat form: policy, verify, acceptance and every flat key (from its first knob)."""
        return {"policy": self.policy, "verify": self.verify, "acceptance": self.acceptance,
                **{key: getattr(self.section(s), n) for key, ((s, n), *_) in FLAT.items()}}

    def __getattr__(self, key: str) -> Any:  # flat reads, as before: spec.gamma, spec.max_draft
        if key in FLAT:
            section, name = FLAT[key][0]
            return getattr(self.section(section), name)
        raise AttributeError(f"{type(self).__name__} has no attribute {key!r}")

    def verifier_name(self, temperature: float) -> str:
        name = self.verify or ("strict" if temperature == 0 else "sample")
        samples = _samples(name)
        if samples and temperature == 0:
            raise ValueError(f"verify={name} needs temperature > 0")
        if not samples and temperature > 0:
            raise ValueError(f"verify={name} is greedy; use verify=sample for temperature > 0")
        return name

    def verifier(self, temperature: float, **warp) -> tuple[str, Any, dict]:
        """(name, config, extra keywords) of the request's verifier, for ``make_verifier``; a
        sampling verifier gets the request's ``temperature`` and ``warp`` (top_k, top_p, min_p)."""
        name = self.verifier_name(temperature)
        return name, self.section(name), dict(temperature=temperature, **warp) if _samples(name) else {}


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
