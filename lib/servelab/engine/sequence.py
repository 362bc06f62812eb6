"""One request inside the engine: its tokens, its state, its clock.

A :class:`Sequence` is the engine's whole memory of a request. The scheduler
needs only two numbers to plan a step for it:

* ``num_tokens`` - prompt plus everything generated so far, and
* ``num_computed_tokens`` - how many of those already have K/V in the cache.

Their difference is the work left: many tokens while the prompt is being
prefilled (perhaps in chunks), exactly one while decoding. So there is no
separate "prefill" and "decode" mode: a step gives each sequence some of its
missing tokens, and a sequence whose cache catches up with its tokens gets a
new token sampled. Preemption by recompute simply sets ``num_computed_tokens``
back to zero.
"""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from servelab.paged import BlockTable

__all__ = ["SequenceStatus", "RequestMetrics", "Sequence", "CompletionOutput", "RequestOutput",
           "LazyRequestOutput"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Wall-clock times (``time.perf_counter`` seconds) of a request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per output token
    finished_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (first admission)

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


_counter = itertools.count()


class Sequence:
    """A request's state. ``token_ids`` = prompt + output, growing by one per decode."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: Any,
                 block_size: int, *, prompt: str | None = None, arrival_time: float | None = None,
                 max_len: int | None = None, cache_salt: str | None = None, generator=None):
        self.request_id = request_id
        self.order = next(_counter)  # tie-breaker: admission order
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table = BlockTable(block_size)
        self.max_len = max_len  # hard cap on prompt + output (context and pool)
        self.cache_salt = cache_salt
        self.generator = generator  # torch.Generator for seeded sampling, or None
        self.stop_checker = None  # servelab.engine.stop.StopChecker, set by the engine
        n = getattr(sampling_params, "logprobs", None)
        # the model's log-probability of each output token, and the n best alternatives, if asked
        self.logprobs: list[float] | None = [] if n is not None else None
        self.top_logprobs: list[list[tuple[int, float]]] | None = [] if n else None
        self.finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
        self.stop_reason: int | str | None = None  # the stop token id or stop string
        self.error: str | None = None  # why it ended, when finish_reason == "error"
        self.parent_id: str | None = None  # n > 1: the request this is one completion of
        self.index = 0                     # ... and which one
        self.metrics = RequestMetrics(arrival_time if arrival_time is not None else time.perf_counter())
        # detokenization / streaming state
        self.output_text = ""
        self.emitted_text_len = 0
        self.emitted_token_count = 0

    # -- sizes --------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """Still computing prompt (or, after preemption, recomputing) tokens."""
        return self.num_uncomputed_tokens > 1 or self.num_computed_tokens < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table.block_ids})")


@dataclass
class CompletionOutput:
    """One generated continuation (vLLM's shape)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None (not finished)
    stop_reason: int | str | None = None
    logprobs: list[float] | None = None  # per output token, when SamplingParams.logprobs is set
    top_logprobs: list[list[tuple[int, float]]] | None = None  # (token id, logprob), best first


@dataclass
class RequestOutput:
    """What the engine reports for a request: the whole output so far, and what is new.

    ``outputs[0]`` holds the full text and token ids; ``delta_text`` and
    ``delta_token_ids`` are the part new since the previous report (streaming).
    With ``n > 1`` a running report carries the one completion ``index`` it is
    about, and the finished report all n (``outputs[i].index == i``).
    ``error`` is set, with ``finish_reason == "error"``, for a rejected request.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    index: int = 0  # n > 1: which completion the delta (and metrics) belong to

    # shortcuts for the single-output case
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


class LazyRequestOutput(RequestOutput):
    """A :class:`RequestOutput` for a request still running, whose ``outputs`` (the
    whole text and token list so far) are built only if someone reads them.

    ``step()`` reports every request that got a token; most callers read only
    the deltas, or only the finished outputs. Copying a growing token list per
    token per request would make a long answer cost O(length^2), so the engine
    snapshots the *lengths* (tokens are only appended) and slices on demand:
    reading it later gives what it held when it was made. Finished requests and
    streaming callbacks get a plain, eagerly built :class:`RequestOutput`.
    """

    def __init__(self, seq: "Sequence", num_output_tokens: int, text_len: int, delta_text: str,
                 delta_token_ids: list[int]):
        self.request_id = seq.parent_id or seq.request_id
        self.index = seq.index
        self.prompt = seq.prompt
        self.prompt_token_ids = seq.prompt_token_ids
        self.finished = False
        self.metrics = seq.metrics
        self.delta_text = delta_text
        self.delta_token_ids = delta_token_ids
        self.error = None
        self._source = (seq, num_output_tokens, text_len)
        self._outputs = None

    @property
    def outputs(self) -> list[CompletionOutput]:
        if self._outputs is None:
            seq, n, text_len = self._source
            p = seq.num_prompt_tokens
            self._outputs = [CompletionOutput(
                seq.index, seq.output_text[:text_len], seq.token_ids[p:p + n], None, None,
                None if seq.logprobs is None else seq.logprobs[:n],
                None if seq.top_logprobs is None else seq.top_logprobs[:n])]
        return self._outputs

    @outputs.setter
    def outputs(self, value) -> None:
        self._outputs = value
