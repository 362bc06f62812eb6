"""Speculative decoding: a cheap guesser drafts k tokens, the big model checks them in one pass.

A decode step of a big model is bound by reading its weights, so scoring k + 1
positions in one pass costs about as much as scoring one. If a cheap
*proposer* guesses the next k tokens, the target model scores all of them at
once and keeps the longest prefix it agrees with, plus one token of its own.

Two proposers, configured with vLLM's names::

    {"model": "data/models/servelab-draft", "num_speculative_tokens": 4}
    {"method": "ngram", "num_speculative_tokens": 4,
     "prompt_lookup_max": 4, "prompt_lookup_min": 2}

The acceptance rule (Leviathan et al. 2023; Chen et al. 2023) keeps the output
distribution *exactly* the target's: accept draft token x with probability
min(1, p(x) / q(x)); on the first rejection, sample from the residual
max(0, p - q) renormalised and stop; if all k are accepted, sample a bonus
token from the target's next row. Greedy decoding is the special case where p
and q are one-hot: accept while the draft equals the target's argmax.

This module holds the pure rule, the expected-speedup formula, the two
proposers, and :func:`speculative_generate`, the batch-of-one reference loop
over contiguous caches (the engine runs the same rule per sequence).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

__all__ = [
    "SpeculativeConfig",
    "expected_tokens_per_pass",
    "expected_speedup",
    "best_num_speculative_tokens",
    "accept_tokens",
    "accept_with_uniforms",
    "worth_speculating",
    "verify_step_seconds",
    "speedup_at_batch",
    "NgramProposer",
    "DraftModelProposer",
    "SpecStats",
    "SpecResult",
    "speculative_generate",
    "code_windows",
    "edit_prompt",
]

_METHODS = ("draft_model", "ngram")


# ---------------------------------------------------------------- the config

@dataclass
class SpeculativeConfig:
    """vLLM's ``speculative_config``: which proposer, and how many tokens it drafts.

    ``method`` is ``"draft_model"`` (needs ``model``, a checkpoint folder or a
    :class:`servelab.model.LlamaModel` with the target's vocabulary) or
    ``"ngram"`` (prompt lookup: no model). A dict with a ``"model"`` key and no
    ``"method"`` means a draft model, as in vLLM.
    """

    num_speculative_tokens: int
    method: str = "draft_model"
    model: object = None
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1

    def __post_init__(self):
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
        if self.method not in _METHODS:
            raise ValueError(f"unknown speculative method {self.method!r}; use one of {_METHODS} "
                             f"(or give 'model' for a draft model)")
        if self.method == "draft_model" and self.model is None:
            raise ValueError("a draft-model config needs 'model': a checkpoint folder or a LlamaModel")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if self.method == "ngram" and not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {lo} and {hi}")

    @classmethod
    def from_dict(cls, d: dict) -> "SpeculativeConfig":
        if isinstance(d, cls):
            return d
        if not isinstance(d, dict):
            raise TypeError(f"speculative_config must be a dict, got {type(d).__name__}")
        known = {"model", "method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown speculative_config keys {sorted(unknown)}; known: {sorted(known)}")
        if "num_speculative_tokens" not in d:
            raise ValueError("speculative_config needs 'num_speculative_tokens' (how many tokens to draft)")
        d = dict(d)
        method = d.pop("method", None)
        if method in (None, "draft_model", "draft"):
            method = "draft_model" if d.get("model") is not None or method else None
        if method is None:
            raise ValueError("speculative_config needs 'model' (a draft model) or 'method': 'ngram'")
        return cls(method=method, **d)

    def build_proposer(self, target=None):
        """The proposer this config describes (loads the draft checkpoint if a path)."""
        if self.method == "ngram":
            return NgramProposer(self.prompt_lookup_min, self.prompt_lookup_max)
        draft = self.model
        if isinstance(draft, (str, Path)):
            from servelab.model import load_pretrained
            dtype = next(target.parameters()).dtype if target is not None else "float32"
            draft = load_pretrained(draft, dtype=dtype)
        if target is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({draft.config.vocab_size} ids) differs from "
                             f"the target's ({target.config.vocab_size}); a draft must share the "
                             f"target's tokenizer")
        return DraftModelProposer(draft)


# ---------------------------------------------------------------- the formula

def _check_rate(a: float) -> None:
    if not 0 <= a <= 1:
        raise ValueError(f"acceptance rate must be in [0, 1], got {a}")


def expected_tokens_per_pass(a: float, k: int) -> float:
    """Tokens emitted per target pass when each draft token is accepted with
    probability ``a`` independently: 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a).

    The ``1`` is the token the target always adds (the correction, or the bonus
    after k accepted drafts).
    """
    _check_rate(a)
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if a == 1:
        return float(k + 1)
    return (1 - a ** (k + 1)) / (1 - a)


def expected_speedup(a: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Speed-up over plain decoding when a draft step costs ``c`` target steps.

    One round costs k draft steps and one target pass over k + 1 rows, and
    emits ``expected_tokens_per_pass(a, k)`` tokens: speed-up = E / (k c + v).
    ``verify_cost`` v is that pass in target decode steps: about 1 while the
    step is memory-bound (k + 1 rows cost about one row), more once it is not.
    """
    if c < 0:
        raise ValueError(f"draft cost c must be >= 0 (in target steps), got {c}")
    if verify_cost <= 0:
        raise ValueError(f"verify_cost must be > 0 (in target steps), got {verify_cost}")
    return expected_tokens_per_pass(a, k) / (k * c + verify_cost)


