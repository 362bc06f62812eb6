"""The engine core: the engine in its own process (the API side's handle: :mod:`servelab.server.client`).

With the engine loop as a thread of the API server, the engine's Python and
the HTTP layer's Python take turns on one interpreter lock: every SSE chunk
the server writes is time the engine does not step. vLLM's V1 answer, used
here: the engine runs in a *separate process* (the "engine core") with a busy
loop, and the API server process does only HTTP, tokenizing and forwarding.
One difference from vLLM V1: there the engine core returns token ids only, and
the API server process detokenizes and checks stop strings (then aborts the
request in the core); here the engine core does both, so each step's message
carries finished text and a stop string ends its request in the same step.

The two talk over one Unix socket pair, in frames of ``4-byte length + pickle``:

* API -> core: ``("add", id, prompt_ids, params, arrival)``,
  ``("abort", id, step_seen)``, ``("stop",)``;
* core -> API: ``("ready", info)`` once, then one ``("step", counters, entries,
  aborts)`` message per engine step carrying the engine's :class:`EngineCounters`
  for ``/health`` and ``/metrics``, every request's new tokens and text, its
  token times, and the aborts applied.

The core blocks on the socket while it has nothing to run (so a new request
wakes it at once: no sleep-polling), and while it is busy it drains whatever
arrived before each step (so an abort frees its blocks before the next step).
The API side reads frames in its asyncio event loop (no extra thread) and puts
each request's events straight onto that request's queue.

``python -m servelab.server.core --fd N --options JSON`` is the core's entry
point; :class:`~servelab.server.client.EngineCoreClient` starts it and speaks
to it (frames: :mod:`servelab.server.wire`). :func:`build_engine` lives here
too: the engine the core serves is the one ``LLM(...)`` builds.

If the core dies (killed, out of memory, a crash), the API side
(:mod:`servelab.server.client`) sees its socket close: every request in it fails (500 ``engine_error``), the loss is logged at
CRITICAL level with the core's exit code or signal, the dead child is reaped (no
zombie), and ``on_lost`` tells the app, whose server then exits with code 1
(:mod:`servelab.server.runner`): a supervisor restarts the pair, rather than
the server answering 503 forever.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import traceback

from servelab.server.engine_loop import EngineCounters, EngineLoop, EngineLost, Event
from servelab.server.wire import frame, parse_frames

__all__ = ["EngineCore", "build_engine", "core_main"]


def build_engine(model="data/models/servelab-main", tokenizer=None, **options):
    """The engine ``LLM(model, tokenizer, **options)`` would use (vLLM's option names), so
    greedy text through the server equals ``LLM.generate``."""
    from servelab.engine import LLM
    return LLM(model, tokenizer, **options).engine


# ====================================================================== the core
class EngineCore(EngineLoop):
    """The engine loop of the core process: commands from a socket, one message per step.

    It reuses :class:`EngineLoop`'s handling (admission dry run, aborts with
    their step numbers, a failed step failing only its requests) but runs in
    the process's main thread, and each request's *sink* appends a compact
    entry to the step's outbox instead of waking an event loop.
    """

    def __init__(self, engine, sock: socket.socket):
        super().__init__(engine, None)
        self.sock = sock
        self._buf = bytearray()
        self._read_at = 0  # steps done when the last frames were read
        self._outbox: list = []
        self._aborts: list = []
        self._sent: dict[tuple, list] = {}  # (request id, completion index) -> [tokens sent, first sent]
        self._eof = False

    # -- the socket ----------------------------------------------------------
    def _read(self, block: bool) -> list:
        """Frames available now; ``block``: wait until there is at least one."""
        self._read_at = self.steps  # the steps done when these frames came in (an abort's promptness)
        msgs = parse_frames(self._buf)
        block = block and not msgs
        while True:
            if not block and not select.select([self.sock], [], [], 0)[0]:
                return msgs
            data = self.sock.recv(1 << 20)
            if not data:
                self._eof = True
                return msgs
            self._buf += data
            msgs += parse_frames(self._buf)
            block = block and not msgs

    def _send_frame(self, obj) -> None:
        self.sock.sendall(frame(obj))

    # -- sinks: events become entries of the step message ------------------------
    def _sink(self, rid: str, wants_logprobs: bool):
        from servelab.engine.sequence import LazyRequestOutput as lazy  # torch: not at import

        def sink(event: Event) -> None:
            if event.kind == "error":
                self._outbox.append((rid, "E", event.status, event.message, event.code))
                return
            if event.kind == "admitted":
                self._outbox.append((rid, "A"))
                return
            out = event.output
            idx = out.index
            key = (rid, idx)
            sent = self._sent.setdefault(key, [0, False])  # tokens sent; first sent
            delta_ids = list(out.delta_token_ids)
            m = out.metrics
            times = m.token_times[len(m.token_times) - len(delta_ids):] if delta_ids else []
            # a running report is lazy (nothing built); a finished completion's is eager
            c = None
            if wants_logprobs or not isinstance(out, lazy):
                c = out.outputs[0] if len(out.outputs) == 1 else out.outputs[idx]
            lp = top = None
            if wants_logprobs and delta_ids and c.logprobs is not None:
                lp = c.logprobs[sent[0]:sent[0] + len(delta_ids)]
                top = None if c.top_logprobs is None else c.top_logprobs[sent[0]:sent[0] + len(delta_ids)]
            sent[0] += len(delta_ids)
            first = None
            if delta_ids and not sent[1]:
                sent[1] = True
                first = (m.first_scheduled_time, m.num_cached_tokens)
            fin = None
            if c is not None and c.finish_reason is not None:
                self._sent.pop(key, None)
                fin = (c.finish_reason, c.stop_reason, m.finished_time, m.num_preemptions)
            self._outbox.append((rid, "O", idx, out.delta_text, delta_ids, times, lp, top, first, fin,
                                 out.finished))
        return sink

    # -- the loop ------------------------------------------------------------------
    def _on_message(self, msg) -> None:
        kind = msg[0]
        if kind == "add":
            _, rid, ids, sp, arrival, n = msg
            self._in_flight += 1
            self._handle(("add", rid, ids, sp, self._sink(rid, sp.logprobs is not None), arrival, n))
        elif kind == "abort":
            _, rid, step_seen = msg
            k = len(self.abort_log)
            self._handle(("abort", rid, step_seen))
            for rec in self.abort_log[k:]:
                self._aborts.append((rec.request_id, rec.step_requested, self._read_at, self.steps, rec.freed))
            for key in [key for key in self._sent if key[0] == rid]:
                del self._sent[key]
            self.abort_log.clear()  # the API side keeps the log
        elif kind == "stop":
            self._draining.set()
            self._stop.set()

    def _counters(self) -> EngineCounters:
        s = self.engine.scheduler
        kv = s.kv
        return EngineCounters(running=len(s.running), waiting=len(s.waiting),
                              kv_blocks_used=kv.allocator.num_used, kv_blocks_free=kv.allocator.num_free,
                              steps=self.steps, engine_errors=self.num_engine_errors,
                              prefix_cache_hit_blocks=0 if kv.prefix_cache is None else kv.prefix_cache.hits)

    def _flush(self) -> None:
        entries, self._outbox = self._outbox, []
        aborts, self._aborts = self._aborts, []
        self._send_frame(("step", self._counters(), entries, aborts))

    def serve(self) -> int:
        """Serve until told to stop (0) or until the engine cannot step any more (1: the
        API side hears why in a ``("lost", reason)`` frame, then sees the core exit)."""
        try:
            self._serve()
        except EngineLost as exc:
            self._flush()  # the step's requests have failed: their errors go out first
            self._send_frame(("lost", str(exc)))
            return 1
        finally:
            self._shutdown_engine()
        return 0

    def _serve(self) -> None:
        engine = self.engine
        while True:
            busy = engine.has_unfinished_requests()
            for msg in self._read(block=not busy and not self._stop.is_set()):
                self._on_message(msg)
            if self._eof:
                self._stop.set()
            if self._stop.is_set():  # end whatever is left, tell the API side, leave
                self._abort_all(engine)
                if not self._eof:
                    self._flush()
                    self._send_frame(("bye",))
                return
            if engine.has_unfinished_requests():
                self._step()
            self._flush()


def core_main(argv=None) -> int:
    """``python -m servelab.server.core --fd N --options JSON``: build the engine, serve."""
    p = argparse.ArgumentParser(prog="python -m servelab.server.core")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--options", required=True, help="JSON: model, threads, engine options")
    a = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the API process decides when the core stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=a.fd)
    sock.setblocking(True)
    opts = json.loads(a.options)
    try:
        import torch
        torch.set_num_threads(int(opts.pop("threads", 1)))
        model = opts.pop("model")
        builder = opts.pop("builder", None)
        if builder:  # "module:function" returning an engine (tests: a tiny random model)
            import importlib
            mod, fn = builder.split(":")
            engine = getattr(importlib.import_module(mod), fn)(model, **opts)
        else:
            engine = build_engine(model, **opts)
        cfg = engine.config
        info = {"max_model_len": cfg.max_model_len, "pool_tokens": cfg.pool_tokens,
                "num_kv_blocks": cfg.num_kv_blocks, "max_num_seqs": cfg.max_num_seqs,
                "block_size": cfg.block_size,
                "vocab_size": getattr(engine.runner, "vocab_size", None)}
    except BaseException as exc:  # noqa: BLE001 - tell the API side why, then exit
        sock.sendall(frame(("failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")))
        return 1
    sock.sendall(frame(("ready", info)))
    code = EngineCore(engine, sock).serve()
    # everything is said (the "bye" or "lost" frame is out); skip the interpreter's teardown
    # of torch and the model, which takes seconds on a small machine and holds up the exit
    sock.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(core_main())
