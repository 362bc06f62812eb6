"""The engine core in its own process (``servelab.server.core``), as ``python -m
servelab.server`` runs it: greedy parity with ``LLM.generate``, aborts that free
blocks, per-request errors, ``/metrics`` fed by the core's step messages, 429s,
and a core that dies. The API side runs in a thread of this process (an
OS-chosen loopback port); the core is a child process building the tiny float64
model of ``test_server`` (exact greedy parity). Every call has a timeout.
"""
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from servelab.engine import LLM
from servelab.sampling import SamplingParams
from servelab.server import ServerSettings, ServerThread, create_app, launch
from servelab.server.client import EngineCoreClient

from server_builders import tiny_model
from test_server import MODEL, body, read_stream

TIMEOUT = httpx.Timeout(30.0)
ROOT = Path(__file__).resolve().parents[1]


def core(builder="tiny_engine", **options):
    options.setdefault("num_kv_blocks", 256)
    return EngineCoreClient("tiny", builder=f"server_builders:{builder}", startup_timeout_s=120,
                            **options)


def serve(client, **settings):
    return ServerThread(create_app(client, ServerSettings(model_name=MODEL, **settings)))


def wait_until(cond, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def idle(srv):
    h = httpx.get(srv.url + "/health", timeout=TIMEOUT).json()
    return h["in_flight"] == 0 and h["running"] == 0 and h["waiting"] == 0 and h["kv_blocks_used"] == 0


@pytest.fixture(scope="module")
def server():
    # picky: only seed-13 requests meet the broken sampler; the other tests never send one
    client = core("picky_engine", max_num_seqs=16)
    srv = serve(client, max_queued_requests=1000)
    with srv:
        yield srv, client
    assert client.proc.poll() is not None  # the app's shutdown ended the core process


def test_the_engine_core_imports_no_http_stack_and_starts_without_a_warning():
    code = "import sys, servelab.server.core; print(sorted({'fastapi', 'starlette', 'uvicorn'} & set(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
    # runpy warned when the package's __init__ had imported the core before `-m` ran it
    r = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "servelab.server.core", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "RuntimeWarning" not in r.stderr, r.stderr


def test_the_engine_runs_in_another_process(server):
    srv, client = server
    h = httpx.get(srv.url + "/health", timeout=TIMEOUT).json()
    assert h["status"] == "ok" and h["engine_pid"] == client.pid != os.getpid()
    assert h["block_size"] == client.info["block_size"] > 0


def test_concurrent_streams_match_offline_and_every_block_comes_back(server):
    srv, _ = server
    prompts = [f"def f{i}(x):" + " x" * (i % 7) for i in range(40)]
    lens = [1 + (i * 5) % 9 for i in range(40)]
    ref = LLM(tiny_model(), num_kv_blocks=256).generate(
        prompts, [SamplingParams(temperature=0, max_tokens=n) for n in lens])

    async def one(c, p, n):
        b = body(prompt=p, max_tokens=n, stream=True, stream_options={"include_usage": True})
        text, usage = [], None
        async with c.stream("POST", "/v1/completions", json=b) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    ev = json.loads(line[6:])
                    usage = ev.get("usage") or usage
                    text += [ch["text"] for ch in ev["choices"]]
        return "".join(text), usage

    async def go():
        async with httpx.AsyncClient(base_url=srv.url, timeout=TIMEOUT) as c:
            return await asyncio.wait_for(asyncio.gather(*(one(c, p, n) for p, n in zip(prompts, lens))), 60)

    got = asyncio.run(go())
    for (text, usage), want in zip(got, ref):
        assert text == want.text and usage["completion_tokens"] == len(want.token_ids)
    assert wait_until(lambda: idle(srv))
    metrics = httpx.get(srv.url + "/metrics", timeout=TIMEOUT).text
    tokens = next(float(line.split()[-1]) for line in metrics.splitlines()
                  if line.startswith("servelab:generation_tokens_total "))
    assert tokens >= sum(len(w.token_ids) for w in ref)
    assert "servelab:time_to_first_token_seconds_count" in metrics


def test_non_streamed_request_and_logprobs(server):
    srv, _ = server
    want = LLM(tiny_model(), num_kv_blocks=256).generate(
        ["def add(a, b):"], SamplingParams(temperature=0, max_tokens=8, logprobs=2))[0]
    r = httpx.post(srv.url + "/v1/completions", json=body(logprobs=2), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == want.text
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(want.outputs[0].logprobs)


def test_disconnect_aborts_and_frees_blocks_in_the_core(server):
    srv, client = server
    assert wait_until(lambda: idle(srv))
    n = len(client.abort_log)
    with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=body(max_tokens=200, ignore_eos=True, stream=True)) as s:
            lines = s.iter_lines()
            [next(lines) for _ in range(4)]
            assert httpx.get(srv.url + "/health", timeout=TIMEOUT).json()["kv_blocks_used"] > 0
    assert wait_until(lambda: len(client.abort_log) > n)
    rec = client.abort_log[-1]
    assert rec.freed and rec.step_applied == rec.step_received >= rec.step_requested
    assert wait_until(lambda: idle(srv))


def test_a_request_whose_sampling_raises_in_the_core_fails_alone(server):
    srv, _ = server
    with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=body(max_tokens=30, ignore_eos=True, stream=True)) as ok:
            lines = ok.iter_lines()
            next(lines)
            with c.stream("POST", "/v1/completions",
                          json=body(max_tokens=30, ignore_eos=True, stream=True, temperature=0.8,
                                    seed=13)) as bad:
                bad_events = read_stream(bad)
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert bad_events[-1] == "[DONE]" and "seed 13" in bad_events[-2]["error"]["message"]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        # now the sampler refuses seed 13 outright: the admission dry run turns it away with a 400
        r = c.post("/v1/completions", json=body(temperature=0.8, seed=13))
        assert r.status_code == 400 and "seed 13" in r.json()["error"]["message"]
        assert c.post("/v1/completions", json=body()).status_code == 200
        assert wait_until(lambda: idle(srv))


