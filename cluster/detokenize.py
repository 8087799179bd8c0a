"""Incremental detokenisation for streaming: text deltas whose concatenation is the full text.

A round may end inside a multi-byte character, which decodes to U+FFFD until its last byte
arrives; such a tail is held back until it completes (or the request ends). With stop strings
(``specdec.engine.stops``), text that could be the start of a stop string is held back too,
until the next tokens decide it, and nothing from a stop string on is ever sent, so a stop
split across rounds or tokens never leaks.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer, stops=None):
        self.tokenizer = tokenizer
        self.stops = stops  # a specdec.engine.stops.StopStrings, or None
        self.token_ids: list[int] = []
        self.sent = ""

    def add(self, token_ids: list[int]) -> str:
        """Take a round's tokens; return the text that is now stable and not yet sent."""
        self.token_ids.extend(token_ids)
        text = self._decode().rstrip(REPLACEMENT)
        if self.stops is not None:
            cut = self.stops.visible(text)
            text = cut if len(cut) < len(text) else text[: len(text) - self.stops.held_back(text)]
        return self._emit(text)

    def finish(self) -> str:
        """Whatever is left, the held-back tail included (up to a stop string, if one came)."""
        return self._emit(self.text())

    def text(self) -> str:
        """The whole visible text of the tokens so far."""
        text = self._decode()
        return text if self.stops is None else self.stops.visible(text)

    def _decode(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    def _emit(self, text: str) -> str:
        if not text.startswith(self.sent):
            return ""  # not stable yet (rare with byte-level tokenizers): wait for more tokens
        delta, self.sent = text[len(self.sent):], text
        return delta
