"""One request, start to finish: prefill the prompt, then one forward pass per new token.

``servelab.generate`` is the simplest possible serving loop -- a single
sequence and a contiguous KV cache -- and the reference the engine is checked
against. Every generated token costs a full pass through the model: a
1,000-token answer is 1,000 sequential passes (after one pass for the prompt).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from servelab.sampling import SamplingParams, apply_penalties, make_generator, sample, top_logprobs
from servelab.sampling import logprobs as log_softmax

__all__ = ["GenerationResult", "generate", "encode_prompt", "decode_tokens", "PassTimes",
           "time_passes"]


@dataclass
class GenerationResult:
    """What came back: the new tokens, their text, and why generation stopped.

    ``finish_reason`` is ``"stop"`` (end token, stop token or stop string) or
    ``"length"`` (hit ``max_tokens``), as in the OpenAI API. ``stop_reason`` says
    which stop fired (the stop string or stop token id; ``None`` for the model's
    end token and for ``"length"``), exactly as the engine reports it
    (:class:`servelab.engine.stop.StopChecker` decides for both). The end
    token, when produced, is in ``token_ids`` but not in ``text``; a stop string
    and anything after it are cut from ``text``.
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stop_reason: str | int | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    forward_passes: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids for ``text`` with any tokenizer in the course: servelab's BPE (special
    tokens allowed, so chat templates work), Hugging Face ``tokenizers`` or ``transformers``."""
    try:
        out = tokenizer.encode(text, allowed_special="all")
    except TypeError:
        out = tokenizer.encode(text)
    return list(out.ids) if hasattr(out, "ids") else list(out)


def decode_tokens(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids))


def _eos_ids(model, tokenizer, eos_token_id) -> set[int]:
    if eos_token_id is not None:
        return set(eos_token_id) if isinstance(eos_token_id, (list, tuple, set)) else {eos_token_id}
    config = getattr(model, "config", None)
    ids = set(getattr(config, "eos_token_ids", []) or [])
    if not ids and getattr(tokenizer, "eot_token", None) is not None:
        ids = {tokenizer.eot_token}
    return ids


@torch.no_grad()
def generate(model, tokenizer, prompt: str | Sequence[int], max_new_tokens: int | None = None,
             sampling: SamplingParams | None = None, stop: str | Sequence[str] | None = None,
             eos_token_id: int | Sequence[int] | None = None,
             on_token: Callable[[int, str], None] | None = None) -> GenerationResult:
    """Generate a continuation of ``prompt`` (text, or a list of token ids).

    ``sampling`` defaults to greedy (``temperature=0``). ``max_new_tokens`` and
    ``stop`` override/extend ``sampling.max_tokens`` and ``sampling.stop``.
    Generation ends at the model's end token (``config.eos_token_id``, or the
    tokenizer's ``<|endoftext|>``) unless ``sampling.ignore_eos``, at a stop
    token or string, or after ``max_tokens`` tokens. ``on_token(id, text_so_far)``
    is called after each token, which is all streaming is. ``max_tokens`` (or
    ``max_new_tokens``) below 1 is a ``ValueError``, as in the engine.
    """
    from servelab.engine.sampler import suppress_tokens
    from servelab.engine.stop import StopChecker

    params = sampling if sampling is not None else SamplingParams(temperature=0.0)
    if max_new_tokens is not None or stop:
        extra = [stop] if isinstance(stop, str) else list(stop or [])
        params = SamplingParams(**{**params.__dict__,
                                   "max_tokens": max_new_tokens if max_new_tokens is not None else params.max_tokens,
                                   "stop": list(params.stop) + extra})
    params.validate()
    if params.n != 1:
        raise ValueError(f"generate makes one completion; got n={params.n}. For n completions "
                         "use the engine (LLM.generate or LLMEngine.add_request), which shares "
                         "the prompt's blocks between them")
    prompt_ids = encode_prompt(tokenizer, prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one token (e.g. the <|endoftext|> id)")
    checker = StopChecker(params, _eos_ids(model, tokenizer, eos_token_id))
    generator = make_generator(params.seed)
    device = next(model.parameters()).device

    cache = model.new_cache(batch_size=1, max_len=len(prompt_ids) + params.max_tokens)
    logits = model(torch.tensor([prompt_ids], device=device), cache=cache)[0, -1]   # prefill: one pass
    passes = 1
    out: list[int] = []
    chosen_lp: list[float] | None = [] if params.logprobs is not None else None
    alts: list | None = [] if params.logprobs else None
    text, finish, reason = "", None, None
    while finish is None:
        banned = checker.suppressed_token_ids(len(out))
        shaped = apply_penalties(logits, prompt_ids, out, params)  # no-op without penalties
        token = int(sample(suppress_tokens(shaped[None], [banned])[0], params, generator))
        out.append(token)
        if chosen_lp is not None:
            chosen_lp.append(float(log_softmax(logits)[token]))
        if alts is not None:
            alts.append(top_logprobs(logits, params.logprobs))
        hit = checker.check_token(token, len(out))     # the same rules as the engine's
        if hit is not None:
            finish, reason = hit
            break
        text = decode_tokens(tokenizer, out)
        found = checker.check_text(text, 0, len(out))
        if found is not None:
            end, reason = found
            text, finish = text[:end], "stop"
            break
        if on_token is not None:
            on_token(token, text)
        finish = checker.check_length(len(out), len(prompt_ids) + len(out))
        if finish is None:
            logits = model(torch.tensor([[token]], device=device), cache=cache)[0, -1]  # decode: a pass per token
            passes += 1
    return GenerationResult(prompt_token_ids=prompt_ids, token_ids=out, text=text, finish_reason=finish,
                            stop_reason=reason, logprobs=chosen_lp, top_logprobs=alts, forward_passes=passes)


@dataclass(frozen=True)
class PassTimes:
    """Seconds per forward pass of :func:`generate`, over ``runs`` runs of one request.

    ``prefill_s`` holds one entry per run (the pass over the whole prompt);
    ``decode_s`` one list per run, one entry per decode pass (one new token
    each). Only the model's forward passes are timed, not the draws between them.
    """

    prompt_tokens: int
    new_tokens: int
    prefill_s: tuple[float, ...]
    decode_s: tuple[tuple[float, ...], ...]

    @property
    def prefill_median_s(self) -> float:
        return statistics.median(self.prefill_s)

    @property
    def all_decode_s(self) -> list[float]:
        return [t for run in self.decode_s for t in run]

    @property
    def decode_median_s(self) -> float:
        """The median decode pass over every run: robust to the odd slow pass."""
        return statistics.median(self.all_decode_s)

    def answer_s(self, new_tokens: int) -> float:
        """The loop's cost model: one prefill, then one decode pass per token after the first."""
        if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or new_tokens < 1:
            raise ValueError(f"new_tokens must be an integer >= 1, got {new_tokens!r}")
        return self.prefill_median_s + (new_tokens - 1) * self.decode_median_s


