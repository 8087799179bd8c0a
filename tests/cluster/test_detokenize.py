"""Streaming text deltas: multi-byte tails and possible stop strings are held back until decided."""

from __future__ import annotations

from cluster.detokenize import TextStream
from specdec.engine.stops import StopStrings


class Letters:
    """A tokenizer whose token i is the i-th lowercase letter."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


A, B, C, D = 0, 1, 2, 3


def stream(stops):
    tok = Letters()
    return TextStream(tok, StopStrings(stops, tok.decode))


def test_a_possible_stop_is_held_back_then_released_when_it_fails():
    s = stream(["bcx"])
    assert s.add([A]) == "a"
    assert s.add([B]) == ""  # "b" may begin "bcx"
    assert s.add([C]) == ""  # "bc" still may
    assert s.add([D]) == "bcd"  # decided: not a stop
    assert s.finish() == ""


def test_a_stop_split_across_rounds_never_leaks():
    s = stream(["bc"])
    assert s.add([A, B]) == "a"
    assert s.add([C, D]) == ""
    assert s.finish() == "" and s.text() == "a"


def test_the_held_tail_is_released_at_the_end():
    s = stream(["bcx"])
    assert s.add([A, B, C]) == "a"
    assert s.finish() == "bc"


def test_without_stops_everything_stable_is_sent():
    s = TextStream(Letters())
    assert s.add([A, B]) == "ab" and s.add([C]) == "c" and s.finish() == ""
