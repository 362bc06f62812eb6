"""When does a sequence end? One set of rules for ``servelab.generate``, the engine and streaming.

After every new token, in this order (vLLM's order and vLLM's reasons):

1. **an end token** (the model's ``eos_token_id``, unless ``ignore_eos``):
   ``finish_reason="stop"``, ``stop_reason=None``; the token is kept in the ids
   and left out of the text;
2. **a stop token** (``stop_token_ids``): ``"stop"``, ``stop_reason`` = the id;
3. **a stop string** that ends in the new text: ``"stop"``, ``stop_reason`` = the
   string; the text is cut before it (or after it, with ``include_stop_str_in_output``);
4. **length**: ``max_tokens`` new tokens, or the sequence filled its context
   (``max_len``): ``"length"``.

Before ``min_tokens`` tokens exist, rules 1-3 do not apply, and the end and stop
tokens are not even drawn (:meth:`StopChecker.suppressed_token_ids`: the
sampler sets their logits to ``-inf``), as vLLM does. A stop string that was
complete before then never ends the sequence later: rule 3 looks only at
stop strings that end in the text new since the previous check.

Streaming must never show text that a stop string will later remove, and
should hold back no more than that: :attr:`StopChecker.holdback` is the
longest tail of the text that is the start of some stop string (found in time
proportional to the new text, whatever the stop strings' lengths). The engine
streams with it, and :class:`StopStringStreamer` is the same rule over plain
text pieces.
"""
from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Iterable, Sequence

from servelab.sampling import check_max_tokens

__all__ = ["StopChecker", "StopStringStreamer", "check_max_tokens", "holdback_stream"]


def _borders(s: str) -> list[int]:
    """``b[k]``: the length of the longest proper prefix of ``s[:k]`` that is also its
    suffix (Knuth-Morris-Pratt's failure function), for k = 0 .. len(s)."""
    b = [0] * (len(s) + 1)
    q = 0
    for k in range(1, len(s)):
        while q and s[k] != s[q]:
            q = b[q]
        if s[k] == s[q]:
            q += 1
        b[k + 1] = q
    return b


class StopChecker:
    """The stop rules of one sequence (its :class:`~servelab.sampling.SamplingParams`
    and the model's end tokens). It remembers the text it last checked, so use one
    checker per sequence."""

    def __init__(self, params, eos_token_ids: Iterable[int] = (), max_len: int | None = None):
        self.max_tokens = check_max_tokens(params.max_tokens)
        self.min_tokens = params.min_tokens
        self.stop_strings: list[str] = list(params.stop or [])
        self.stop_token_ids = frozenset(params.stop_token_ids or ())
        self.eos_token_ids = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.include_stop_str = params.include_stop_str_in_output
        self.max_len = max_len
        # holdback: per stop string, how much of it the text's tail matches (< its length)
        hold = self.stop_strings and not self.include_stop_str
        self._borders = [_borders(s) for s in self.stop_strings] if hold else []
        self._matched = [0] * len(self._borders)
        self._text = ""  # the text at the previous check_text

    @classmethod
    def for_strings(cls, stops: Sequence[str], include_stop_str: bool = False) -> "StopChecker":
        """A checker of stop strings alone (no tokens, no length limit)."""
        return cls(SimpleNamespace(max_tokens=sys.maxsize, min_tokens=0, stop=list(stops),
                                   stop_token_ids=(), ignore_eos=True,
                                   include_stop_str_in_output=include_stop_str))

    @property
    def holdback(self) -> int:
        """Characters at the end of the text last checked that are not yet safe to
        stream: the longest tail that is the start of some stop string (0 with
        ``include_stop_str_in_output``, where a stop string is shown anyway)."""
        return max(self._matched, default=0)

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

    def _advance(self, text: str, new_from: int) -> None:
        """Move the holdback's matchers over ``text[new_from:]`` (from scratch over the
        last characters when the earlier text changed)."""
        for i, (s, b) in enumerate(zip(self.stop_strings, self._borders)):
            q, n = self._matched[i], len(s)
            start = new_from
            if new_from < len(self._text):  # rewritten: the tail decides, so restart there
                q, start = 0, max(len(text) - n + 1, 0)
            for c in text[start:]:
                while q and s[q] != c:
                    q = b[q]
                if s[q] == c:
                    q += 1
                if q == n:  # a whole stop string: hold only what could start another
                    q = b[n]
            self._matched[i] = q

    def check_text(self, text: str, search_from: int, num_output_tokens: int):
        """``(end, stop_string)`` for the earliest-starting stop string that ends in the
        text new since the previous call (and starts at or after ``search_from - len
        + 1``); ``text[:end]`` is the output to keep. ``None`` if there is none, or
        before ``min_tokens``.

        ``search_from`` is the length of text already streamed; 0 leaves the bound
        to the checker's memory of the text it saw last. A stop string that was
        whole in earlier text is never found again, also not when ``min_tokens``
        kept it from ending the sequence then.
        """
        prev = self._text
        if text.startswith(prev):
            new_from = len(prev)
        else:  # the decoded text changed (a character completed): compare from where it did
            new_from = next((k for k, (a, b) in enumerate(zip(prev, text)) if a != b),
                            min(len(prev), len(text)))
        if self._borders:
            self._advance(text, new_from)
        self._text = text
        if not self.stop_strings or num_output_tokens < self.min_tokens:
            return None
        bound = max(search_from, new_from)
        best = None
        for s in self.stop_strings:
            idx = text.find(s, max(bound - len(s) + 1, 0))
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


class StopStringStreamer:
    """Stop strings over plain text pieces, with :class:`StopChecker`'s rules: feed
    pieces with :meth:`push`; each call returns the text now safe to show.

    A stop string can arrive split across pieces (``"\\n\\nUser"`` as ``"\\n"``,
    ``"\\nUs"``, ``"er"``). A streamer that forwards every piece at once has
    already shown ``"\\n\\nUs"`` when the match completes, and cannot take it
    back. So it holds back the longest tail of the text that could still grow
    into a stop string, and releases it as soon as it cannot.
    """

    def __init__(self, stops: Sequence[str]):
        stops = list(stops)
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
        self.stops = stops
        self._checker = StopChecker.for_strings(stops)
        self.text = ""       # everything received (cut at a stop once one matches)
        self.emitted = 0     # characters already shown
        self.stopped: str | None = None  # the stop string that ended the stream

    def push(self, piece: str) -> str:
        if not isinstance(piece, str):
            raise TypeError(f"pieces must be strings, got {type(piece).__name__}")
        if self.stopped is not None:
            return ""
        self.text += piece
        found = self._checker.check_text(self.text, self.emitted, 0)
        if found is not None:
            end, self.stopped = found
            self.text = self.text[:end]
            safe = len(self.text)
        else:
            safe = max(len(self.text) - self._checker.holdback, self.emitted)
        out, self.emitted = self.text[self.emitted:safe], safe
        return out

    def finish(self) -> str:
        """The stream ended without a stop: release what was held."""
        out, self.emitted = self.text[self.emitted:], len(self.text)
        return out


def holdback_stream(pieces: Iterable[str], stops: Sequence[str]) -> list[str]:
    """What a client sees after each piece: one delta per piece, the held-back tail
    released with the last piece (the stream ends there), nothing after a stop."""
    st = StopStringStreamer(stops)
    pieces = list(pieces)
    out = [st.push(p) for p in pieces]
    if out:
        out[-1] += st.finish()
    return out
