"""When does a sequence end? One set of rules for ``servelab.generate`` and the engine.

After every new token, in this order (vLLM's order and vLLM's reasons):

1. **an end token** (the model's ``eos_token_id``, unless ``ignore_eos``):
   ``finish_reason="stop"``, ``stop_reason=None``; the token is kept in the ids
   and left out of the text;
2. **a stop token** (``stop_token_ids``): ``"stop"``, ``stop_reason`` = the id;
3. **a stop string** in the new text: ``"stop"``, ``stop_reason`` = the string;
   the text is cut before it (or after it, with ``include_stop_str_in_output``);
4. **length**: ``max_tokens`` new tokens, or the sequence filled its context
   (``max_len``): ``"length"``.

Before ``min_tokens`` tokens exist, rules 1-3 do not apply, and the end and stop
tokens are not even drawn (:meth:`StopChecker.suppressed_token_ids`: the
sampler sets their logits to ``-inf``), as vLLM does.

Streaming must never show text that a stop string will later remove, so the
last ``len(longest stop) - 1`` characters are held back (:attr:`StopChecker.holdback`)
until the next token shows whether they start a stop string.
"""
from __future__ import annotations

from typing import Iterable

from servelab.sampling import check_max_tokens

__all__ = ["StopChecker", "check_max_tokens"]


class StopChecker:
    """The stop rules of one request (its :class:`~servelab.sampling.SamplingParams`
    and the model's end tokens)."""

    def __init__(self, params, eos_token_ids: Iterable[int] = (), max_len: int | None = None):
        self.max_tokens = check_max_tokens(params.max_tokens)
        self.min_tokens = params.min_tokens
        self.stop_strings: list[str] = list(params.stop or [])
        self.stop_token_ids = frozenset(params.stop_token_ids or ())
        self.eos_token_ids = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.include_stop_str = params.include_stop_str_in_output
        self.max_len = max_len
        longest = max((len(s) for s in self.stop_strings), default=0)
        #: characters of text not yet safe to stream (they may start a stop string)
        self.holdback = 0 if self.include_stop_str else max(longest - 1, 0)

    def suppressed_token_ids(self, num_output_tokens: int) -> frozenset[int]:
        """Token ids that must not be drawn next (end and stop tokens before ``min_tokens``)."""
        if num_output_tokens < self.min_tokens:
            return self.eos_token_ids | self.stop_token_ids
        return frozenset()

    def check_token(self, token: int, num_output_tokens: int):
        """``(finish_reason, stop_reason)`` if ``token`` (already counted in
        ``num_output_tokens``) ends the sequence by rules 1-2, else ``None``."""
        if num_output_tokens < self.min_tokens:
            return None
        if token in self.eos_token_ids:
            return "stop", None
        if token in self.stop_token_ids:
            return "stop", token
        return None

    def check_text(self, text: str, search_from: int, num_output_tokens: int):
        """``(end, stop_string)`` for the earliest stop string starting at or after
        ``search_from``; ``text[:end]`` is the output to keep. ``None`` if none.

        ``search_from`` is the length of text already streamed (0 searches
        everything). A stop string not found before must end in the new text, so
        it starts at most ``len(stop) - 1`` characters before ``search_from``:
        only that tail is searched again.
        """
        if not self.stop_strings or num_output_tokens < self.min_tokens:
            return None
        best = None
        for s in self.stop_strings:
            idx = text.find(s, max(search_from - len(s) + 1, 0))
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return None
        idx, s = best
        return (idx + len(s) if self.include_stop_str else idx), s

    def check_length(self, num_output_tokens: int, num_tokens: int) -> str | None:
        """``"length"`` once ``max_tokens`` are out or the context is full."""
        if num_output_tokens >= self.max_tokens:
            return "length"
        if self.max_len is not None and num_tokens >= self.max_len:
            return "length"
        return None
