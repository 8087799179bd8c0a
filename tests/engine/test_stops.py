"""Stop strings: the pure text logic, and the token that completes a stop."""

from __future__ import annotations

import pytest

from specdec.engine.stops import StopStrings, check_stops, find_stop, partial_stop, visible


def test_find_stop_takes_the_earliest_of_all_stops():
    assert find_stop("abc\n\ndef END", ["END", "\n\n"]) == 3
    assert find_stop("abc", ["x", "y"]) is None
    assert visible("abc\n\ndef", ["\n\n"]) == "abc"
    assert visible("no stop here", ["\n\n"]) == "no stop here"


@pytest.mark.parametrize(("text", "stops", "held"), [
    ("hello wor", ["world"], 3),  # "wor" may become "world"
    ("hello", ["world"], 0),
    ("ab\n", ["\n\n"], 1),
    ("xEN", ["END", "ENX"], 2),
    ("xE", ["END", "EN"], 1),
    ("world", ["world"], 0),  # a whole stop is a hit, not a partial
])
def test_partial_stop_is_the_longest_suffix_that_starts_a_stop(text, stops, held):
    assert partial_stop(text, stops) == held


def test_empty_stop_strings_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        check_stops(["ok", ""])


def chars(ids: list[int]) -> str:
    """A detokeniser where token i is the i-th letter, 26 and up multi-letter words."""
    return "".join(chr(ord("a") + i) if i < 26 else "xyz" for i in ids)


def test_cut_keeps_up_to_the_token_that_completes_the_stop():
    stops = StopStrings(["cd"], chars)
    assert stops.cut([0, 1], 0) is None  # "ab"
    assert stops.cut([0, 1, 2, 3, 4], 2) == 4  # "abcde": "cd" completes at token 4
    assert stops.cut([0, 1, 2, 3, 4], 0) == 4
    # a stop split across rounds: "c" was in the previous round, "d" comes now
    assert stops.cut([0, 1, 2, 3], 3) == 4


def test_cut_inside_a_multi_character_token():
    stops = StopStrings(["yz"], chars)
    assert stops.cut([0, 26, 1], 1) == 2  # "a" + "xyz" + "b": the stop ends inside token 2
    assert stops.visible(chars([0, 26, 1])) == "ax"
