"""SpecSettings: flat keys and sections, the documented mapping, one default per knob."""

from __future__ import annotations

import dataclasses

import pytest

from specdec.algorithms.asd import AsdConfig
from specdec.algorithms.policies import HeuristicConfig, PacerConfig
from specdec.engine.settings import FLAT, SECTIONS, SpecSettings, flat_knob
from specdec.knobs import knobs

# The mapping the README documents: flat key -> the knobs it sets.
DOCUMENTED = {
    "gamma": (("fixed", "gamma"), ("heuristic", "initial")),
    "max_draft": (("heuristic", "max_len"), ("pacer", "max_len"), ("suffix", "max_len")),
    "block_size": (("pacer", "block_size"),),
    "threshold": (("pacer", "threshold"),),
    "growth": (("pacer", "growth"),),
    "asd_budget": (("asd", "budget"),),
    "asd_gate": (("asd", "gate"),),
    "asd_max_exceptions": (("asd", "max_exceptions"),),
    "asd_normalized": (("asd", "normalized"),),
    "suffix_factor": (("suffix", "factor"),),
    "suffix_offset": (("suffix", "offset"),),
    "suffix_min_prob": (("suffix", "min_prob"),),
    "hybrid_skip": (("hybrid", "skip"),),
}


def test_the_flat_mapping_is_the_documented_one():
    assert FLAT == DOCUMENTED
    assert set(SECTIONS) == {"fixed", "heuristic", "pacer", "asd", "suffix", "hybrid"}


@pytest.mark.parametrize("key", sorted(FLAT))
def test_a_flat_key_has_one_default(key):
    defaults = {getattr(SECTIONS[s](), n) for s, n in FLAT[key]}
    assert defaults == {flat_knob(key)[1].default}


@pytest.mark.parametrize("flat", [
    {},
    {"policy": "pacer", "threshold": 0.6, "max_draft": 8, "verify": "asd", "asd_budget": 2.0},
    {"policy": "heuristic", "gamma": 20, "max_draft": 8, "suffix_factor": 1.0, "hybrid_skip": 0.5},
])
def test_the_flat_form_round_trips(flat):
    spec = SpecSettings(**flat)
    assert SpecSettings(**spec.flat()) == spec
    assert {k: v for k, v in spec.flat().items() if k in flat} == flat


def test_flat_keys_set_their_sections_as_before():
    spec = SpecSettings(policy="heuristic", gamma=20, max_draft=8, threshold=0.6, asd_gate=0.5)
    assert spec.policy_config == HeuristicConfig(initial=8, max_len=8)  # initial <= max_draft
    assert spec.section("fixed").gamma == 20 and spec.gamma == 20
    assert spec.section("pacer") == PacerConfig(threshold=0.6, max_len=8)
    assert spec.section("suffix").max_len == 8
    assert spec.section("asd") == AsdConfig(gate=0.5)
    assert spec.section("strict") is None


def test_sections_and_flat_keys_give_the_same_settings():
    nested = SpecSettings(policy="pacer", pacer={"threshold": 0.6}, verify="asd",
                          asd=AsdConfig(budget=2.0))
    assert nested == SpecSettings(policy="pacer", threshold=0.6, verify="asd", asd_budget=2.0)
    # in one call a section wins over flat keys; updated() lays a request over a server
    assert SpecSettings(threshold=0.2, pacer={"threshold": 0.6}).section("pacer").threshold == 0.6
    served = SpecSettings(pacer={"threshold": 0.6, "growth": 1.3})
    asked = served.updated(policy="fixed", threshold=0.2)
    assert asked.policy == "fixed" and asked.section("pacer") == PacerConfig(threshold=0.2,
                                                                             growth=1.3)


@pytest.mark.parametrize("kwargs,match", [
    ({"gama": 3}, "unknown speculative setting.*gama"),
    ({"pacer": {"thresh": 0.6}}, "unknown pacer setting.*thresh"),
    ({"threshold": 1.5}, r"PacerConfig.threshold .* must be <= 1, got 1.5"),
    ({"asd": {"max_exceptions": 1.5}}, "AsdConfig.max_exceptions .* must be an integer"),
])
def test_bad_settings_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SpecSettings(**kwargs)


def test_every_knob_has_help_and_a_valid_default():
    for cls in SECTIONS.values():
        assert knobs(cls) == dataclasses.fields(cls)
        assert all(f.metadata["help"] for f in knobs(cls))
        cls()  # the defaults pass the bounds
