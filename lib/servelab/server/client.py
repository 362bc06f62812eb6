"""The API server's handle on the engine core (:mod:`servelab.server.core`).

:class:`EngineCoreClient` starts the core process, sends it requests and aborts,
and reads its one message per engine step in the asyncio event loop (no extra
thread), putting each request's events straight onto that request's sink. It
has the same face as :class:`~servelab.server.engine_loop.EngineLoop`
(:class:`~servelab.server.front.EngineFront`), so the app does not care which
it drives.

If the core dies, its socket closes: every request in it fails (500
``engine_error``), the loss is logged at CRITICAL level with the core's exit
code or signal, the dead child is reaped (no zombie), and ``on_lost`` tells the
app, whose server then exits with code 1 (:mod:`servelab.server.runner`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

from servelab.engine.sequence import RequestMetrics
from servelab.server.engine_loop import AbortRecord, EngineCounters, Event
from servelab.server.wire import frame, parse_frames

__all__ = ["EngineCoreClient", "RemoteOutput"]

log = logging.getLogger("servelab.server")

class _Completion:
    """The API side's copy of one completion: text, ids, logprobs, times, finish."""

    __slots__ = ("metrics", "text", "token_ids", "logprobs", "top_logprobs", "finish")

    def __init__(self, arrival):
        self.metrics = RequestMetrics(arrival)
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs = None
        self.top_logprobs = None
        self.finish = None  # (finish_reason, stop_reason) once it ended

    def output(self, index: int, n_tokens: int | None = None, text: str | None = None):
        from servelab.engine.sequence import CompletionOutput
        n = len(self.token_ids) if n_tokens is None else n_tokens
        fr, sr = self.finish or (None, None)
        return CompletionOutput(index, self.text if text is None else text, self.token_ids[:n], fr, sr,
                                None if self.logprobs is None else self.logprobs[:n],
                                None if self.top_logprobs is None else self.top_logprobs[:n])


class _Req:
    __slots__ = ("sink", "prompt_token_ids", "completions")

    def __init__(self, sink, prompt_token_ids, arrival, n):
        self.sink = sink
        self.prompt_token_ids = prompt_token_ids
        self.completions = [_Completion(arrival) for _ in range(n)]


class RemoteOutput:
    """What the app reads from a request's event: the :class:`RequestOutput` shape,
    rebuilt from the core's deltas (``outputs`` are made only when read). A running
    report is about completion ``index``; the finished one holds all of them."""

    __slots__ = ("request_id", "prompt", "prompt_token_ids", "finished", "metrics", "delta_text",
                 "delta_token_ids", "error", "index", "_req", "_n", "_text", "_outputs")

    def __init__(self, rid, req: _Req, index: int, delta_text, delta_ids, finished: bool):
        comp = req.completions[index]
        self.request_id, self.prompt, self.prompt_token_ids = rid, None, req.prompt_token_ids
        self.finished, self.index = finished, index
        self.metrics = comp.metrics
        self.delta_text, self.delta_token_ids, self.error = delta_text, delta_ids, None
        self._req, self._n, self._text = req, len(comp.token_ids), comp.text
        self._outputs = None

    @property
    def outputs(self):
        if self._outputs is None:
            comps = self._req.completions
            if self.finished and len(comps) > 1:
                self._outputs = [c.output(i) for i, c in enumerate(comps)]
            else:
                self._outputs = [comps[self.index].output(self.index, self._n, self._text)]
        return self._outputs

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self):
        return self.outputs[0].token_ids

    @property
    def finish_reason(self):
        return self.outputs[0].finish_reason


