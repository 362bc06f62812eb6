"""The engine's own thread: the only code that ever touches the engine.

HTTP handlers never call the engine. They put commands (add, abort) into a
thread-safe inbox; the engine thread drains the inbox between steps, runs
``engine.step()`` and hands each request's new tokens to that request's
*sink*. So a slow or vanished client can never stall a step, and an abort is
applied before the very next step: a disconnected client's KV blocks are free
within one engine step.

Started from an event loop (``await start()``), the loop calls every sink in
that event loop's thread, one wake-up per batch of events (:class:`_Dispatcher`):
the same promise as :class:`~servelab.server.client.EngineCoreClient`, so the
app drives either through one face (:class:`~servelab.server.front.EngineFront`).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

__all__ = ["EngineLoop", "EngineLost", "Event", "AbortRecord", "EngineCounters"]

log = logging.getLogger("servelab.server")


@dataclass
class Event:
    """What a request's sink receives: new output, or an error that ends it."""

    kind: str                     # "admitted" (first, once) | "output" | "error"
    output: object = None         # servelab.engine.RequestOutput for "output"
    status: int = 500
    message: str = ""
    code: str | None = None


@dataclass
class AbortRecord:
    request_id: str
    step_requested: int           # engine steps completed when the abort arrived
    step_applied: int             # engine steps completed when its blocks were freed
    freed: bool                   # False: the request had already finished
    step_received: int | None = None  # process mode: the core's steps when the abort reached it


class EngineCounters(NamedTuple):
    """The engine's counters as of a step: what the engine-core process sends the API
    side with every step message (:mod:`servelab.server.core`). A named tuple pickles
    small; it lives here, not in ``core``, because the core runs as ``__main__``, and
    a class pickled from there would not unpickle in the API process."""

    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_free: int
    steps: int
    engine_errors: int
    prefix_cache_hit_blocks: int


class _Dispatcher:
    """Hands the engine thread's events to an event loop with one wake-up per batch.

    Every engine step produces an event per running request; waking the event loop
    for each (a pipe write per call) would cost more than the step on a small model.
    Events wait in a list, and only the first of a batch schedules a flush.
    """

    def __init__(self, loop):
        self.loop = loop
        self.lock = threading.Lock()
        self.pending: list = []
        self.scheduled = False

    def post(self, sink, event) -> None:
        with self.lock:
            self.pending.append((sink, event))
            if self.scheduled:
                return
            self.scheduled = True
        self.loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        with self.lock:
            items, self.pending, self.scheduled = self.pending, [], False
        for sink, event in items:
            try:
                sink(event)
            except Exception:  # noqa: BLE001 - one gone client must not lose the others' events
                log.debug("dropping an event for a gone client", exc_info=True)


class EngineLost(Exception):
    """The engine cannot step any more (``engine.errored``: a tensor-parallel worker died
    or hung). Its requests have failed; the loop ends, and the server treats it as the
    loss of its engine (/health 503, ``on_lost``: the server exits 1 for a supervisor)."""


@dataclass
class _Tracked:
    sink: Callable[[Event], object]
    prompt_tokens: int
    itl_seen: dict = field(default_factory=dict)  # completion index -> token times counted
    first_seen: bool = False


