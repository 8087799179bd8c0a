"""Incremental detokenisation for streaming: text deltas whose concatenation is the full text.

A round may end inside a multi-byte character, which decodes to U+FFFD until its last byte
arrives; such a tail is held back until it completes (or the request ends).
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.sent = ""

    def add(self, token_ids: list[int]) -> str:
        """Take a round's tokens; return the text that is now stable and not yet sent."""
        self.token_ids.extend(token_ids)
        return self._emit(self._decode().rstrip(REPLACEMENT))

    def finish(self) -> str:
        """Whatever is left, the held-back tail included."""
        return self._emit(self._decode())

    def _decode(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    def _emit(self, text: str) -> str:
        if not text.startswith(self.sent):
            return ""  # not stable yet (rare with byte-level tokenizers): wait for more tokens
        delta, self.sent = text[len(self.sent):], text
        return delta
