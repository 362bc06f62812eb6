"""Turning a growing list of token ids into a growing string, cheaply and safely.

Two traps, and the standard answer to both (the one vLLM and TGI use):

* Decoding the whole output after every token costs O(length) per token. So we
  decode only a short window: the tokens since the last point where the text was
  known to be complete (``prefix_offset``), compared with that window minus the
  newest tokens (``read_offset``).
* A byte-level tokenizer can split one character over several tokens; decoding
  half of it gives U+FFFD, the replacement character. While the text ends in
  one, we wait for the next token instead of emitting garbage.
"""
from __future__ import annotations

__all__ = ["IncrementalDetokenizer"]

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes (maybe "")."""
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset:self.read_offset])
        full = decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT_CHAR):
            delta = full[len(prefix):]
            self.text += delta
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """At the end: whatever is left, replacement characters and all."""
        full = self.tokenizer.decode(self.ids[self.prefix_offset:])
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        delta = full[len(prefix):]
        self.text += delta
        self.prefix_offset = self.read_offset = len(self.ids)
        return delta
