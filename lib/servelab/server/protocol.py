"""The OpenAI request and response shapes, checked field by field.

:func:`parse_request` turns a decoded JSON body into a :class:`ParsedRequest`
(prompt token ids + :class:`~servelab.sampling.SamplingParams` + streaming
options) or raises :class:`~servelab.server.errors.APIError` naming the field.
The ``chunk``/``response`` builders write OpenAI's shapes back. Nothing here
touches HTTP or the engine, so every rule is testable on its own.

Chat prompts use the course tokenizer's chat template: each message is
``<|role|>`` + newline + content + ``<|end|>`` + newline, and the prompt ends
with ``<|assistant|>`` + newline. Role markers are single special tokens;
message *content* is encoded as plain text, so a user who types ``<|end|>``
cannot forge a turn. A chat reply ends at ``<|end|>`` (or the end token).
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from servelab.server.errors import APIError, bad_request

__all__ = ["Limits", "ParsedRequest", "parse_request", "encode_chat", "max_prompt_chars", "CHAT_ROLES", "MAX_N",
           "MAX_STOP_STRINGS", "MAX_TOP_LOGPROBS", "MAX_LOGPROBS_COMPLETIONS"]

CHAT_ROLES = ("system", "user", "assistant")
#: OpenAI's limits: at most 4 stop sequences; chat ``top_logprobs`` 0..20;
#: completions ``logprobs`` 0..5; temperature 0..2.
MAX_STOP_STRINGS = 4
MAX_TOP_LOGPROBS = 20
MAX_LOGPROBS_COMPLETIONS = 5
MAX_TEMPERATURE = 2.0
#: The largest ``repetition_penalty`` accepted (vLLM's extension; 1 = off, 1.1-1.3 is typical).
MAX_REPETITION_PENALTY = 10.0
#: Most completions one request may ask for (``n``); each is a sequence of its own.
MAX_N = 16
#: Fields OpenAI defines that this server does not implement: refused unless at their default.
_UNSUPPORTED = {"logit_bias": None, "best_of": 1,
                "echo": False, "suffix": None, "tools": None, "functions": None,
                "response_format": None}


@dataclass(frozen=True)
class Limits:
    """What the served engine can hold."""

    model: str
    max_model_len: int          # the context: prompt + output
    pool_tokens: int            # the whole KV pool, in token slots
    vocab_size: int
    default_max_tokens: int = 16  # /v1/completions default (OpenAI's); chat: what the context leaves
    max_prompt_chars: int | None = None  # a longer prompt cannot fit the context: refused untokenized


def max_prompt_chars(tokenizer, max_model_len: int) -> int | None:
    """The most characters a prompt that fits ``max_model_len`` tokens can have.

    A token covers at most the bytes of the longest token in the vocabulary (or the
    longest special token's text), and a character is at least one byte, so a prompt
    of more characters than ``max_model_len`` times that needs more tokens than the
    context holds: it can be refused by its length alone, before any tokenizing.
    None when the tokenizer does not list its tokens' bytes.
    """
    ranks = getattr(tokenizer, "mergeable_ranks", None)
    if not ranks:
        return None
    longest = max(len(t) for t in ranks)
    longest = max([longest, *(len(s) for s in (getattr(tokenizer, "special_tokens", None) or {}))])
    return max_model_len * longest


def _check_chars(n_chars: int, limits: "Limits | None", param: str) -> None:
    limit = None if limits is None else limits.max_prompt_chars
    if limit is not None and n_chars > limit:
        raise bad_request(f"the prompt has {n_chars:,} characters; no prompt longer than {limit:,} "
                          f"characters fits this model's maximum context length of "
                          f"{limits.max_model_len} tokens; shorten it", param, "context_length_exceeded")


@dataclass
class ParsedRequest:
    kind: str                        # "completion" | "chat"
    model: str
    prompt_token_ids: list[int]
    sampling_params: Any             # servelab.sampling.SamplingParams
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None      # alternatives per token to report (None: no logprobs)
    user: str | None = None
    return_timings: bool = False     # extension: server-side stage timestamps in the response
    n: int = 1                       # completions of the prompt (choices[i].index = i)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.request_id

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"


# --------------------------------------------------------------------- fields
def _type_name(v) -> str:
    return "null" if v is None else type(v).__name__


def _get_int(body: dict, name: str, default, lo=None, hi=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{name}' must be an integer, got {_type_name(v)} {v!r}", name, "invalid_type")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad_request(f"'{name}' must be {rng}, got {v}", name)
    return v


def _get_float(body: dict, name: str, default, lo, hi, lo_open=False):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad_request(f"'{name}' must be a number, got {_type_name(v)} {v!r}", name, "invalid_type")
    v = float(v)
    bad = not math.isfinite(v) or v > hi or (v <= lo if lo_open else v < lo)
    if bad:
        left = "(" if lo_open else "["
        raise bad_request(f"'{name}' must be in {left}{lo:g}, {hi:g}], got {v!r}", name)
    return v


def _get_bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"'{name}' must be true or false, got {_type_name(v)} {v!r}", name, "invalid_type")
    return v


def _stop_list(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or any(not isinstance(s, str) for s in stop):
        raise bad_request(f"'stop' must be a string or a list of strings, got {stop!r}", "stop", "invalid_type")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(stop)}", "stop")
    if any(s == "" for s in stop):
        raise bad_request("'stop' strings must not be empty", "stop")
    return stop


def encode_chat(tokenizer, messages, limits: Limits | None = None) -> list[int]:
    """Token ids of a chat in the course template (role markers as special ids,
    content as plain text), ending with the assistant's marker. With ``limits``, a
    chat whose text is too long to fit is refused before any of it is tokenized."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} objects",
                          "messages", "invalid_type")
    special = tokenizer.special_tokens
    turns: list[tuple[str, str]] = []
    for k, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise bad_request(f"messages[{k}] must be an object with 'role' and 'content', got "
                              f"{_type_name(msg)}", f"messages[{k}]", "invalid_type")
        role = msg.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(f"messages[{k}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}",
                              f"messages[{k}].role")
        content = msg.get("content")
        if isinstance(content, list):  # OpenAI's content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad_request(f"messages[{k}].content parts must all be {{\"type\": \"text\", "
                                  f"\"text\": ...}}; this model reads text only",
                                  f"messages[{k}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad_request(f"messages[{k}].content must be a string, got {_type_name(content)}",
                              f"messages[{k}].content", "invalid_type")
        turns.append((role, content))
    _check_chars(sum(len(c) for _, c in turns), limits, "messages")
    ids: list[int] = []
    for role, content in turns:
        ids.append(special[f"<|{role}|>"])
        ids.extend(tokenizer.encode_ordinary("\n" + content))
        ids.append(special["<|end|>"])
        ids.extend(tokenizer.encode_ordinary("\n"))
    ids.append(special["<|assistant|>"])
    ids.extend(tokenizer.encode_ordinary("\n"))
    return ids


