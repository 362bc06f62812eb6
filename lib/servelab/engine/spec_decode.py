"""Speculative decoding inside the continuous-batching engine.

The engine's step stays the same step; with a ``speculative_config`` it gains
three moves around it (:class:`SpecDecoder`):

1. **propose** (before scheduling): every running sequence that is decoding
   gets up to k draft tokens appended to its ids, from its own proposer (prompt
   lookup, or a draft model with its own small cache). The scheduler then sees
   1 + k uncomputed tokens and schedules them like a short chunk: blocks,
   token budget and preemption all apply unchanged.
2. **fit the plan** (after scheduling): a sequence that got m rows (the budget
   may cut the chunk) asks the runner for logits on all m of them and has its
   drafts trimmed to m - 1; drafts of sequences that were preempted or not
   scheduled are dropped (never computed, never kept).
3. **verify** (after the forward pass): the exact acceptance rule of
   :func:`servelab.speculative.accept_tokens` picks the tokens to keep. The
   engine removes the drafts from the ids, appends the kept tokens one by one
   through its usual path (stop strings, end tokens, ``max_tokens`` and
   streaming all apply, and a stop inside an accepted run ends the sequence
   there), then rolls the KV back to what was kept (``Scheduler.truncate``:
   emptied blocks freed, rolled-back blocks out of the prefix cache).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.sampling import apply_penalties, sampling_probs, top_logprobs
from servelab.sampling import logprobs as log_softmax
from servelab.speculative import SpecStats, SpeculativeConfig, accept_tokens

__all__ = ["SpecDecoder", "Drafts"]


@dataclass
class Drafts:
    """One sequence's proposal for this step."""

    num_tokens_before: int          # ids before the drafts (the last one is the pending token)
    tokens: list[int]
    probs: torch.Tensor | None      # [k, vocab] draft distributions, or None (prompt lookup)
    num_rows: int = 0               # rows the plan gave it (1 + drafts judged)


class SpecDecoder:
    """Proposers per request, the acceptance rule per sequence, and statistics."""

    def __init__(self, config, target_model=None, max_model_len: int | None = None):
        self.config = SpeculativeConfig.from_dict(config)
        self.k = self.config.num_speculative_tokens
        self.max_model_len = max_model_len
        self._draft_model = None
        if self.config.method == "draft_model":
            self._draft_model = self.config.build_proposer(target_model).model
        self._proposers: dict[str, object] = {}
        self.stats = SpecStats()

    # -- 1. propose -------------------------------------------------------------
    def _proposer(self, seq):
        p = self._proposers.get(seq.request_id)
        if p is None:
            if self._draft_model is None:
                p = self.config.build_proposer()
            else:
                from servelab.speculative import DraftModelProposer
                p = DraftModelProposer(self._draft_model, max_len=seq.max_len + self.k + 1)
            self._proposers[seq.request_id] = p
        return p

    def propose(self, running, engine_generator) -> dict[int, Drafts]:
        """Append drafts to every decoding sequence; returns them by ``id(seq)``."""
        out: dict[int, Drafts] = {}
        for seq in running:
            if seq.num_computed_tokens != seq.num_tokens - 1 or seq.num_output_tokens == 0:
                continue  # still in its prompt (or recomputing one): nothing to draft from
            sp = seq.sampling_params
            # never draft past max_tokens or the sequence's length cap: the last emitted
            # token of a round may be the bonus, so k drafts need k + 1 tokens of room
            room = min(self.k, sp.max_tokens - seq.num_output_tokens - 1, seq.max_len - seq.num_tokens - 1)
            if room <= 0:
                continue
            gen = seq.generator if seq.generator is not None else engine_generator
            tokens, probs = self._proposer(seq).propose(seq.token_ids, room, sp, gen)
            if not tokens:
                continue
            n = seq.num_tokens
            seq.token_ids.extend(tokens)
            out[id(seq)] = Drafts(n, list(tokens), probs)
        return out

    # -- 2. fit the plan --------------------------------------------------------
    def fit_plan(self, plan, drafts: dict[int, Drafts], running) -> None:
        """Ask for logits on every row of a drafted sequence; drop what will not run."""
        scheduled = set()
        for s in plan.scheduled:
            d = drafts.get(id(s.seq))
            if d is None:
                continue
            if s.start != d.num_tokens_before - 1:  # e.g. recomputing after a preemption
                raise RuntimeError("a drafted sequence was scheduled from an unexpected position; "
                                   "this is an engine bug, please report it")
            m = s.num_new_tokens
            s.num_logits = m
            s.samples = True  # its last computed row samples, even if the budget cut the drafts
            d.num_rows = m
            del d.tokens[m - 1:]
            if d.probs is not None:
                d.probs = d.probs[: m - 1]
            scheduled.add(id(s.seq))
        for seq in list(running) + list(plan.preempted):
            d = drafts.get(id(seq))
            if d is not None and id(seq) not in scheduled:
                del seq.token_ids[d.num_tokens_before:]
                drafts.pop(id(seq))

    # -- 3. verify --------------------------------------------------------------
    def verify(self, seq, d: Drafts, rows: torch.Tensor, engine_generator) -> list[tuple[int, float | None, list | None]]:
        """The tokens to keep for one sequence, from its ``len(d.tokens) + 1`` rows of logits,
        each as ``(token, logprob, top_logprobs)`` (``None`` where not asked for).

        Removes the drafts from ``seq.token_ids``; the engine appends the kept tokens
        (and their logprobs) itself, one by one, so a stop inside the run keeps
        exactly the ids it keeps and their logprobs. Logprobs are the raw model
        rows', as the plain sampler reports them: before ``min_tokens`` bans them.
        """
        sp = seq.sampling_params
        gen = seq.generator if seq.generator is not None else engine_generator
        raw = rows.float()
        rows = raw.clone()
        checker = getattr(seq, "stop_checker", None)
        if checker is not None:  # min_tokens: no end or stop token before it
            n_out = d.num_tokens_before - seq.num_prompt_tokens
            for i in range(rows.shape[0]):
                banned = checker.suppressed_token_ids(n_out + i)
                if banned:
                    rows[i, list(banned)] = float("-inf")
        if sp.has_penalties:  # row i follows the output so far and the first i drafts
            before = seq.token_ids[seq.num_prompt_tokens:d.num_tokens_before]
            for i in range(rows.shape[0]):
                rows[i] = apply_penalties(rows[i], seq.prompt_token_ids, before + d.tokens[:i], sp)
        p = sampling_probs(rows, sp)
        kept = accept_tokens(d.tokens, p, d.probs, gen)
        self.stats.record(len(d.tokens), len(kept) - 1)
        del seq.token_ids[d.num_tokens_before:]
        if sp.logprobs is None:
            return [(t, None, None) for t in kept]
        lp = log_softmax(raw[: len(kept)])
        return [(t, float(lp[i, t]), top_logprobs(lp[i], sp.logprobs, normalized=True) if sp.logprobs else None)
                for i, t in enumerate(kept)]

    def release(self, request_id: str) -> None:
        self._proposers.pop(request_id, None)