class EngineLoop:
    """Owns an :class:`~servelab.engine.LLMEngine` and drives it in a background thread
    (an :class:`~servelab.server.front.EngineFront`)."""

    def __init__(self, engine, metrics=None, *, idle_wait_s: float = 0.02):
        self.engine = engine
        self.metrics = metrics
        tok = engine.tokenizer
        self.tokenizer = getattr(tok, "tokenizer", tok)  # unwrap LLM's prompt wrapper
        self._dispatcher: _Dispatcher | None = None  # set by start(): sinks run in that loop
        self.idle_wait_s = idle_wait_s
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._tracked: dict[str, _Tracked] = {}
        self._lock = threading.Lock()
        self._in_flight = 0
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._thread: threading.Thread | None = None
        self.abort_log: list[AbortRecord] = []
        self.num_engine_errors = 0
        self.steps = 0
        self.on_lost: Callable[[str], object] | None = None  # called (any thread) if the loop dies

    # ------------------------------------------------------------- HTTP side
    @property
    def info(self) -> dict:
        """What the engine can hold (the app's limits)."""
        cfg = self.engine.config
        return {"max_model_len": cfg.max_model_len, "pool_tokens": cfg.pool_tokens,
                "num_kv_blocks": cfg.num_kv_blocks, "max_num_seqs": cfg.max_num_seqs,
                "block_size": cfg.block_size, "vocab_size": getattr(self.engine.runner, "vocab_size", None)}

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not yet finished (queued in the inbox or in the engine)."""
        return self._in_flight

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def submit(self, request_id: str, prompt_token_ids: list[int], sampling_params,
               sink: Callable[[Event], object], arrival_time: float | None = None, n: int = 1) -> None:
        """Queue a request (``n`` completions); its events go to ``sink`` (called from the
        engine thread): first ``"admitted"`` once the engine took it (or an ``"error"`` if
        it refused it), then its outputs. After ``await start()`` the sink is called in
        that event loop's thread, else in the engine thread (it must not block)."""
        if self._dispatcher is not None:
            sink = functools.partial(self._dispatcher.post, sink)
        with self._lock:
            self._in_flight += 1
        self._inbox.put(("add", request_id, prompt_token_ids, sampling_params, sink,
                         arrival_time if arrival_time is not None else time.perf_counter(), n))

    def abort(self, request_id: str) -> None:
        """The client went away: free the request before the next step."""
        self._inbox.put(("abort", request_id, self.steps))

    def begin_drain(self) -> None:
        """Shutting down: new requests are refused from now on (the app answers 503)."""
        self._draining.set()

    def fail_all(self, status: int, message: str, code: str) -> None:
        """End every request in flight with this error (before the next step)."""
        self._inbox.put(("fail_all", status, message, code))

    def snapshot(self) -> dict:
        """Engine counters as of the last step (safe to read from any thread)."""
        kv = self.engine.scheduler.kv
        return {"running": len(self.engine.scheduler.running),
                "waiting": len(self.engine.scheduler.waiting),
                "kv_blocks_used": kv.allocator.num_used, "kv_blocks_free": kv.allocator.num_free,
                "kv_blocks_total": kv.num_blocks, "block_size": self.engine.config.block_size,
                "steps": self.steps, "in_flight": self._in_flight}

    # ------------------------------------------------------------- lifecycle
    async def start(self) -> "EngineLoop":
        """Start the engine thread; sinks will be called in the running event loop."""
        self._dispatcher = _Dispatcher(asyncio.get_running_loop())
        return self.start_thread()

    def start_thread(self) -> "EngineLoop":
        """Start the engine thread (sinks are then called in the engine thread)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="servelab-engine", daemon=True)
            self._thread.start()
        return self

    async def astop(self) -> None:
        """Stop without waiting for requests (the app's drain already gave them their grace)."""
        await asyncio.to_thread(self.stop, 0.0)
        self._dispatcher = None

    def stop(self, grace_s: float = 0.0, timeout_s: float = 10.0) -> None:
        """Stop admitting; let in-flight requests finish for ``grace_s``; abort the rest; join."""
        self._draining.set()
        deadline = time.monotonic() + grace_s
        while self._in_flight and time.monotonic() < deadline and self.alive:
            time.sleep(0.01)
        self._stop.set()
        self._inbox.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---------------------------------------------------------- engine thread
    def _finish(self, request_id: str) -> _Tracked | None:
        t = self._tracked.pop(request_id, None)
        if t is not None:
            with self._lock:
                self._in_flight -= 1
        return t

    def _send(self, t: _Tracked, event: Event) -> None:
        try:
            t.sink(event)
        except Exception:  # a closed event loop or a broken sink must never stop the engine
            log.debug("dropping an event for a gone client", exc_info=True)

    def _fail(self, request_id: str, status: int, message: str, code: str) -> None:
        t = self._finish(request_id)
        if t is not None:
            self._send(t, Event("error", status=status, message=message, code=code))

    def _abort_all(self, engine, status: int = 503,
                   message: str = "the server shut down before this request finished; retry it",
                   code: str = "shutting_down") -> None:
        """End every request still tracked: aborted in the engine, an error to its client."""
        for rid in list(self._tracked):
            try:
                engine.abort_request(rid)
            except Exception:  # noqa: BLE001 - the client hears either way
                log.error("abort of %s failed:\n%s", rid, traceback.format_exc())
            self._fail(rid, status, message, code)

    def _dry_run(self, sp) -> None:
        """Sample once from a made-up row with these settings, so that settings the
        sampler cannot handle fail this request alone, before it joins a batch."""
        import torch

        from servelab.sampling import sample
        if getattr(sp, "temperature", 0) == 0:
            return
        vocab = getattr(self.engine.runner, "vocab_size", None) or 16
        row = torch.linspace(-1.0, 1.0, vocab)
        sample(row, sp, torch.Generator().manual_seed(0))

    def _handle(self, cmd) -> None:
        if cmd[0] == "add":
            _, rid, ids, sp, sink, arrival, n = cmd
            t = _Tracked(sink, len(ids))
            self._tracked[rid] = t
            if self._stop.is_set():
                self._fail(rid, 503, "the server is shutting down; retry on another replica", "shutting_down")
                return
            try:
                self._dry_run(sp)
                self.engine.add_request(rid, ids, sp, arrival_time=arrival, n=n)
            except (ValueError, TypeError) as exc:
                self._fail(rid, 400, str(exc), "invalid_value")
                return
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the loop
                self._fail(rid, 400, f"the request cannot run: {type(exc).__name__}: {exc}", "invalid_request")
                return
            self._send(t, Event("admitted"))
        elif cmd[0] == "fail_all":
            self._abort_all(self.engine, *cmd[1:])
        elif cmd[0] == "abort":
            _, rid, step_requested = cmd
            out = None
            try:
                out = self.engine.abort_request(rid)
            except Exception:  # noqa: BLE001
                log.error("abort of %s failed:\n%s", rid, traceback.format_exc())
            if self._finish(rid) is not None and self.metrics is not None:
                self.metrics.record_aborted()
            self.abort_log.append(AbortRecord(rid, step_requested, self.steps, out is not None))

    def _dispatch(self, out) -> None:
        rid = out.request_id
        t = self._tracked.get(rid)
        m = out.metrics
        if t is not None and self.metrics is not None and m is not None:
            times = m.token_times
            if not t.first_seen and m.first_token_time is not None:
                t.first_seen = True
                self.metrics.record_first_token(m.first_token_time - m.arrival_time, t.prompt_tokens,
                                                m.num_cached_tokens)
            seen = t.itl_seen.get(out.index, 0)
            gaps = [b - a for a, b in zip(times[max(seen - 1, 0):], times[max(seen, 1):])]
            self.metrics.record_tokens(len(times) - seen, gaps)
            t.itl_seen[out.index] = len(times)
        if out.finished:
            t = self._finish(rid)
            if self.metrics is not None:
                reason = out.finish_reason or "unknown"
                self.metrics.record_finished(reason, len(out.prompt_token_ids),
                                             None if m is None else m.e2e)
            if t is None:
                return
            if out.error is not None or (len(out.outputs) == 1 and out.finish_reason == "error"):
                self._send(t, Event("error", status=400, message=out.error or "the request failed",
                                    code="request_failed"))
                return
        if t is not None:
            self._send(t, Event("output", output=out))

    def _step(self) -> None:
        try:
            outs = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - the engine failed: end what was in it, keep serving
            self.num_engine_errors += 1
            dead = getattr(self.engine, "errored", False)  # it will fail every step from now on
            if dead:  # the message says it all (which rank died, how): no stack trace
                log.error("engine step failed; failing its requests: %s: %s", type(exc).__name__, exc)
            else:
                log.error("engine step failed; failing its requests:\n%s", traceback.format_exc())
            # by the request's own id: the engine holds n > 1 requests as children "<id>#<i>"
            rids = dict.fromkeys(seq.parent_id or rid for rid, seq in self.engine.requests.items())
            for rid in rids:
                try:
                    self.engine.abort_request(rid)
                except Exception:  # noqa: BLE001
                    log.error("abort after a failed step failed:\n%s", traceback.format_exc())
                self._fail(rid, 500, f"the engine failed while running this request "
                                     f"({type(exc).__name__}: {exc}); retry it", "engine_error")
            if dead:
                raise EngineLost(f"the engine cannot step any more: {type(exc).__name__}: {exc}") from exc
            return
        finally:
            self.steps += 1
        for out in outs:
            self._dispatch(out)

    def _publish(self) -> None:
        if self.metrics is not None:
            s = self.engine.scheduler
            self.metrics.update_engine(len(s.running), len(s.waiting), s.kv.allocator.num_used, self.steps)

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                busy = engine.has_unfinished_requests()
                if self._stop.is_set() and not busy and self._inbox.empty():
                    break
                try:
                    cmd = self._inbox.get(timeout=self.idle_wait_s) if not busy else self._inbox.get_nowait()
                except queue.Empty:
                    cmd = None
                while cmd is not None:
                    if cmd[0] != "wake":
                        self._handle(cmd)
                    try:
                        cmd = self._inbox.get_nowait()
                    except queue.Empty:
                        cmd = None
                if self._stop.is_set():  # grace is over: abort whatever is left
                    self._abort_all(engine)
                if engine.has_unfinished_requests():
                    self._step()
                self._publish()
        except EngineLost as exc:
            log.critical("%s; the engine loop stops", exc)
            self._lost(str(exc))
        except BaseException as exc:  # pragma: no cover - a bug in this loop
            log.critical("engine loop died:\n%s", traceback.format_exc())
            self._lost(f"the engine loop died: {type(exc).__name__}: {exc}")
            raise
        finally:
            self._shutdown_engine()

    def _lost(self, reason: str) -> None:
        for rid in list(self._tracked):
            self._fail(rid, 500, "the engine loop stopped", "engine_error")
        if self.on_lost is not None:
            self.on_lost(reason)

    def _shutdown_engine(self) -> None:
        """Stop the engine's worker processes, if it has any (tensor parallel)."""
        stop = getattr(self.engine, "shutdown", None)
        if stop is not None:
            try:
                stop()
            except Exception:  # noqa: BLE001 - ending anyway
                log.error("engine shutdown failed:\n%s", traceback.format_exc())