def _completion_prompt(tokenizer, prompt, limits: Limits) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if prompt == "":
            raise bad_request("'prompt' is empty; send at least one character", "prompt")
        _check_chars(len(prompt), limits, "prompt")
        return list(tokenizer.encode(prompt, allowed_special="all"))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in prompt):
        vocab_size = limits.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise bad_request(f"'prompt' token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                              "prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request(f"'prompt' holds {len(prompt)} prompts; this server takes one prompt per "
                          "request: send them as separate requests (they run concurrently)", "prompt")
    raise bad_request(f"'prompt' must be a string or a list of token ids, got {_type_name(prompt)}",
                      "prompt", "invalid_type")


# -------------------------------------------------------------------- parsing
def parse_request(body: Any, kind: str, tokenizer, limits: Limits) -> ParsedRequest:
    """Check an OpenAI completions (``kind="completion"``) or chat body and build the request."""
    from servelab.sampling import SamplingParams

    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_type_name(body)}", None,
                          "invalid_type")
    model = body.get("model")
    if model is None:
        raise bad_request("'model' is required: name the model to use (GET /v1/models lists it)",
                          "model", "missing_required_parameter")
    if not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {_type_name(model)}", "model", "invalid_type")
    if model != limits.model:
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{limits.model}'",
                       "model", "model_not_found")
    for name, default in _UNSUPPORTED.items():
        v = body.get(name)
        if v is not None and v != default and not (default is None and v in ({}, [])):
            raise bad_request(f"'{name}' is not supported by this server; leave it out "
                              f"(or at {default!r})", name, "unsupported_parameter")
    n = _get_int(body, "n", 1, 1, MAX_N)

    if kind == "chat":
        if "messages" not in body:
            raise bad_request("'messages' is required for /v1/chat/completions", "messages",
                              "missing_required_parameter")
        ids = encode_chat(tokenizer, body["messages"], limits)
    else:
        if "prompt" not in body:
            raise bad_request("'prompt' is required for /v1/completions", "prompt",
                              "missing_required_parameter")
        ids = _completion_prompt(tokenizer, body["prompt"], limits)

    context = min(limits.max_model_len, limits.pool_tokens)
    if len(ids) >= limits.pool_tokens:
        raise bad_request(f"the prompt has {len(ids)} tokens but the whole KV cache pool holds "
                          f"{limits.pool_tokens} tokens; shorten the prompt or start the server with "
                          "more --kv-blocks", "messages" if kind == "chat" else "prompt",
                          "context_length_exceeded")
    if len(ids) >= limits.max_model_len:
        raise bad_request(f"This model's maximum context length is {limits.max_model_len} tokens, "
                          f"but the prompt alone has {len(ids)} tokens; shorten it",
                          "messages" if kind == "chat" else "prompt", "context_length_exceeded")

    max_tokens = _get_int(body, "max_tokens", None, 1)
    mct = _get_int(body, "max_completion_tokens", None, 1)
    param = "max_tokens"
    if mct is not None:
        if max_tokens is not None and max_tokens != mct:
            raise bad_request(f"'max_tokens' ({max_tokens}) and 'max_completion_tokens' ({mct}) "
                              "disagree; send one of them", "max_completion_tokens")
        max_tokens, param = mct, "max_completion_tokens"
    if max_tokens is None:
        max_tokens = limits.default_max_tokens if kind == "completion" else context - len(ids)
        max_tokens = max(1, min(max_tokens, context - len(ids)))
    if len(ids) + max_tokens > context:
        which = ("maximum context length" if context == limits.max_model_len
                 else "KV cache pool (the most one sequence can hold)")
        raise bad_request(f"This model's {which} is {context} tokens. However, you requested "
                          f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} in "
                          f"'{param}'). Lower '{param}' to at most {context - len(ids)}",
                          param, "context_length_exceeded")

    temperature = _get_float(body, "temperature", 1.0, 0.0, MAX_TEMPERATURE)
    top_p = _get_float(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = _get_int(body, "top_k", 0, -1, limits.vocab_size)
    if top_k == -1:
        top_k = 0  # vLLM's spelling of "off"
    seed = _get_int(body, "seed", None, 0, 2 ** 63 - 1)
    presence = _get_float(body, "presence_penalty", 0.0, -2.0, 2.0)    # OpenAI's range
    frequency = _get_float(body, "frequency_penalty", 0.0, -2.0, 2.0)
    min_p = _get_float(body, "min_p", 0.0, 0.0, 1.0)                    # vLLM's extensions
    repetition = _get_float(body, "repetition_penalty", 1.0, 0.0, MAX_REPETITION_PENALTY, lo_open=True)
    stop = _stop_list(body)
    stream = _get_bool(body, "stream", False)
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_request("'stream_options' must be an object like {\"include_usage\": true}",
                              "stream_options", "invalid_type")
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        include_usage = _get_bool(opts, "include_usage", False)

    if kind == "chat":
        want = _get_bool(body, "logprobs", False)
        top = _get_int(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
        if top is not None and not want:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = (top or 0) if want else None
    else:
        logprobs = _get_int(body, "logprobs", None, 0, MAX_LOGPROBS_COMPLETIONS)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request(f"'user' must be a string, got {_type_name(user)}", "user", "invalid_type")
    timings = _get_bool(body, "return_timings", False)
    ignore_eos = _get_bool(body, "ignore_eos", False)  # vLLM's extension: exact output lengths

    stop_ids = []
    if kind == "chat" and "<|end|>" in tokenizer.special_tokens:
        stop_ids = [tokenizer.special_tokens["<|end|>"]]
    try:
        sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens,
                            stop=stop, stop_token_ids=stop_ids, seed=seed, logprobs=logprobs,
                            ignore_eos=ignore_eos, min_p=min_p, presence_penalty=presence,
                            frequency_penalty=frequency, repetition_penalty=repetition)
    except ValueError as exc:  # defensive: the checks above should have caught it
        raise bad_request(str(exc)) from exc
    return ParsedRequest(kind, model, ids, sp, stream=stream, include_usage=include_usage,
                         logprobs=logprobs, user=user, return_timings=timings, n=n)


# ------------------------------------------------------------------ responses
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def logprobs_payload(req: ParsedRequest, tokenizer, token_ids, lps, tops, text_offset0: int = 0):
    """OpenAI's logprobs object for some output tokens (chat or legacy completions shape)."""
    if req.logprobs is None or lps is None:
        return None

    def tok(t):
        return tokenizer.decode([t])

    def raw(t):
        return list(tokenizer.token_bytes(t)) if hasattr(tokenizer, "token_bytes") else None

    tops = tops if tops is not None else [[] for _ in token_ids]
    if req.kind == "chat":
        return {"content": [
            {"token": tok(t), "logprob": lp, "bytes": raw(t),
             "top_logprobs": [{"token": tok(a), "logprob": alp, "bytes": raw(a)} for a, alp in alts]}
            for t, lp, alts in zip(token_ids, lps, tops)]}
    offsets, pos = [], text_offset0
    for t in token_ids:
        offsets.append(pos)
        pos += len(tok(t))
    return {"tokens": [tok(t) for t in token_ids], "token_logprobs": list(lps),
            "top_logprobs": [{tok(a): alp for a, alp in alts} for alts in tops] if req.logprobs else None,
            "text_offset": offsets}


def chunk(req: ParsedRequest, text: str, finish_reason: str | None, logprobs=None,
          first: bool = False, stop_reason=None, index: int = 0) -> dict:
    """One streamed chunk (``chat.completion.chunk`` or ``text_completion``) of choice ``index``."""
    if req.kind == "chat":
        delta: dict = {}
        if first:
            delta["role"] = "assistant"
        if text or not first:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "text_completion"
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason  # vLLM's extension: the stop string or token id
    return {"id": req.response_id, "object": obj, "created": req.created, "model": req.model,
            "choices": [choice]}


def usage_chunk(req: ParsedRequest, use: dict) -> dict:
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return {"id": req.response_id, "object": obj, "created": req.created, "model": req.model,
            "choices": [], "usage": use}


def choice(req: ParsedRequest, text: str, finish_reason: str, logprobs=None, stop_reason=None,
           index: int = 0) -> dict:
    """One entry of a whole response's ``choices``."""
    if req.kind == "chat":
        return {"index": index, "message": {"role": "assistant", "content": text},
                "logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def response(req: ParsedRequest, choices: list, use: dict) -> dict:
    """The whole (non-streamed) response: ``choices`` built with :func:`choice`, one per
    completion (``n`` of them), and the usage."""
    return {"id": req.response_id, "object": req.object_name, "created": req.created,
            "model": req.model, "choices": choices, "usage": use}
