"""Choosing each sequence's next token from its row of logits.

Rows in one batch may ask for different things (greedy, temperature, top-k,
top-p, a seed). Greedy rows are one ``argmax`` together. Every other row is
sampled on its own with its request's own random generator, which is what
makes a seeded request reproducible whatever else shares its batch: the
random numbers it draws never depend on its neighbours.
"""
from __future__ import annotations

import torch

__all__ = ["Sampler", "filter_logits"]


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int | None,
                  top_p: float | None, min_p: float | None = None) -> torch.Tensor:
    """One row of logits -> probabilities after temperature, top-k, top-p, min-p."""
    logits = logits / temperature
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly above each token
        drop = before >= top_p                           # keeps the smallest set reaching top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    if min_p is not None and min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    return probs / probs.sum()


def _opt(params, name, default=None):
    value = getattr(params, name, default)
    return default if value is None else value


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)  # for rows without their own seed

    def __call__(self, logits: torch.Tensor, seqs) -> list[int]:
        """One token per row; ``seqs[i]`` supplies row i's params and generator."""
        out = [0] * len(seqs)
        greedy = [i for i, s in enumerate(seqs) if _opt(s.sampling_params, "temperature", 1.0) <= 0]
        if greedy:
            picks = logits[greedy].argmax(dim=-1).tolist()
            for i, t in zip(greedy, picks):
                out[i] = t
        for i, seq in enumerate(seqs):
            sp = seq.sampling_params
            temperature = _opt(sp, "temperature", 1.0)
            if temperature <= 0:
                continue
            top_k = _opt(sp, "top_k", None)
            if top_k is not None and top_k <= 0:  # vLLM: -1 / 0 mean "off"
                top_k = None
            probs = filter_logits(logits[i].float(), temperature, top_k,
                                  _opt(sp, "top_p", 1.0), _opt(sp, "min_p", 0.0))
            gen = seq.generator if seq.generator is not None else self.generator
            out[i] = int(torch.multinomial(probs, 1, generator=gen))
        return out
