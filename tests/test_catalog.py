"""The catalog type (specdec.catalog) and the four catalogs built on it."""

from __future__ import annotations

import pytest

from specdec.algorithms.losses import LOSSES
from specdec.algorithms.policies import POLICIES
from specdec.algorithms.verify import VERIFIERS, StrictVerifier
from specdec.catalog import Catalog, Entry
from specdec.models.drafters import DRAFTERS


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown verifier 'typical'; known verifiers: "
                                         "asd, sample, strict"):
        VERIFIERS.get("typical")
    with pytest.raises(ValueError, match="known draft policies: fixed, heuristic, pacer"):
        POLICIES.build("nope")
    with pytest.raises(ValueError, match="dflash, dpace, dpace_f, dpace_p"):
        LOSSES.get("focal")


def test_a_path_entry_claims_references_in_order():
    catalog = Catalog("thing", Entry("plain", dict), Entry("dir", dict, claims=str.isdigit),
                      Entry("rest", dict, claims=lambda ref: ref.startswith("x")))
    assert [catalog.resolve(r).name for r in ("plain", "12", "xy")] == ["plain", "dir", "rest"]
    assert catalog.named() == ("plain",) and catalog.names() == ("dir", "plain", "rest")
    with pytest.raises(ValueError, match="known things: plain, or a reference to dir, rest"):
        catalog.resolve("y")


def test_import_paths_load_only_when_built():
    catalog = Catalog("thing", Entry("f", "fractions:Fraction"))
    assert catalog.build("f", 1, 2) == 0.5
    with pytest.raises(ValueError, match="bad parameters for thing 'f'.*allowed"):
        catalog.build("f", nope=1)


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="duplicate"):
        Catalog("thing", Entry("a", dict), Entry("a", list))


def test_the_catalogs_hold_every_implementation():
    assert VERIFIERS.names() == ("asd", "sample", "strict")
    assert isinstance(VERIFIERS.build("strict"), StrictVerifier)
    assert VERIFIERS.names(without="temperature") == ("asd", "strict")
    assert POLICIES.names() == ("fixed", "heuristic", "pacer")
    assert [p for p in POLICIES if "scorer" in POLICIES.get(p).needs] == ["pacer"]
    assert LOSSES.names() == ("dflash", "dpace", "dpace_f", "dpace_p")
    assert DRAFTERS.named() == ("hybrid", "ngram", "none", "self", "suffix")
    assert DRAFTERS.resolve("/no/such/dir").name == "ar"  # a hub id or AR LM path, tried last