def best_num_speculative_tokens(a: float, c: float, k_max: int = 16) -> int:
    """The k in 1..k_max with the highest expected speed-up (smallest on ties)."""
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    return max(range(1, k_max + 1), key=lambda k: (expected_speedup(a, k, c), -k))


def worth_speculating(a: float, c: float, k_max: int = 16) -> int:
    """The k to run with, or 0 when no k in 1..k_max beats plain decoding."""
    k = best_num_speculative_tokens(a, c, k_max)
    return k if expected_speedup(a, k, c) > 1 else 0


def verify_step_seconds(replica, batch: int, context_tokens: int, k: int) -> float:
    """One verifying step on a :class:`servelab.roofline.Replica`: every one of
    ``batch`` people sends k + 1 rows. Memory reads are those of a plain step
    (the weights once, each cache once; k new K/V rows are negligible), the
    arithmetic is k + 1 times a plain step's: the step turns compute-bound
    k + 1 times sooner."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return replica.overhead_s + max(replica.memory_seconds(batch, context_tokens),
                                    replica.compute_seconds(batch * (k + 1)))


def speedup_at_batch(replica, batch: int, context_tokens: int, a: float, k: int, c: float) -> float:
    """Speculation's speed-up per person when ``batch`` people share the replica.

    A round is k draft steps (each ``c`` times a plain step at that batch) and
    one verifying step; it yields E(a, k) tokens against one token per plain
    step. Near batch 1 the verify step costs a plain step and the speed-up is
    the formula's; past the replica's balance batch / (k + 1) the verify
    step's arithmetic grows with k + 1 and the speed-up fades below 1.
    """
    plain = replica.step_seconds(batch, context_tokens)
    round_s = k * c * plain + verify_step_seconds(replica, batch, context_tokens, k)
    return expected_tokens_per_pass(a, k) * plain / round_s


# ---------------------------------------------------------------- the rule

def _draw(probs: Sequence[float], u: float) -> int:
    """Inverse-CDF draw: the first i with u < probs[0] + ... + probs[i]."""
    total = 0.0
    for i, p in enumerate(probs):
        total += p
        if u < total:
            return i
    return max(i for i, p in enumerate(probs) if p > 0)  # rounding left u past the total


def accept_with_uniforms(draft_tokens: Sequence[int], p_rows, q_rows, uniforms: Sequence[float],
                         final_u: float) -> list[int]:
    """The acceptance rule in plain Python with its random numbers given.

    ``p_rows``: k + 1 target distributions (lists); ``q_rows``: k draft
    distributions; ``uniforms[i]`` decides draft i (accept when
    ``u < p(x) / q(x)``); ``final_u`` draws the last token, from the residual
    max(0, p - q) at the first rejection, else from the bonus row ``p_rows[k]``.
    The same rule as :func:`accept_tokens`, written out for reading and grading.
    """
    k = len(draft_tokens)
    if len(p_rows) != k + 1 or len(q_rows) != k or len(uniforms) < k:
        raise ValueError(f"need {k + 1} target rows, {k} draft rows and {k} uniforms for {k} drafts; "
                         f"got {len(p_rows)}, {len(q_rows)} and {len(uniforms)}")
    if not all(0 <= u < 1 for u in list(uniforms) + [final_u]):
        raise ValueError("uniform numbers must lie in [0, 1)")
    out: list[int] = []
    for i, x in enumerate(draft_tokens):
        p, q = p_rows[i], q_rows[i]
        if q[x] <= 0:
            raise ValueError(f"draft token {x} has draft probability 0 at position {i}")
        if uniforms[i] < p[x] / q[x]:
            out.append(x)
            continue
        residual = [max(0.0, a - b) for a, b in zip(p, q)]
        total = sum(residual)
        out.append(_draw([r / total for r in residual] if total > 0 else p, final_u))
        return out
    out.append(_draw(p_rows[k], final_u))
    return out


def accept_tokens(draft_tokens: Sequence[int], target_probs, draft_probs=None, generator=None) -> list[int]:
    """The exact acceptance rule for one sequence; returns the tokens to emit.

    ``target_probs``: ``[k + 1, vocab]`` -- the target's sampling distribution
    at each drafted position and one past the last. ``draft_probs``:
    ``[k, vocab]``, the distribution each draft token was drawn from, or
    ``None`` for a deterministic proposer (prompt lookup: q is one-hot on the
    proposal). Emits the accepted drafts, then either a token from the
    residual at the first rejection or a bonus token from the last row:
    between 1 and k + 1 tokens.
    """
    import torch
    k = len(draft_tokens)
    if target_probs.shape[0] != k + 1:
        raise ValueError(f"need k + 1 = {k + 1} target rows for {k} draft tokens, got {target_probs.shape[0]}")
    if draft_probs is not None and draft_probs.shape[0] != k:
        raise ValueError(f"need one draft row per draft token ({k}), got {draft_probs.shape[0]}")
    out: list[int] = []
    for i, x in enumerate(draft_tokens):
        p = target_probs[i]
        px = float(p[x])
        qx = 1.0 if draft_probs is None else float(draft_probs[i, x])
        if qx <= 0:
            raise ValueError(f"draft token {x} at position {i} has draft probability 0: "
                             f"it cannot have been drawn from those probabilities")
        if px >= qx or float(torch.rand((), generator=generator)) < px / qx:
            out.append(int(x))
            continue
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[x] = 1.0
        else:
            q = draft_probs[i]
        residual = (p - q).clamp_min(0)
        total = float(residual.sum())
        # rounding can leave nothing when p == q; then p itself is the residual's limit
        row = residual / total if total > 0 else p
        out.append(int(torch.multinomial(row, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(target_probs[k], 1, generator=generator)))
    return out


# ---------------------------------------------------------------- proposers

class NgramProposer:
    """Prompt lookup: find an earlier occurrence of the text's last n tokens
    (n from ``max_n`` down to ``min_n``) and propose what followed it.

    Among the matches of the longest n that matches, the latest one with k
    tokens after it wins; when none has k, the one with the most (the latest
    on ties). The latest match alone can sit so close to the end that fewer
    than k tokens follow it: in a loop of period 2, it would propose 2 tokens
    of 4, where the match one period earlier proposes all 4.

    No model and no cost beyond a scan; it pays when the answer repeats its
    input (editing code, quoting a document) or itself. Proposes nothing when
    no n-gram matches.
    """

    deterministic = True

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, token_ids: Sequence[int], k: int, params=None, generator=None):
        ids = list(token_ids)
        if k <= 0:
            return [], None
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            tail = ids[-n:]
            best: list[int] = []
            for start in range(len(ids) - n - 1, -1, -1):  # latest match first
                if ids[start:start + n] == tail:
                    follow = ids[start + n:start + n + k]
                    if len(follow) > len(best):
                        best = follow
                        if len(best) == k:
                            break
            if best:
                return best, None
        return [], None

    def reset(self) -> None:
        pass


class DraftModelProposer:
    """A small model with the target's tokenizer drafts k tokens, one pass each.

    It keeps its own contiguous cache and the ids it covers; a call with a
    context that diverges from them (rejected drafts) crops the cache back to
    the common prefix, so rollback costs nothing but the crop.
    """

    deterministic = False

    def __init__(self, model, max_len: int | None = None):
        self.model = model.eval()
        self.max_len = max_len or model.config.max_position_embeddings
        self.reset()

    def reset(self) -> None:
        self.cache = self.model.new_cache(1, self.max_len)
        self.cached_ids: list[int] = []

    def propose(self, token_ids: Sequence[int], k: int, params=None, generator=None):
        import torch
        from servelab.sampling import SamplingParams, sample, sampling_probs
        params = params or SamplingParams(temperature=0.0)
        ids = list(token_ids)
        k = min(k, self.max_len - len(ids))
        if k <= 0:
            return [], None
        common = 0
        for a, b in zip(self.cached_ids, ids[:-1]):
            if a != b:
                break
            common += 1
        self.cache.crop(common)
        self.cached_ids = self.cached_ids[:common]
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            feed = ids[common:]
            tokens, rows = [], []
            for _ in range(k):
                logits = self.model(torch.tensor([feed], device=device), cache=self.cache)[0, -1]
                self.cached_ids.extend(feed)
                probs = sampling_probs(logits, params)
                x = int(sample(logits, params, generator))
                tokens.append(x)
                rows.append(probs)
                feed = [x]
        return tokens, torch.stack(rows)


# ---------------------------------------------------------------- workloads

COPY_MARKER = "\n# ---- the same code again, unchanged ----\n"


def code_windows(n: int, chars: int) -> list[str]:
    """``n`` windows of about ``chars`` characters of held-out ("val") corpus code,
    cut at line starts, from different parts of the files."""
    from servelab import corpus
    out: list[str] = []
    for _, _, text in corpus.load_documents("val", "code"):
        lines, start = text.splitlines(keepends=True), 0
        while start < len(lines) and len(out) < n:
            chunk, size = [], 0
            while start < len(lines) and size < chars:
                chunk.append(lines[start])
                size += len(lines[start])
                start += 1
            window = "".join(chunk)
            if window.strip() and window.count("\n") >= 4:
                out.append(window)
            start += 40
        if len(out) >= n:
            break
    return out


def edit_prompt(window: str) -> str:
    """A prompt whose answer repeats it: the code, a comment saying it comes again,
    and its first line (what prompt lookup feeds on)."""
    return window + COPY_MARKER + window.splitlines(keepends=True)[0]


# ---------------------------------------------------------------- the batch-of-one loop

@dataclass
class SpecStats:
    """What a speculative run did: passes, proposals, acceptance by position, time.

    A draft position is *reached* when every draft before it was accepted; the
    acceptance rate a of the formula is accepted / reached (positions after a
    rejection are never judged, so counting them would understate a).
    """

    target_passes: int = 0
    draft_steps: int = 0
    proposed: int = 0
    accepted: int = 0
    reached_at: list[int] = field(default_factory=list)   # rounds that judged draft position i
    accepted_at: list[int] = field(default_factory=list)  # rounds that accepted draft position i
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    prefill_seconds: float = 0.0
    proposal_lengths: list[int] = field(default_factory=list)  # drafts offered in each round

    def record(self, num_proposed: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_proposed:
            raise ValueError(f"accepted {num_accepted} of {num_proposed} proposals?")
        grow = num_proposed - len(self.reached_at)
        if grow > 0:
            self.reached_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(min(num_accepted + 1, num_proposed)):
            self.reached_at[i] += 1
            self.accepted_at[i] += i < num_accepted
        self.proposed += num_proposed
        self.accepted += num_accepted
        self.proposal_lengths.append(num_proposed)

    @property
    def reached(self) -> int:
        return sum(self.reached_at)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / judged drafts: the a of :func:`expected_tokens_per_pass`."""
        return self.accepted / self.reached if self.reached else 0.0

    def predicted_tokens_per_pass(self, a: float | None = None) -> float:
        """The formula averaged over the rounds as they were offered: a prompt-lookup
        round with no match offers 0 drafts and yields 1 token, whatever a is."""
        a = self.acceptance_rate if a is None else a
        n = len(self.proposal_lengths)
        return sum(expected_tokens_per_pass(a, k) for k in self.proposal_lengths) / n if n else 0.0

    @property
    def acceptance_by_position(self) -> list[float | None]:
        """P(draft i accepted | drafts before it accepted); None where never reached."""
        return [a / r if r else None for a, r in zip(self.accepted_at, self.reached_at)]