class EngineCoreClient:
    """The API server's handle on an engine-core process (same face as :class:`EngineLoop`).

    ``EngineCoreClient(model, **engine_options)`` starts the core and waits
    until its engine is built; ``await start()`` (the app's lifespan) attaches
    it to the running event loop; ``await astop()`` ends it. Events reach a
    request's ``sink`` in the event-loop thread (``in_loop_thread``).
    """

    in_loop_thread = True

    def __init__(self, model, *, threads: int = 1, builder: str | None = None,
                 startup_timeout_s: float = 300.0, env: dict | None = None, **engine_options):
        from servelab.engine.llm import load_tokenizer
        opts = {"model": str(model), "threads": threads, **engine_options}
        if builder:
            opts["builder"] = builder
        ours, theirs = socket.socketpair()
        full_env = dict(os.environ)
        full_env.setdefault("OMP_NUM_THREADS", "1")
        full_env.setdefault("MKL_NUM_THREADS", "1")
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "servelab.server.core", "--fd", str(theirs.fileno()),
             "--options", json.dumps(opts)], pass_fds=[theirs.fileno()], env=full_env)
        theirs.close()
        self.sock = ours
        self._buf = bytearray()
        ours.settimeout(startup_timeout_s)
        try:
            msg = None
            while msg is None:
                data = ours.recv(1 << 16)
                if not data:
                    raise RuntimeError(f"the engine core exited with code {self.proc.wait(10)} "
                                       "before it was ready; see its log")
                self._buf += data
                msgs = parse_frames(self._buf)
                msg = msgs[0] if msgs else None
        except BaseException:
            self._kill()
            raise
        if msg[0] != "ready":
            self._kill()
            raise RuntimeError(f"the engine core could not start: {msg[1]}")
        self.info = msg[1]
        self.tokenizer = load_tokenizer(model if builder is None else None)
        self.metrics = None           # the app's ServerMetrics, set by create_app
        self.abort_log: list[AbortRecord] = []
        self.num_engine_errors = 0
        self.steps = 0
        self.on_lost = None           # called with the reason if the core dies (the app: exit)
        self._stopping = False        # astop/close began: the core's end is expected
        self._reqs: dict[str, _Req] = {}
        self._counters = EngineCounters(running=0, waiting=0, kv_blocks_used=0,
                                        kv_blocks_free=self.info["num_kv_blocks"], steps=0,
                                        engine_errors=0, prefix_cache_hit_blocks=0)
        self._transport = None
        self._alive = False
        self._draining = False
        self._bye: asyncio.Future | None = None
        self._lost_reason: str | None = None  # why the core gave up, if it said so

    # -- what the app reads --------------------------------------------------------
    @property
    def num_in_flight(self) -> int:
        return len(self._reqs)

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def alive(self) -> bool:
        return self._alive and self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def snapshot(self) -> dict:
        c = self._counters
        return {"running": c.running, "waiting": c.waiting, "kv_blocks_used": c.kv_blocks_used,
                "kv_blocks_free": c.kv_blocks_free, "kv_blocks_total": self.info["num_kv_blocks"],
                "block_size": self.info["block_size"], "steps": c.steps,
                "in_flight": len(self._reqs), "prefix_cache_hit_blocks": c.prefix_cache_hit_blocks,
                "engine_pid": self.proc.pid}

    # -- requests ------------------------------------------------------------------
    def submit(self, request_id, prompt_token_ids, sampling_params, sink, arrival_time=None,
               n: int = 1) -> None:
        arrival = arrival_time if arrival_time is not None else time.perf_counter()
        if not self.alive:
            sink(Event("error", status=503, message="the engine core is not running", code="engine_down"))
            return
        self._reqs[request_id] = _Req(sink, prompt_token_ids, arrival, n)
        self._transport.write(frame(("add", request_id, prompt_token_ids, sampling_params, arrival, n)))

    def abort(self, request_id: str) -> None:
        if self._transport is not None and request_id in self._reqs and self.alive:
            self._transport.write(frame(("abort", request_id, self.steps)))

    def begin_drain(self) -> None:
        """Shutting down: new requests are refused from now on (the app answers 503)."""
        self._draining = True

    def fail_all(self, status: int, message: str, code: str) -> None:
        """End every request in flight with this error now; the core aborts them."""
        for rid, r in list(self._reqs.items()):
            self.abort(rid)
            self._reqs.pop(rid, None)
            self._deliver(r, Event("error", status=status, message=message, code=code))

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> "EngineCoreClient":
        loop = asyncio.get_running_loop()
        self.sock.settimeout(None)
        self.sock.setblocking(False)
        self._bye = loop.create_future()
        client = self

        class _Proto(asyncio.Protocol):
            def data_received(self, data):
                client._buf += data
                for msg in parse_frames(client._buf):
                    client._on_message(msg)

            def connection_lost(self, exc):
                client._lost(exc)

        self._transport, _ = await loop.create_unix_connection(_Proto, sock=self.sock)
        self._alive = True
        if self._buf:
            for msg in parse_frames(self._buf):
                self._on_message(msg)
        return self

    async def astop(self, timeout_s: float = 10.0) -> None:
        """Stop admitting; the core ends what is left (503s), says bye and exits."""
        self._draining = True
        self._stopping = True
        if self._transport is not None and self.alive:
            self._transport.write(frame(("stop",)))
            try:
                await asyncio.wait_for(asyncio.shield(self._bye), timeout_s)
            except asyncio.TimeoutError:
                pass
        await asyncio.to_thread(self._reap, timeout_s)

    def _reap(self, timeout_s: float) -> None:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
        if self._transport is not None:
            self._transport.close()

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        try:
            self.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        """Synchronous last resort (no event loop): end the core process."""
        self._stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self._kill()

    # -- messages from the core -------------------------------------------------------
    def _lost(self, exc) -> None:
        self._alive = False
        if self._bye is not None and not self._bye.done():
            self._bye.set_result(None)
        failed = len(self._reqs)
        for rid, r in list(self._reqs.items()):
            self._reqs.pop(rid, None)
            self._deliver(r, Event("error", status=500, message="the engine core stopped", code="engine_error"))
        if not self._stopping:  # the core died under us: reap it, say so, let the app exit
            asyncio.get_running_loop().create_task(self._after_loss(failed))

    def _wait_dead(self) -> int:
        """Reap the core (killing it if it closed its socket but lives on); its exit code."""
        try:
            return self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self._kill()
            return self.proc.returncode

    async def _after_loss(self, failed: int) -> None:
        code = await asyncio.to_thread(self._wait_dead)
        try:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        except ValueError:
            how = f"killed by signal {-code}"
        reason = (f"the engine core (pid {self.proc.pid}) died ({how}); {failed} request(s) in it "
                  "failed")
        if self._lost_reason:
            reason = f"{reason}: {self._lost_reason}"
        log.critical("%s; this server cannot serve without it and exits with code 1, for a "
                     "supervisor to restart it", reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    @staticmethod
    def _deliver(r: _Req, event: Event) -> None:
        try:
            r.sink(event)
        except Exception:  # noqa: BLE001 - a gone client's queue must not stop the reader
            log.debug("dropping an event for a gone client", exc_info=True)

    def _on_message(self, msg) -> None:
        kind = msg[0]
        if kind == "step":
            _, counters, entries, aborts = msg
            self._counters = counters
            self.steps, self.num_engine_errors = counters.steps, counters.engine_errors
            metrics = self.metrics
            for e in entries:
                self._entry(e, metrics)
            for rid, step_seen, step_received, step_applied, freed in aborts:
                self.abort_log.append(AbortRecord(rid, step_seen, step_applied, freed, step_received))
                if self._reqs.pop(rid, None) is not None and metrics is not None:
                    metrics.record_aborted()
            if metrics is not None:
                metrics.update_engine(counters.running, counters.waiting, counters.kv_blocks_used,
                                      counters.steps)
        elif kind == "lost":  # the engine cannot step any more; the core exits next
            self._lost_reason = msg[1]
        elif kind == "bye":
            if self._bye is not None and not self._bye.done():
                self._bye.set_result(None)

    def _entry(self, e, metrics) -> None:
        rid = e[0]
        r = self._reqs.get(rid)
        if r is None:
            return
        if e[1] == "E":
            self._reqs.pop(rid, None)
            self._deliver(r, Event("error", status=e[2], message=e[3], code=e[4]))
            return
        if e[1] == "A":
            self._deliver(r, Event("admitted"))
            return
        _, _, idx, delta_text, delta_ids, times, lp, top, first, fin, done = e
        comp = r.completions[idx]
        m = comp.metrics
        if first is not None:
            m.first_scheduled_time, m.num_cached_tokens = first
            m.first_token_time = times[0] if times else None
            if metrics is not None and times and all(
                    c.metrics.first_token_time is None for c in r.completions if c is not comp):
                metrics.record_first_token(times[0] - m.arrival_time, len(r.prompt_token_ids),
                                           m.num_cached_tokens)
        if times:
            if metrics is not None:
                prev = m.token_times[-1:] + times
                metrics.record_tokens(len(times), [b - a for a, b in zip(prev, prev[1:])])
            m.token_times += times
        comp.token_ids += delta_ids
        comp.text += delta_text
        if lp is not None:
            comp.logprobs = (comp.logprobs or []) + lp
            if top is not None:
                comp.top_logprobs = (comp.top_logprobs or []) + top
        if fin is not None:
            comp.finish = fin[:2]
            m.finished_time, m.num_preemptions = fin[2], fin[3]
        if done:
            self._reqs.pop(rid, None)
            if metrics is not None:
                metrics.record_finished((fin or ("unknown",))[0] or "unknown", len(r.prompt_token_ids),
                                        m.e2e)
        self._deliver(r, Event("output", output=RemoteOutput(rid, r, idx, delta_text, delta_ids, done)))