class _TimedModel:
    """A model whose every call (one forward pass) is timed; everything else passes through."""

    def __init__(self, model, clock: Callable[[], float]):
        self._model, self._clock, self.seconds = model, clock, []

    def __call__(self, *args, **kwargs):
        start = self._clock()
        out = self._model(*args, **kwargs)
        self.seconds.append(self._clock() - start)
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


def time_passes(model, tokenizer, prompt: str | Sequence[int], max_new_tokens: int, *,
                runs: int = 3, sampling: SamplingParams | None = None,
                clock: Callable[[], float] = time.perf_counter) -> PassTimes:
    """Time each forward pass of ``generate`` for an answer of exactly ``max_new_tokens``.

    Runs the request ``runs`` times (greedy unless ``sampling`` says otherwise;
    the end token is ignored so every run makes the same number of tokens) and
    returns the prefill pass and every decode pass of each run. A fixed-length
    answer cannot have stop strings or stop tokens: those are a ``ValueError``.
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 2:
        raise ValueError(f"max_new_tokens must be an integer >= 2 (a prefill and at least one "
                         f"decode pass), got {max_new_tokens!r}")
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise ValueError(f"runs must be an integer >= 1, got {runs!r}")
    params = sampling if sampling is not None else SamplingParams(temperature=0.0)
    if params.stop or params.stop_token_ids:
        raise ValueError("time_passes times a fixed-length answer; drop stop and stop_token_ids "
                         f"from sampling (got stop={params.stop!r}, "
                         f"stop_token_ids={params.stop_token_ids!r})")
    params = SamplingParams(**{**params.__dict__, "max_tokens": max_new_tokens,
                               "ignore_eos": True, "min_tokens": 0})
    prefill, decode, prompt_tokens = [], [], 0
    for _ in range(runs):
        timed = _TimedModel(model, clock)
        res = generate(timed, tokenizer, prompt, sampling=params)
        assert res.forward_passes == len(timed.seconds) == max_new_tokens
        prompt_tokens = len(res.prompt_token_ids)
        prefill.append(timed.seconds[0])
        decode.append(tuple(timed.seconds[1:]))
    return PassTimes(prompt_tokens=prompt_tokens, new_tokens=max_new_tokens,
                     prefill_s=tuple(prefill), decode_s=tuple(decode))
