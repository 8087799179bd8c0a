"""Stop strings: where an output must end, and how much of a stream's tail to hold back.

What this is: pure text logic for OpenAI's ``stop`` field, plus ``StopStrings``, which maps a
stop found in the decoded text back to the token that completed it, so the round loop truncates
a round that ran past a stop exactly as it truncates one at EOS. What it is not: no tokeniser
of its own (the caller passes ``decode``: token ids -> text), no token-id stops (those are
``GenerationParams.stop_token_ids``, handled like EOS).

Terms: a stop *hit* is the first occurrence of any stop string in the output text; the visible
text ends just before it. A *partial* stop is a suffix of the text that is a proper prefix of
some stop string: it may still become a hit, so a stream holds it back until it is decided.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index in ``text`` where the earliest stop string begins, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def visible(text: str, stops: Sequence[str]) -> str:
    """The text a client sees: everything before the first stop string."""
    hit = find_stop(text, stops)
    return text if hit is None else text[:hit]


def partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


def check_stops(stops: Sequence[str]) -> tuple[str, ...]:
    if any(not isinstance(s, str) or not s for s in stops):
        raise ValueError("stop strings must be non-empty strings")
    return tuple(stops)


class StopStrings:
    """The stop strings of one request, over the caller's detokeniser."""

    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]):
        self.stops = check_stops(stops)
        self.decode = decode

    def cut(self, token_ids: list[int], done: int) -> int | None:
        """How many of ``token_ids`` to keep: up to the token whose text completes the first stop
        string; None when there is no stop. The first ``done`` tokens were checked before (they
        hold no stop), so only cuts after them are looked for."""
        if find_stop(self.decode(token_ids), self.stops) is None:
            return None
        for n in range(done + 1, len(token_ids) + 1):
            if find_stop(self.decode(token_ids[:n]), self.stops) is not None:
                return n
        return len(token_ids)  # decoding merged bytes across the cut: keep them all

    def visible(self, text: str) -> str:
        return visible(text, self.stops)

    def held_back(self, text: str) -> int:
        return partial_stop(text, self.stops)
