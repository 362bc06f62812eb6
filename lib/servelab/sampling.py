"""From a row of scores to one token: temperature, top-k, top-p, seeded draws, logprobs.

The model's last layer gives one score (logit) per vocabulary entry. Sampling
turns that row into a token id in four steps, in the order vLLM applies them:

1. **temperature** divides the logits (``T < 1`` sharpens, ``T > 1`` flattens;
   ``T = 0`` means "take the argmax", i.e. greedy);
2. **top-k** keeps the ``k`` highest scores;
3. **top-p** keeps the smallest set of tokens whose probabilities sum to at
   least ``p`` (the "nucleus");
4. a draw from the softmax of what is left, with the request's own
   ``torch.Generator`` so that a fixed ``seed`` gives the same answer every time.

Conventions: ``top_k = 0`` disables top-k (vLLM also accepts ``-1``; here a
negative value is an error, to keep one spelling); ``top_p = 1.0`` disables
top-p. Logprobs are reported from the model's raw distribution (log-softmax of
the unmodified logits), as vLLM does by default, so they do not depend on the
sampling settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

__all__ = [
    "SamplingParams",
    "check_max_tokens",
    "apply_temperature",
    "top_k_filter",
    "top_p_filter",
    "min_p_filter",
    "apply_penalties",
    "sampling_probs",
    "sample",
    "sample_batch",
    "make_generator",
    "logprobs",
    "top_logprobs",
]


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop (vLLM's field names).

    ``temperature``: 0 = greedy; must be >= 0.
    ``top_k``: keep the k best tokens; 0 = off.
    ``top_p``: nucleus mass in (0, 1]; 1 = off.
    ``max_tokens``: new tokens at most.
    ``stop``: strings that end generation (not included in the returned text).
    ``stop_token_ids``: extra token ids that end generation (the model's end token always does
    unless ``ignore_eos``).
    ``seed``: per-request seed; ``None`` draws from torch's global generator.
    ``logprobs``: how many top alternatives to report per generated token (``None`` = none;
    0 = only the chosen token's logprob).
    ``min_tokens``: new tokens before the end token, a stop token or a stop string may end
    the output (end and stop tokens are not drawn before that).
    ``include_stop_str_in_output``: keep the stop string that ended the output in its text.
    ``n``: completions of the one prompt (the engine fans the request out into n
    sequences that share the prompt's cached blocks; single-sequence ``generate``
    accepts only 1).
    ``detokenize``: ``False`` returns token ids only, with empty text (vLLM's field; stop
    strings then cannot be used, as there).
    ``min_p``: keep only tokens at least ``min_p`` times as likely as the favourite (after the
    temperature); 0 = off.
    ``presence_penalty``, ``frequency_penalty`` (OpenAI's, in [-2, 2]): subtract from a token's
    logit once if it already appears in the output, and per time it appears; 0 = off.
    ``repetition_penalty`` (Hugging Face's and vLLM's, > 0): divide a positive logit, multiply a
    negative one, for every token already in the prompt or the output; 1 = off. The
    penalties change greedy choices too (:func:`apply_penalties`).
    The rules themselves live in :class:`servelab.engine.stop.StopChecker`.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    n: int = 1
    detokenize: bool = True
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.validate()

    def validate(self) -> "SamplingParams":
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0 or self.temperature != self.temperature:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p!r}")
        check_max_tokens(self.max_tokens)
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], "
                             f"got {self.min_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs must be None or an integer >= 0, got {self.logprobs!r}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"n (completions per prompt) must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.detokenize, bool):
            raise ValueError(f"detokenize must be True or False, got {self.detokenize!r}")
        if not _number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _number(v) or not -2 <= v <= 2:
                raise ValueError(f"{name} must be in [-2, 2] (0 disables it), got {v!r}")
        if not _number(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 disables it), got {self.repetition_penalty!r}")
        if self.stop and not self.detokenize:
            raise ValueError(f"stop strings {self.stop!r} need text, but detokenize=False; "
                             "use stop_token_ids, or detokenize=True")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def check_max_tokens(max_tokens) -> int:
    """``max_tokens`` must be an integer >= 1 everywhere (``SamplingParams``, the
    engine, ``generate``), as in vLLM: asking for no tokens is an error, not a no-op."""
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}; "
                         "a request that wants no new token has nothing to run")
    return max_tokens


# ------------------------------------------------------------------ the steps

def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide by the temperature. ``temperature`` must be > 0 here (0 is handled as greedy)."""
    if temperature <= 0:
        raise ValueError(f"apply_temperature needs temperature > 0, got {temperature}; use greedy for 0")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set all but the ``k`` largest logits of each row to -inf (``k = 0``: unchanged).

    Ties at the k-th value are all kept, so the result never depends on sort order.
    """
    if k < 0:
        raise ValueError(f"top_k must be >= 0, got {k}")
    if k == 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of highest-probability tokens whose mass reaches ``p``.

    Sort descending, take the cumulative probability, and drop a token when the
    mass *before* it already reaches ``p`` -- so the token that crosses the line
    is kept and at least one token always survives.
    """
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    if p == 1:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # ties: lower id first
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep the tokens at least ``min_p`` times as likely as each row's favourite (``0``: unchanged).

    Unlike top-p, the cut follows the model's confidence: a sure row keeps few tokens, a
    flat row many.
    """
    if not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    if min_p == 0:
        return logits
    probs = torch.softmax(logits.float(), dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))


def apply_penalties(logits: torch.Tensor, prompt_ids, output_ids, params: SamplingParams) -> torch.Tensor:
    """One ``[vocab]`` row with ``params``' penalties applied, given what came before.

    ``repetition_penalty`` r acts on every token already in the prompt or the output: a
    positive logit is divided by r, a negative one multiplied (so r > 1 always makes it less
    likely). ``frequency_penalty`` subtracts its value per time a token appears in the
    output, ``presence_penalty`` once if it appears at all. The order and the split between
    prompt and output are vLLM's. Returns ``logits`` itself when no penalty is set.
    """
    if not params.has_penalties:
        return logits
    vocab, device = logits.shape[-1], logits.device
    # rebuilt from the id lists each call: O(context) a token, fine at the course's sizes
    out = torch.tensor([t for t in output_ids if 0 <= t < vocab], dtype=torch.long, device=device)
    counts = torch.bincount(out, minlength=vocab).float()
    logits = logits.float().clone()
    if params.repetition_penalty != 1:
        seen = counts > 0
        prompt = [t for t in prompt_ids if 0 <= t < vocab]
        if prompt:
            seen[torch.tensor(prompt, dtype=torch.long, device=device)] = True
        r = params.repetition_penalty
        logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    return logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a token is actually drawn from under ``params`` (fp32), after any
    penalties (:func:`apply_penalties`, applied by the caller, who knows the history).

    For greedy (``temperature = 0``) this is one-hot on the argmax. Otherwise: the
    temperature, then min-p, then top-k, then top-p (vLLM's order).
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = apply_temperature(logits, params.temperature)
    logits = min_p_filter(logits, params.min_p)
    logits = top_k_filter(logits, params.top_k)
    logits = top_p_filter(logits, params.top_p)
    return torch.softmax(logits, dim=-1)


def make_generator(seed: int | None) -> torch.Generator | None:
    """A private generator for one request (``None`` if unseeded: use torch's global one)."""
    return None if seed is None else torch.Generator().manual_seed(int(seed))


def sample(logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick a token id from ``logits`` of shape ``[vocab]`` or ``[batch, vocab]``.

    Returns a long tensor of shape ``[]`` or ``[batch]``. Greedy does not touch
    the generator, so switching temperature does not shift later random draws
    of other requests.
    """
    if params.greedy:
        return logits.argmax(-1)
    probs = sampling_probs(logits, params)
    flat = probs.reshape(-1, probs.shape[-1])
    picks = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return picks.reshape(probs.shape[:-1])


def sample_batch(logits: torch.Tensor, params: Sequence[SamplingParams],
                 generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One token per row, each row with its own request's settings and generator.

    This is what an engine needs: requests in one batch have different
    temperatures and seeds, and a seeded request must get the same tokens
    whoever it shares the batch with. Greedy rows take one ``argmax`` together
    (they draw no random numbers); every other row is drawn on its own.
    """
    if not (len(params) == len(generators) == logits.shape[0]):
        raise ValueError(f"need one SamplingParams and one generator per row: got {len(params)}, "
                         f"{len(generators)} for {logits.shape[0]} rows")
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if len(greedy) == len(params):  # the common serving case: one argmax, no indexing
        return logits.argmax(dim=-1)
    out = torch.empty(logits.shape[0], dtype=torch.long)
    if greedy:
        out[greedy] = logits[greedy].argmax(dim=-1)
    for i, p in enumerate(params):
        if not p.greedy:
            out[i] = sample(logits[i], p, generators[i])
    return out


# ------------------------------------------------------------------ logprobs

def logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log-softmax in fp32: the model's own log-probability of every token."""
    return torch.log_softmax(logits.float(), dim=-1)


def top_logprobs(logits: torch.Tensor, n: int, *, normalized: bool = False) -> list[tuple[int, float]]:
    """The ``n`` most likely tokens of one ``[vocab]`` row as ``(token_id, logprob)``.

    ``normalized=True`` says the row already holds log-probabilities (skips the log-softmax).
    """
    if logits.dim() != 1:
        raise ValueError(f"top_logprobs takes one row [vocab], got shape {tuple(logits.shape)}")
    lp = logits.float() if normalized else logprobs(logits)
    values, ids = torch.topk(lp, min(n, lp.shape[-1]))
    return [(int(i), float(v)) for i, v in zip(ids, values)]
