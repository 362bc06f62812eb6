"""Graceful shutdown (what SIGTERM does to ``python -m servelab.server``): new requests get
503 at once, kept-alive connections too; requests in flight finish within the grace; when
the grace runs out, the rest end cleanly (an error event and ``[DONE]`` for a stream, a 503
body for the others, queued ones included); then the server stops.

In-process (``ServerThread.shutdown`` runs the same drain as the signal), on the tiny float64
model of ``test_server``; the engine's sampler is gated or slowed so that no outcome depends
on how fast this machine is. The command line's SIGTERM is tested in
``test_server_reliability``. Every call has a timeout.
"""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from servelab.server import ServerSettings, ServerThread, build_engine, create_app

# test_server's module fixtures (tok, model), reused rather than written again.
from test_server import MODEL, body, model, read_stream, tok, wait_until  # noqa: F401

TIMEOUT = httpx.Timeout(30.0)


def start(model, tok, grace_s, **engine_options):
    engine = build_engine(model, tok, num_kv_blocks=256, **engine_options)
    srv = ServerThread(create_app(engine, ServerSettings(model_name=MODEL, shutdown_grace_s=grace_s)))
    return srv.start(), engine


def stream(url, b):
    with httpx.Client(base_url=url, timeout=TIMEOUT) as c, c.stream("POST", "/v1/completions", json=b) as r:
        return r.status_code, read_stream(r)


def post(url, b):
    r = httpx.post(url + "/v1/completions", json=b, timeout=TIMEOUT)
    return r.status_code, r.json()


def test_new_requests_get_503_at_once_and_running_ones_finish_within_the_grace(model, tok):
    srv, engine = start(model, tok, grace_s=60.0)
    loop = srv.app.state.engine_loop
    gate = threading.Event()
    real = engine.sampler

    def gated(logits, seqs):  # the engine waits here until the test has checked the 503s
        gate.wait(30)
        return real(logits, seqs)

    engine.sampler = gated
    try:
        with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as kept, ThreadPoolExecutor(2) as ex:
            assert kept.get("/health").status_code == 200  # this connection stays open
            running = ex.submit(stream, srv.url, body(max_tokens=6, ignore_eos=True, stream=True))
            assert wait_until(lambda: loop.num_in_flight == 1)
            stopping = ex.submit(srv.shutdown)
            assert wait_until(lambda: loop.draining)
            r = kept.post("/v1/completions", json=body())  # the kept-alive connection
            assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
            with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as fresh:
                r = fresh.post("/v1/chat/completions", json={"model": MODEL, "messages": [
                    {"role": "user", "content": "hi"}]})
                assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
            gate.set()
            status, events = running.result(60)
            stopping.result(60)
        assert status == 200 and events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert not srv.thread.is_alive()
    finally:
        gate.set()
        srv.stop()


def test_when_the_grace_runs_out_every_request_still_there_ends_cleanly(model, tok):
    srv, engine = start(model, tok, grace_s=0.2, max_num_seqs=2)
    loop = srv.app.state.engine_loop
    real = engine.sampler

    def slow(logits, seqs):  # 200 tokens now take at least 10 s: far past the grace
        time.sleep(0.05)
        return real(logits, seqs)

    engine.sampler = slow
    long = body(max_tokens=200, ignore_eos=True)
    try:
        with ThreadPoolExecutor(3) as ex:
            streams = [ex.submit(stream, srv.url, {**long, "stream": True}) for _ in range(2)]
            assert wait_until(lambda: loop.num_in_flight == 2)
            plain = ex.submit(post, srv.url, long)  # queued: both seats are taken
            assert wait_until(lambda: loop.num_in_flight == 3)
            srv.shutdown()
            results = [f.result(60) for f in streams]
            status, plain_body = plain.result(60)
        for code, events in results:  # the stream was 200; it ends with an error event and [DONE]
            assert code == 200 and events[-1] == "[DONE]"
            assert events[-2]["error"]["code"] == "shutting_down", events[-2]
        assert status == 503 and plain_body["error"]["code"] == "shutting_down"
        assert "grace" in plain_body["error"]["message"]
        assert not srv.thread.is_alive() and loop.num_in_flight == 0
        assert engine.scheduler.kv.allocator.num_used == 0
    finally:
        srv.stop()
