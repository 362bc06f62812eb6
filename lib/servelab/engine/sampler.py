"""Choosing each sequence's next token from its row of logits.

Rows in one batch may ask for different things (greedy, temperature, top-k,
top-p, a seed). Greedy rows are one ``argmax`` together. Every other row is
sampled on its own, by :func:`servelab.sampling.sample`, with its request's own
random generator: that is what makes a seeded request reproducible whatever
else shares its batch, because the random numbers it draws never depend on its
neighbours.

Rows whose request asked for ``logprobs`` also get the model's log-probability
of the chosen token (and of its ``n`` best alternatives) recorded on their
sequence: the raw model distribution, before temperature or filtering, as
:func:`servelab.generation.generate` reports it.
"""
from __future__ import annotations

import torch

from servelab.sampling import logprobs, sample, top_logprobs

__all__ = ["Sampler"]


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)  # for rows without their own seed

    def __call__(self, logits: torch.Tensor, seqs) -> list[int]:
        """One token per row; ``seqs[i]`` supplies row i's params and generator."""
        out = [0] * len(seqs)
        greedy = [i for i, s in enumerate(seqs) if s.sampling_params.temperature == 0]
        if greedy:
            for i, t in zip(greedy, logits[greedy].argmax(dim=-1).tolist()):
                out[i] = t
        for i, seq in enumerate(seqs):
            if seq.sampling_params.temperature == 0:
                continue
            gen = seq.generator if seq.generator is not None else self.generator
            out[i] = int(sample(logits[i], seq.sampling_params, gen))
        self._record_logprobs(logits, seqs, out)
        return out

    @staticmethod
    def _record_logprobs(logits: torch.Tensor, seqs, tokens: list[int]) -> None:
        rows = [i for i, s in enumerate(seqs) if getattr(s.sampling_params, "logprobs", None) is not None]
        if not rows:
            return
        lp = logprobs(logits[rows])
        for r, i in enumerate(rows):
            seq, n = seqs[i], seqs[i].sampling_params.logprobs
            seq.logprobs.append(float(lp[r, tokens[i]]))
            if n:
                seq.top_logprobs.append(top_logprobs(lp[r], n, normalized=True))
