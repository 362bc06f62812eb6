"""The OpenAI-compatible HTTP face of the engine (FastAPI + uvicorn).

``create_app(engine, ...)`` returns a FastAPI app whose lifespan starts and
stops an engine front (:class:`~servelab.server.front.EngineFront`: the engine
as a thread, or its own process). Endpoints:

* ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's fields
  and shapes, streamed as server-sent events (``data: {json}`` lines, then
  ``data: [DONE]``) when ``stream`` is true;
* ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text).

Every refusal is OpenAI's error body with 400/404/413/429/503, and any
unexpected failure a 500 in the same shape. A request is admitted by the
engine before the server answers 200, so a refused one (bad sampling settings,
a dead engine) is an HTTP error, never a 200 followed by an error event, and
the 429 limit counts it from then on. A prompt too long to fit the context is
refused by its character count before it is tokenized; large bodies are
tokenized in a worker thread, so they never stall other streams. A client that
disconnects mid-stream has its request aborted before the next engine step.

Shutting down (``app.state.drain()``, which SIGTERM runs: :mod:`servelab.server.runner`):
new requests get 503 ``shutting_down`` at once (kept-alive connections too),
requests in flight have ``ServerSettings.shutdown_grace_s`` to finish, and the
rest then end cleanly: an error event and ``[DONE]`` for a stream, a 503 body
for the others.

If the engine is lost (the engine-core process dies), its requests fail, /health
says 503, new requests get 503 ``engine_down``, and with
``exit_on_engine_loss`` (the default) the server exits with code 1, so that a
supervisor restarts it (``app.state.engine_lost`` holds the reason).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from servelab.server import protocol
from servelab.server.engine_loop import EngineLoop, Event
from servelab.server.errors import APIError, error_body
from servelab.server.front import EngineFront
from servelab.server.metrics import ServerMetrics

__all__ = ["ServerSettings", "create_app", "sse"]

log = logging.getLogger("servelab.server")


@dataclass
class ServerSettings:
    """Limits of the HTTP layer."""

    model_name: str = "servelab-main"
    max_body_bytes: int = 1_000_000          # larger bodies -> 413
    max_queued_requests: int = 256           # beyond running seats; more -> 429
    retry_after_s: int = 1                   # the 429's Retry-After header
    shutdown_grace_s: float = 5.0            # SIGTERM: time for in-flight requests to finish
    nondisconnect_poll_s: float = 0.25       # non-streamed requests: how often to check the client
    inline_parse_bytes: int = 4096           # larger bodies are checked and tokenized in a worker thread
    exit_on_engine_loss: bool = True         # engine core died: the server exits (code 1)


def sse(payload) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def _timings(req_t: dict, out) -> dict:
    m = out.metrics
    t = dict(req_t)
    if m is not None:
        t.update(arrival=m.arrival_time, first_scheduled=m.first_scheduled_time,
                 first_token=m.first_token_time, finished=m.finished_time,
                 token_times=list(m.token_times), num_preemptions=m.num_preemptions)
    t["sent"] = time.perf_counter()
    return t


class _Stream(StreamingResponse):
    """A streamed response that calls ``closed()`` when it ends, however it ends: also when
    the client left before its first byte (the body's generator then never starts)."""

    def __init__(self, content, closed, **kw):
        super().__init__(content, **kw)
        self._closed = closed

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._closed()


def create_app(engine, settings: ServerSettings | None = None):
    """The app over ``engine``: an :class:`~servelab.engine.LLMEngine` with a tokenizer
    (driven by a thread of this process: :class:`~servelab.server.engine_loop.EngineLoop`),
    or any :class:`~servelab.server.front.EngineFront`, such as
    :class:`~servelab.server.client.EngineCoreClient` (the engine in its own process)."""
    settings = settings or ServerSettings()
    front: EngineFront = engine if isinstance(engine, EngineFront) else EngineLoop(engine)
    tokenizer = front.tokenizer
    if tokenizer is None:
        raise ValueError("the server needs an engine with a tokenizer (LLMEngine.from_model(model, tokenizer))")
    info = front.info
    max_model_len = info["max_model_len"]
    limits = protocol.Limits(model=settings.model_name, max_model_len=max_model_len,
                             pool_tokens=info["pool_tokens"],
                             vocab_size=info["vocab_size"] or tokenizer.vocab_size,
                             max_prompt_chars=protocol.max_prompt_chars(tokenizer, max_model_len))
    metrics = ServerMetrics(info["num_kv_blocks"])
    front.metrics = metrics
    max_num_seqs = info["max_num_seqs"]
    max_in_flight = max_num_seqs + settings.max_queued_requests

    def engine_lost(reason: str) -> None:
        app.state.engine_lost = reason
        request_exit = getattr(app.state, "request_exit", None)  # set by runner's server
        if settings.exit_on_engine_loss and request_exit is not None:
            request_exit()

    # One tokenizing thread: the tokenizer is Python and holds the interpreter lock while it
    # works, so more threads would not tokenize faster; they would only take the lock from
    # the event loop more often, and every stream would wait longer between its events.
    tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="servelab-tokenize")

    @asynccontextmanager
    async def lifespan(app):
        front.on_lost = engine_lost
        await front.start()
        yield
        await front.astop()
        tokenize_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="servelab", lifespan=lifespan)
    app.state.engine_loop = front
    app.state.metrics = metrics
    app.state.settings = settings
    app.state.limits = limits
    app.state.engine_lost = None

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        metrics.record_rejected(exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        return JSONResponse(error_body(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc):
        return JSONResponse(error_body(str(exc), 400), status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(request, exc):  # a bug: still OpenAI's shape, never a plain-text 500
        log.error("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
        metrics.record_failed("internal_error")
        return JSONResponse(error_body(f"internal server error ({type(exc).__name__}); this is a "
                                       "server bug, please report it", 500, code="internal_error"),
                            status_code=500)

    @app.get("/health")
    async def health():
        if not front.alive:
            raise APIError(503, "the engine loop is not running", code="engine_down")
        return {"status": "draining" if front.draining else "ok", **front.snapshot()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": limits.model, "object": "model", "created": 0,
                                            "owned_by": "servelab", "max_model_len": limits.max_model_len}]}

    @app.get("/metrics")
    async def prom():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    async def _read_json(request: Request):
        length = request.headers.get("content-length")
        limit = settings.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            raise APIError(413, f"the request body has {int(length):,} bytes; the limit is {limit:,} bytes "
                                "(--max-body-bytes)", code="request_too_large")
        body = bytearray()
        try:
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise APIError(413, f"the request body is over the limit of {limit:,} bytes "
                                        "(--max-body-bytes)", code="request_too_large")
        except ClientDisconnect:  # nobody is left to answer: no stack trace in the log for it
            raise APIError(400, "the client disconnected before it sent the whole body",
                           code="client_disconnected") from None
        try:
            return json.loads(body), len(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc}); send a JSON object",
                           code="invalid_json") from exc
        except RecursionError as exc:
            raise APIError(400, "the request body nests JSON arrays or objects too deeply to read; "
                                "send a flat JSON object", code="invalid_json") from exc

    def _check_open() -> None:
        if front.draining:
            raise APIError(503, "the server is shutting down; retry on another replica",
                           code="shutting_down")
        if not front.alive:
            raise APIError(503, "the engine is not running; retry on another replica", code="engine_down")

    async def _handle(request: Request, kind: str):
        received = time.perf_counter()
        body, size = await _read_json(request)
        _check_open()
        if size <= settings.inline_parse_bytes:
            req = protocol.parse_request(body, kind, tokenizer, limits)
        else:  # a long prompt takes a while to tokenize: not on the event loop, which serves every stream
            req = await asyncio.get_running_loop().run_in_executor(
                tokenize_pool, protocol.parse_request, body, kind, tokenizer, limits)
            _check_open()
        # from this check to submit() nothing awaits: no other request can slip in between,
        # and submit() counts this one in flight at once
        if front.num_in_flight >= max_in_flight:
            raise APIError(429, f"too many requests in flight ({front.num_in_flight}; the limit is "
                                f"{max_in_flight} = {max_num_seqs} running + "
                                f"{settings.max_queued_requests} queued); retry after "
                                f"{settings.retry_after_s} s", code="rate_limit_exceeded",
                           headers={"Retry-After": str(settings.retry_after_s)})
        req_t = {"received": received, "tokenized": time.perf_counter()}
        q: asyncio.Queue = asyncio.Queue()
        req_t["submitted"] = time.perf_counter()
        front.submit(req.request_id, req.prompt_token_ids, req.sampling_params, q.put_nowait,
                     arrival_time=received, n=req.n)
        await _admitted(req, q)
        if req.stream:
            state = {"done": False}

            def closed():  # the response ended, or never started: the client went away
                if not state["done"]:
                    front.abort(req.request_id)

            return _Stream(_stream(req, q, req_t, state), closed, media_type="text/event-stream",
                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _complete(request, req, q, req_t)

    async def _admitted(req, q) -> None:
        """Wait until the engine took the request; its refusal is raised as an APIError, so
        the client gets an HTTP error status, not a 200 followed by an error event."""
        try:
            while True:
                try:
                    ev: Event = await asyncio.wait_for(q.get(), settings.nondisconnect_poll_s)
                except asyncio.TimeoutError:
                    if not front.alive:
                        raise APIError(503, "the engine stopped before it took this request; retry on "
                                            "another replica", code="engine_down") from None
                    continue
                if ev.kind == "error":
                    raise APIError(ev.status, ev.message, code=ev.code)
                return  # "admitted": it always comes before the request's outputs
        except asyncio.CancelledError:
            front.abort(req.request_id)
            raise

    def _keep_prompt_cached(kept: int | None, out) -> int | None:
        """The prompt tokens served from the prefix cache, as the first report about
        completion 0 gave them: ``kept`` once known, None until such a report came."""
        if kept is None and out.index == 0 and out.metrics is not None:
            return out.metrics.num_cached_tokens
        return kept

    def _usage(req, out, cached: int | None = None) -> dict:
        if cached is None:
            cached = out.metrics.num_cached_tokens if out.metrics is not None else 0
        done = sum(len(c.token_ids) for c in out.outputs)  # n > 1: every completion; the prompt once
        return protocol.usage(len(req.prompt_token_ids), done, cached)

    def _lp(req, c, start: int, end: int, offset0: int = 0):
        if req.logprobs is None or c.logprobs is None:
            return None
        tops = c.top_logprobs[start:end] if c.top_logprobs is not None else None
        return protocol.logprobs_payload(req, tokenizer, c.token_ids[start:end], c.logprobs[start:end],
                                         tops, offset0)

    def _choice(out):
        """The completion an event is about (``out.index``; the only one unless n > 1)."""
        outs = out.outputs
        if len(outs) == 1:
            return outs[0]
        return next(c for c in outs if c.index == out.index)

    def _latest(q, ev: Event) -> list:
        """This event and every one already queued behind it, keeping only the newest per
        completion (reports are cumulative) and stopping at an error."""
        if q.empty() or ev.kind == "error":
            return [ev]
        latest = {ev.output.index: ev}
        while not q.empty():
            nxt = q.get_nowait()
            if nxt.kind == "error":
                return [*latest.values(), nxt]
            latest.pop(nxt.output.index, None)  # re-insert: order follows the newest report
            latest[nxt.output.index] = nxt
        return list(latest.values())

    async def _stream(req, q, req_t, state):
        n = req.n
        sent_tokens, sent_chars = [0] * n, [0] * n
        token_chars = [0] * n  # the text offset of the next token: its tokens' text, not what was sent
        first, ended = [True] * n, [False] * n
        prompt_cached = None
        while True:
            for ev in _latest(q, await q.get()):
                if ev.kind == "error":  # admitted, then failed (engine error, shutdown)
                    state["done"] = True
                    metrics.record_failed(ev.code)
                    yield sse(error_body(ev.message, ev.status, code=ev.code))
                    yield sse("[DONE]")
                    return
                out = ev.output
                prompt_cached = _keep_prompt_cached(prompt_cached, out)
                # a running report is about one completion; the final one holds them all
                for c in (out.outputs if out.finished and n > 1 else [_choice(out)]):
                    i = c.index
                    if ended[i]:
                        continue
                    n_tok = len(c.token_ids)
                    lp = _lp(req, c, sent_tokens[i], n_tok, token_chars[i])
                    if lp is not None and lp.get("tokens"):  # legacy completions: text offsets
                        token_chars[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
                    finish = c.finish_reason  # set once that completion ended
                    delta = c.text[sent_chars[i]:]
                    if delta or first[i] or finish or lp:
                        yield sse(protocol.chunk(req, delta, finish, lp, first=first[i],
                                                 stop_reason=c.stop_reason if finish else None,
                                                 index=i))
                        first[i] = False
                    sent_tokens[i] = n_tok
                    sent_chars[i] += len(delta)
                    ended[i] = finish is not None
                if out.finished:
                    state["done"] = True
                    if req.include_usage or req.return_timings:
                        extra = protocol.usage_chunk(req, _usage(req, out, prompt_cached))
                        if req.return_timings:
                            extra["servelab_timings"] = _timings(req_t, out)
                        yield sse(extra)
                    yield sse("[DONE]")
                    return

    async def _complete(request, req, q, req_t):
        done = False
        poll = settings.nondisconnect_poll_s
        checked = time.monotonic()
        prompt_cached = None
        try:
            while True:
                try:
                    ev: Event | None = await asyncio.wait_for(q.get(), poll)
                except asyncio.TimeoutError:
                    ev = None
                if time.monotonic() - checked >= poll:  # tokens may flow faster than the poll
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        return JSONResponse(error_body("client disconnected", 400), status_code=400)
                if ev is None or ev.kind == "admitted":
                    continue
                if ev.kind == "error":  # admitted, then failed: not a rejection
                    done = True
                    metrics.record_failed(ev.code)
                    return JSONResponse(error_body(ev.message, ev.status, code=ev.code),
                                        status_code=ev.status)
                out = ev.output
                prompt_cached = _keep_prompt_cached(prompt_cached, out)
                if out.finished:
                    done = True
                    choices = [protocol.choice(req, c.text, c.finish_reason, _lp(req, c, 0, len(c.token_ids)),
                                               c.stop_reason, c.index) for c in out.outputs]
                    body = protocol.response(req, choices, _usage(req, out, prompt_cached))
                    if req.return_timings:
                        body["servelab_timings"] = _timings(req_t, out)
                    return JSONResponse(body)
        finally:
            if not done:
                front.abort(req.request_id)

    async def drain() -> None:
        """Shut down gracefully (SIGTERM): refuse new requests now (503), give those in
        flight ``settings.shutdown_grace_s`` to finish, then end the rest with a 503
        (an error event and ``[DONE]`` for a stream). Returns once none is left."""
        front.begin_drain()
        clock = asyncio.get_running_loop()
        deadline = clock.time() + settings.shutdown_grace_s
        while front.num_in_flight and front.alive and clock.time() < deadline:
            await asyncio.sleep(0.02)
        if front.num_in_flight and front.alive:
            log.warning("shutdown: %d request(s) still running after the %.1f s grace; ending them",
                        front.num_in_flight, settings.shutdown_grace_s)
            front.fail_all(503, f"the server shut down before this request finished (its shutdown "
                                f"grace of {settings.shutdown_grace_s:g} s ran out); retry it",
                           "shutting_down")
            deadline = clock.time() + 5.0  # the engine ends them before its next step
            while front.num_in_flight and front.alive and clock.time() < deadline:
                await asyncio.sleep(0.02)

    app.state.drain = drain

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _handle(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _handle(request, "chat")

    return app