@dataclass
class SpecResult:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stop_reason: object
    stats: SpecStats

    @property
    def tokens_per_pass(self) -> float:
        return len(self.token_ids) / max(self.stats.target_passes, 1)


def speculative_generate(target, tokenizer, prompt, proposer, num_speculative_tokens: int = 4,
                         sampling=None, max_new_tokens: int | None = None,
                         acceptance: Callable = accept_tokens) -> SpecResult:
    """Generate with speculative decoding, batch of one, over contiguous caches.

    Invariant: the target's cache holds every token but the last one emitted
    (``pending``); each round feeds ``[pending, x1..xk]`` in one pass, giving
    the k + 1 rows the rule needs, then crops the cache to the kept tokens.
    With ``temperature=0`` the tokens equal :func:`servelab.generation.generate`'s.
    ``acceptance`` is swappable so tests can show a wrong rule changes the
    output distribution.

    The stop rules are :func:`~servelab.generation.generate`'s and the
    engine's (:class:`servelab.engine.stop.StopChecker`), applied token by
    token through each round's kept tokens: end and stop tokens, stop strings
    (``include_stop_str_in_output`` too), ``min_tokens`` (end and stop tokens
    are masked out of the target's rows before it, so they are never accepted)
    and ``max_tokens``. The text grows by incremental detokenization, so each
    token costs the same whatever the length of the output.
    """
    import torch
    from servelab.engine.detokenizer import IncrementalDetokenizer
    from servelab.engine.sampler import suppress_tokens
    from servelab.engine.stop import StopChecker
    from servelab.generation import _eos_ids, encode_prompt
    from servelab.sampling import SamplingParams, apply_penalties, make_generator, sampling_probs

    params = sampling if sampling is not None else SamplingParams(temperature=0.0)
    if max_new_tokens is not None:
        params = SamplingParams(**{**params.__dict__, "max_tokens": max_new_tokens})
    params.validate()
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    if params.n != 1:
        raise ValueError(f"speculative_generate makes one completion; got n={params.n}. "
                         "For n completions use LLM(..., speculative_config=...)")
    prompt_ids = encode_prompt(tokenizer, prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one token")
    if params.stop and tokenizer is None:
        raise ValueError(f"stop strings {params.stop!r} need a tokenizer to decode the text")
    checker = StopChecker(params, _eos_ids(target, tokenizer, None))
    detok = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
    generator = make_generator(params.seed)
    device = next(target.parameters()).device
    max_len = len(prompt_ids) + params.max_tokens + num_speculative_tokens + 1
    cache = target.new_cache(1, max_len)
    stats = SpecStats()
    proposer.reset()

    def append(token: int):
        """One kept token through the stop rules, in the engine's order:
        ``(finish_reason, stop_reason, end of the text)`` if it ends the output."""
        out.append(token)
        context.append(token)
        hit = checker.check_token(token, len(out))  # end or stop token: in the ids, not the text
        if hit is None and detok is not None:
            before = len(detok.text)
            detok.add(token)
            found = checker.check_text(detok.text, before, len(out))
            if found is not None:
                return "stop", found[1], found[0]
        finish, reason = hit if hit is not None else (checker.check_length(len(out), len(context)), None)
        if finish is None:
            return None
        if detok is not None:
            before = len(detok.text)
            detok.flush()  # the end: show any half-decoded character as is
            found = checker.check_text(detok.text, before, len(out))
            if found is not None:  # the flushed characters completed a stop string
                return "stop", found[1], found[0]
        return finish, reason, None

    with torch.inference_mode():
        t0 = time.perf_counter()
        if len(prompt_ids) > 1:
            target(torch.tensor([prompt_ids[:-1]], device=device), cache=cache)
        stats.prefill_seconds = time.perf_counter() - t0
        context = list(prompt_ids)
        out: list[int] = []
        ended = None
        while ended is None:
            k = min(num_speculative_tokens, params.max_tokens - len(out) - 1)
            t0 = time.perf_counter()
            drafts, q = proposer.propose(context, k, params, generator) if k > 0 else ([], None)
            t1 = time.perf_counter()
            if not getattr(proposer, "deterministic", False):
                stats.draft_steps += len(drafts)
            base = cache.length
            logits = target(torch.tensor([[context[-1]] + list(drafts)], device=device), cache=cache)[0]
            banned = [checker.suppressed_token_ids(len(out) + i) for i in range(logits.shape[0])]
            if params.has_penalties:  # row i follows the output so far and the first i drafts
                logits = torch.stack([apply_penalties(row, prompt_ids, out + list(drafts[:i]), params)
                                      for i, row in enumerate(logits)])
            p = sampling_probs(suppress_tokens(logits, banned), params)  # min_tokens: never drawn
            emitted = acceptance(drafts, p, q, generator)
            t2 = time.perf_counter()
            stats.draft_seconds += t1 - t0
            stats.target_seconds += t2 - t1
            stats.target_passes += 1
            stats.record(len(drafts), len(emitted) - 1)
            cache.crop(base + len(emitted))  # pending + accepted drafts; the last emitted is the new pending
            for token in emitted:  # a stop inside the accepted run ends the output there
                ended = append(int(token))
                if ended is not None:
                    break
    finish, reason, end = ended
    text = "" if detok is None else detok.text[:end]
    return SpecResult(prompt_ids, out, text, finish, reason, stats)
