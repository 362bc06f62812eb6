"""Streaming text past stop strings without ever showing part of one.

A stop string can arrive split across tokens (``"\\n\\nUser"`` as ``"\\n"``,
``"\\nUs"``, ``"er"``). A streamer that forwards every piece at once has
already shown ``"\\n\\nUs"`` when the match completes, and cannot take it back.
So it holds back the tail of the text that could still grow into a stop
string, and releases it as soon as it cannot: the longest suffix of the text
that is a proper prefix of some stop string. (The engine uses the simpler,
always-safe bound of ``max(len(stop)) - 1`` characters.)
"""
from __future__ import annotations

from typing import Iterable, Sequence

__all__ = ["StopStringStreamer", "holdback_stream"]


class StopStringStreamer:
    """Feed text pieces with :meth:`push`; each call returns the text now safe to show."""

    def __init__(self, stops: Sequence[str] = ()):
        if isinstance(stops, str):
            stops = [stops]
        stops = list(stops)
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
        self.stops = stops
        self.text = ""       # everything received (cut at a stop once one matches)
        self.emitted = 0     # characters already shown
        self.stopped: str | None = None  # the stop string that ended the stream

    def _held(self) -> int:
        """Characters at the end of the text that could start a stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text) - self.emitted), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def push(self, piece: str) -> str:
        if not isinstance(piece, str):
            raise TypeError(f"pieces must be strings, got {type(piece).__name__}")
        if self.stopped is not None:
            return ""
        start = max(self.emitted - max((len(s) for s in self.stops), default=0) + 1, 0)
        self.text += piece
        hits = [(i, s) for s in self.stops if (i := self.text.find(s, start)) != -1]
        if hits:
            i, s = min(hits)
            self.stopped = s
            self.text = self.text[:i]
            out, self.emitted = self.text[self.emitted:], len(self.text)
            return out
        safe = len(self.text) - self._held()
        out, self.emitted = self.text[self.emitted:safe], max(safe, self.emitted)
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
