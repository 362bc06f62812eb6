"""Billing a conversation from the ``usage`` the server returns.

Each turn resends the whole conversation, so each turn's ``prompt_tokens``
counts everything sent so far; ``prompt_tokens_details.cached_tokens`` of them
were served from the prefix cache. A bill prices three counts separately, per
million tokens: fresh (uncached) input, cached input, and output.

:func:`chip_time_rates` derives such rates from chapter 24's chip-time model
(:mod:`servelab.cost`): fresh input and output from ``chat_cost``, cached input
at zero, since cached tokens skip prefill entirely in that model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

__all__ = ["Rates", "TurnBill", "bill_turn", "bill_conversation", "chip_time_rates"]


@dataclass(frozen=True)
class Rates:
    """Dollars per million tokens."""

    input: float
    cached_input: float
    output: float

    def __post_init__(self):
        for name in ("input", "cached_input", "output"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ValueError(f"the {name} rate must be a finite number of dollars >= 0, got {v!r}")


@dataclass(frozen=True)
class TurnBill:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    fresh_input_usd: float
    cached_input_usd: float
    output_usd: float

    @property
    def total_usd(self) -> float:
        return self.fresh_input_usd + self.cached_input_usd + self.output_usd


def _count(usage: Mapping, key: str) -> int:
    v = usage.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"usage[{key!r}] must be an integer >= 0, got {v!r}")
    return v


def bill_turn(usage: Mapping, rates: Rates, *, use_cache: bool = True) -> TurnBill:
    """Price one turn's OpenAI ``usage`` object. ``use_cache=False``: as if nothing were cached."""
    if not isinstance(usage, Mapping):
        raise TypeError(f"usage must be a dict like the server's 'usage', got {type(usage).__name__}")
    prompt = _count(usage, "prompt_tokens")
    out = _count(usage, "completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or 0 if use_cache else 0
    if isinstance(cached, bool) or not isinstance(cached, int) or not 0 <= cached <= prompt:
        raise ValueError(f"cached_tokens must be an integer in [0, prompt_tokens={prompt}], got {cached!r}")
    m = 1e-6
    return TurnBill(prompt, cached, out, (prompt - cached) * rates.input * m, cached * rates.cached_input * m,
                    out * rates.output * m)


def bill_conversation(usages: Iterable[Mapping], rates: Rates, *, use_cache: bool = True) -> list[TurnBill]:
    """One bill per turn (each turn's usage already counts the whole resent conversation)."""
    return [bill_turn(u, rates, use_cache=use_cache) for u in usages]


def chip_time_rates(**chat_cost_kwargs) -> Rates:
    """Rates from :func:`servelab.cost.chat_cost` (its base case unless told otherwise):
    fresh input and output at their chip-time cost per million, cached input at 0."""
    from servelab import cost
    c = cost.chat_cost(**chat_cost_kwargs)
    return Rates(input=c.input_usd_per_million, cached_input=0.0, output=c.output_usd_per_million)