def test_too_many_requests_is_429_through_the_core():
    client = core(max_num_seqs=1)
    with serve(client, max_queued_requests=0) as srv, httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=body(max_tokens=200, ignore_eos=True, stream=True)) as s:
            lines = s.iter_lines()
            next(lines)
            r = c.post("/v1/completions", json=body())
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert wait_until(lambda: idle(srv))
        assert c.post("/v1/completions", json=body()).status_code == 200


def test_a_core_that_dies_is_logged_reaped_and_refused_before_any_200(caplog):
    """The loss is logged at CRITICAL, the dead child reaped (no zombie), its requests
    fail, /health says 503, and a new request (streamed too) is a 503, never a 200."""
    client = core()
    with caplog.at_level(logging.CRITICAL, logger="servelab.server"), \
            serve(client, exit_on_engine_loss=False) as srv, httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=body(max_tokens=250, ignore_eos=True, stream=True)) as s:
            lines = s.iter_lines()
            next(lines)
            os.kill(client.pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and "engine core stopped" in rest[-2]
        assert wait_until(lambda: any(r.levelno == logging.CRITICAL and "engine core" in r.getMessage()
                                      for r in caplog.records))
        assert client.proc.returncode == -signal.SIGKILL  # reaped by the server, not by this test
        assert c.get("/health").status_code == 503
        with c.stream("POST", "/v1/completions", json=body(stream=True)) as s:
            assert s.status_code == 503
            s.read()
            assert s.json()["error"]["code"] == "engine_down"
        assert c.post("/v1/completions", json=body()).status_code == 503
        assert "SIGKILL" in srv.app.state.engine_lost


def test_an_engine_core_whose_engine_cannot_step_any_more_exits_1_and_says_why():
    """EngineDeadError in the core: the step's requests fail (500, the reason), the core
    tells the API side why and exits 1, and the server takes its engine-loss path."""
    from server_builders import DEATH_SEED
    client = core("dying_engine")
    with serve(client, exit_on_engine_loss=False) as srv, httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        r = c.post("/v1/completions", json=body(temperature=0.8, seed=DEATH_SEED))
        assert r.status_code == 500 and "rank 1" in r.json()["error"]["message"]
        assert wait_until(lambda: srv.app.state.engine_lost is not None)
        assert client.proc.returncode == 1
        assert "exit code 1" in srv.app.state.engine_lost and "rank 1" in srv.app.state.engine_lost
        assert c.get("/health").status_code == 503


@pytest.mark.slow
def test_the_server_exits_with_code_1_when_its_engine_core_dies():
    """So that a supervisor restarts it (``python -m servelab.server``, the committed model)."""
    server = launch(ROOT / "data" / "models" / "servelab-main")
    try:
        pid = httpx.get(server.url + "/health", timeout=TIMEOUT).json()["engine_pid"]
        os.kill(pid, signal.SIGKILL)
        assert server.proc.wait(60) == 1, server.log()
        assert "CRITICAL servelab.server: the engine core" in server.log(), server.log()
        assert "RuntimeWarning" not in server.log()  # the core no longer imports the API side first
    finally:
        server.stop()
