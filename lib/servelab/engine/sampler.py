"""Choosing each sequence's next token from its row of logits.

Rows in one batch may ask for different things (greedy, temperature, top-k,
top-p, a seed). :func:`servelab.sampling.sample_batch` does the choosing:
greedy rows are one ``argmax`` together, every other row is sampled on its own
with its request's own random generator. That is what makes a seeded request
reproducible whatever else shares its batch: the random numbers it draws never
depend on its neighbours. Rows without a seed share the engine's generator.

Before that, a sequence that has not reached ``min_tokens`` gets its end and
stop tokens masked out (:meth:`servelab.engine.stop.StopChecker.suppressed_token_ids`),
and a row whose request set penalties gets them from its own prompt and output
(:func:`servelab.sampling.apply_penalties`).

Rows whose request asked for ``logprobs`` also get the model's log-probability
of the chosen token (and of its ``n`` best alternatives) recorded on their
sequence: the raw model distribution, before temperature or filtering, as
:func:`servelab.generation.generate` reports it.
"""
from __future__ import annotations

import torch

from servelab.sampling import apply_penalties, logprobs, sample_batch, top_logprobs

__all__ = ["Sampler", "suppress_tokens", "penalize"]


def suppress_tokens(logits: torch.Tensor, row_ids) -> torch.Tensor:
    """``logits`` with ``row_ids[i]`` (a set of token ids per row) set to -inf; copies only if needed."""
    if not any(row_ids):
        return logits
    logits = logits.clone()
    for i, ids in enumerate(row_ids):
        if ids:
            logits[i, list(ids)] = float("-inf")
    return logits


def penalize(logits: torch.Tensor, seqs) -> torch.Tensor:
    """``logits`` with each row's penalties applied from its sequence's own prompt and output;
    copies only if some row has penalties."""
    rows = [i for i, s in enumerate(seqs) if s.sampling_params.has_penalties]
    if not rows:
        return logits
    logits = logits.float().clone()  # fp32, as vLLM: a bf16 row could round penalised scores into ties
    for i in rows:
        s = seqs[i]
        logits[i] = apply_penalties(logits[i], s.prompt_token_ids, s.output_token_ids, s.sampling_params)
    return logits


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)  # for rows without their own seed

    def __call__(self, logits: torch.Tensor, seqs) -> list[int]:
        """One token per row; ``seqs[i]`` supplies row i's params, generator and stop rules."""
        suppressed = [s.stop_checker.suppressed_token_ids(s.num_output_tokens)
                      if getattr(s, "stop_checker", None) is not None else () for s in seqs]
        params = [s.sampling_params for s in seqs]
        gens = [s.generator if s.generator is not None else self.generator for s in seqs]
        out = sample_batch(suppress_tokens(penalize(logits, seqs), suppressed), params, gens).tolist()
        self._record_logprobs(logits, seqs, out)
        return out

    @staticmethod
    def _record_logprobs(logits: torch.Tensor, seqs, tokens: list[int]) -> None:
        rows = [i for i, s in enumerate(seqs) if s.sampling_params.logprobs is not None]
        if not rows:
            return
        lp = logprobs(logits[rows])
        for r, i in enumerate(rows):
            seq, n = seqs[i], seqs[i].sampling_params.logprobs
            seq.logprobs.append(float(lp[r, tokens[i]]))
            if n:
                seq.top_logprobs.append(top_logprobs(lp[r], n, normalized=True))
