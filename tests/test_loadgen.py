"""servelab.loadgen: SSE parsing, workloads, arrivals, latency maths, and a real run."""
import asyncio
import json
import math
import random
import statistics

import httpx
import pytest

from servelab.loadgen import (RequestRecord, RequestSpec, SSEDecoder, arrival_times, load_trace, main,
                              parse_length_dist, percentiles, run_load, summarize, synthetic_requests,
                              token_latencies)

STREAM = (b'data: {"a": 1}\n\n: keep-alive comment\n\ndata: {"b": "\xc3\xa9t\xc3\xa9"}\r\n\r\n'
          b'event: x\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n')
EXPECT = ['{"a": 1}', '{"b": "été"}', "line1\nline2", "[DONE]"]


def test_sse_decoder_whole_and_split_at_every_byte():
    assert SSEDecoder().feed(STREAM) == EXPECT
    for cut in range(1, len(STREAM)):
        d = SSEDecoder()
        assert d.feed(STREAM[:cut]) + d.feed(STREAM[cut:]) == EXPECT, cut
    d = SSEDecoder()
    assert [e for b in STREAM for e in d.feed(bytes([b]))] == EXPECT
    assert SSEDecoder().feed('data: {"x": 2}\n\n') == ['{"x": 2}']  # text works too
    assert SSEDecoder().feed(b'data: {"x": 2}\n') == []  # no blank line yet: not complete


def test_length_distributions():
    rng = random.Random(0)
    assert parse_length_dist("fixed:7")(rng) == 7 and parse_length_dist(5)(rng) == 5
    xs = [parse_length_dist("uniform:3:9")(rng) for _ in range(500)]
    assert min(xs) == 3 and max(xs) == 9
    ln = [parse_length_dist("lognormal:100:0.5")(rng) for _ in range(2000)]
    assert 85 < statistics.median(ln) < 115
    ex = [parse_length_dist("exponential:50")(rng) for _ in range(4000)]
    assert 45 < statistics.mean(ex) < 55 and min(ex) >= 1
    for bad in ("gauss:3", "fixed", "uniform:9:3", "fixed:-2", "fixed:x"):
        with pytest.raises(ValueError):
            parse_length_dist(bad)
    with pytest.raises(TypeError):
        parse_length_dist(3.5)


@pytest.mark.parametrize("spec", ["fixed:0.5", "fixed:2.5", "uniform:0.5:3", "uniform:2:3.5"])
def test_fractional_fixed_or_uniform_lengths_are_refused_not_rounded(spec):
    with pytest.raises(ValueError, match="whole number"):
        parse_length_dist(spec)


def test_synthetic_requests_and_trace(tmp_path):
    reqs = synthetic_requests(20, "uniform:4:8", "fixed:3", vocab_size=50, seed=1)
    assert len(reqs) == 20 and all(4 <= len(r.prompt) <= 8 for r in reqs)
    assert all(r.max_tokens == 3 and r.prompt_len == len(r.prompt) and max(r.prompt) < 50 for r in reqs)
    assert synthetic_requests(20, "uniform:4:8", "fixed:3", vocab_size=50, seed=1) == reqs
    path = tmp_path / "t.jsonl"
    # the older field names still read: timestamp, prompt_len, max_tokens / output_len
    path.write_text('{"prompt": "hi", "prompt_len": 1, "max_tokens": 4, "timestamp": 0.5}\n\n'
                    '{"prompt_len": 6, "output_len": 2, "timestamp": 0.25}\n')
    t = load_trace(path)
    assert t[1] == RequestSpec("hi", 4, 1, 0.5) and len(t[0].prompt) == 6 and t[0].max_tokens == 2
    path.write_text('{"prompt": [5, 6, 7], "max_tokens": 4}\n{"prompt_len": 6, "output_len": 2}\n')
    t = load_trace(path)  # untimed: sent at a rate
    assert t[0] == RequestSpec([5, 6, 7], 4, 3, None) and t[1].arrival_s is None
    for bad, match in (('{"prompt": "hi", "prompt_len": 2}', "output_tokens"), ('{"prompt": "hi", "max_tokens": 2}',
                       "prompt_tokens"), ('{"prompt_len": 2, "max_tokens": 2, "timestamp": 1}\n{"prompt_len": 2, '
                                          '"max_tokens": 2}', "arrival time")):
        path.write_text(bad + "\n")
        with pytest.raises(ValueError, match=match):
            load_trace(path)


def test_a_simulator_trace_drives_loadgen_and_a_recorded_run_replays(tmp_path):
    """One trace format: the simulator's trace (with a shared-prefix group) becomes loadgen's
    requests, and the trace a run sent reads back as the same requests."""
    from servelab.workload import load_trace as load_sim_trace, save_trace, synthetic
    tr = synthetic(12, 5.0, prompt=8, output=3, prefix_groups=1, prefix_tokens=16, prefix_share=0.5, seed=2)
    path = save_trace(tr, tmp_path / "sim.jsonl")
    reqs = load_trace(path, vocab_size=50)
    assert [r.arrival_s for r in reqs] == pytest.approx(tr.arrival_s.tolist(), abs=1e-6)
    assert [len(r.prompt) for r in reqs] == tr.prompt_tokens.tolist()
    members = [r for r in reqs if r.prefix_group >= 0]
    assert len(members) >= 2 and all(r.prompt[:16] == members[0].prompt[:16] for r in members)
    # a run's summary as run_load writes it: send times, prompt lengths, tokens received
    summary = {"requests": [{"index": i, "sent": 0.1 * i, "prompt_len": r.prompt_len, "output_tokens": 3,
                             "error": None} for i, r in enumerate(reqs)]}
    summary["requests"][3]["error"] = "HTTP 500"  # a failed request is left out
    from servelab.loadgen import trace_of
    rec = save_trace(trace_of(summary, reqs), tmp_path / "rec.jsonl")
    back = load_sim_trace(rec)
    assert len(back) == 11 and back.prefix_group.tolist() == [r.prefix_group for k, r in enumerate(reqs) if k != 3]
    again = load_trace(rec, vocab_size=50)
    assert [r.prompt for r in again] == [r.prompt for k, r in enumerate(reqs) if k != 3]


def test_arrivals_rate_and_burstiness():
    n = 4000
    poisson = arrival_times(n, rate=10, seed=0)
    gaps = [b - a for a, b in zip(poisson, poisson[1:])]
    assert poisson[0] == 0 and abs(statistics.mean(gaps) - 0.1) < 0.01
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert 0.9 < cv < 1.1  # exponential gaps: coefficient of variation 1
    bursty = arrival_times(n, rate=10, burstiness=0.25, seed=0)
    bg = [b - a for a, b in zip(bursty, bursty[1:])]
    assert statistics.pstdev(bg) / statistics.mean(bg) > 1.6  # gamma shape k: CV = 1/sqrt(k) = 2
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    for bad in (dict(rate=0), dict(rate=-1), dict(rate=1, burstiness=0)):
        with pytest.raises(ValueError):
            arrival_times(5, **bad)


def test_token_latencies_tpot_excludes_the_first_token():
    lat = token_latencies(10.0, [10.5, 10.6, 10.8, 11.1])
    assert lat["ttft"] == pytest.approx(0.5) and lat["e2e"] == pytest.approx(1.1)
    assert lat["tpot"] == pytest.approx(0.2) and lat["itl"] == pytest.approx([0.1, 0.2, 0.3])
    assert token_latencies(0.0, [1.0])["tpot"] is None
    with pytest.raises(ValueError):
        token_latencies(0.0, [])
    with pytest.raises(ValueError):
        token_latencies(0.0, [2.0, 1.0])


def test_percentiles_and_goodput():
    p = percentiles([1, 2, 3, 4, 5])
    assert p["p50"] == 3 and p["mean"] == 3 and p["p90"] == pytest.approx(4.6)
    recs = [RequestRecord(0, 0.0, 4, [0.1, 0.2, 0.3], 0.3, 3), RequestRecord(1, 0.0, 4, [0.9, 1.0], 1.0, 2),
            RequestRecord(2, 0.0, 4, error="boom")]
    s = summarize(recs, 2.0, slo_ttft_s=0.5)
    assert s["completed"] == 2 and s["failed"] == 1 and s["good_requests"] == 1 and s["goodput"] == 0.5
    assert s["output_throughput"] == 2.5 and s["tpot_s"]["p50"] == pytest.approx(0.1)


@pytest.fixture(scope="module")
def server():
    from servelab.bpe import load_course_tokenizer
    from servelab.server import ServerSettings, ServerThread, build_engine, create_app
    from test_server import MODEL, tiny_model
    engine = build_engine(tiny_model(), load_course_tokenizer(), num_kv_blocks=256)
    with ServerThread(create_app(engine, ServerSettings(model_name=MODEL))) as srv:
        yield srv


def test_run_load_against_the_server(server):
    reqs = synthetic_requests(12, "uniform:4:20", "uniform:2:6", vocab_size=4000, seed=3)
    s = asyncio.run(run_load(server.url, reqs, model="tiny", rate=200, max_concurrency=4, progress=False,
                             slo_ttft_s=60))
    assert s["completed"] == 12 and s["failed"] == 0
    assert s["output_tokens"] == sum(r.max_tokens for r in reqs)  # ignore_eos: exact lengths
    assert s["good_requests"] == 12 and s["ttft_s"]["p99"] >= s["ttft_s"]["p50"] > 0
    assert all(r["output_tokens"] == q.max_tokens for r, q in zip(s["requests"], reqs))
    bad = asyncio.run(run_load(server.url, reqs[:2], model="nope", progress=False))
    assert bad["failed"] == 2 and "404" in bad["requests"][0]["error"]


def test_cli_writes_json_and_plot(server, tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    code = main(["--base-url", server.url, "--model", "tiny", "--num-prompts", "6", "--input-len", "fixed:8",
                 "--output-len", "fixed:3", "--request-rate", "50", "--burstiness", "0.5", "--no-progress",
                 "--out", str(out), "--plot", str(png), "--slo-ttft-ms", "60000"])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["completed"] == 6 and data["output_tokens"] == 18 and png.stat().st_size > 1000
    assert "TTFT" in capsys.readouterr().out
    # the trace a run sent, recorded, replays: same prompts, lengths and send times
    rec = tmp_path / "sent.jsonl"
    assert main(["--base-url", server.url, "--model", "tiny", "--num-prompts", "4", "--input-len", "fixed:8",
                 "--output-len", "fixed:3", "--request-rate", "50", "--no-progress", "--record-trace", str(rec)]) == 0
    again = load_trace(rec)
    assert len(again) == 4 and all(len(r.prompt) == 8 and r.max_tokens == 3 for r in again)
    assert again[0].arrival_s is not None and code == 0


def test_raw_client_matches_httpx_and_reuses_connections(server):
    from servelab.loadgen import RawHTTPClient
    reqs = synthetic_requests(10, "uniform:4:12", "uniform:2:5", vocab_size=4000, seed=4)
    runs = {kind: asyncio.run(run_load(server.url, reqs, model="tiny", max_concurrency=3, progress=False,
                                       client=kind)) for kind in ("raw", "httpx")}
    assert runs["raw"]["failed"] == runs["httpx"]["failed"] == 0
    assert [r["output_tokens"] for r in runs["raw"]["requests"]] == \
        [r["output_tokens"] for r in runs["httpx"]["requests"]]

    async def reuse():
        c = RawHTTPClient(server.url, timeout_s=30)
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}
        for _ in range(3):
            async with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                raw = await r.aread()
                assert raw.endswith(b"data: [DONE]\n\n")
        idle = len(c._idle)
        async with c.stream("POST", "/v1/completions", json={"model": "nope", "prompt": "hi"}) as r:
            assert r.status_code == 404 and b"does not exist" in await r.aread()  # a sized body
        await c.aclose()
        return idle

    assert asyncio.run(reuse()) == 1  # one connection served all three streams
    with pytest.raises(ValueError, match="http:// or https://"):
        RawHTTPClient("ftp://x")
    with pytest.raises(ValueError, match="'raw' or 'httpx'"):
        asyncio.run(run_load(server.url, reqs[:1], model="tiny", client="curl", progress=False))


def test_raw_client_never_sends_a_post_twice_on_a_new_connection():
    """A POST that fails on a new connection is not sent again (the server may have taken it);
    only an idle kept-alive connection the server closed meanwhile is retried, once."""
    from servelab.loadgen import RawHTTPClient

    async def scenario():
        posts = []
        ok = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        async def handle(reader, writer):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0]
                             .split(b":")[1])
                await reader.readexactly(length)
                posts.append(head.split(b" ")[1])
                if len(posts) in (1, 3):  # take the request, then drop the connection unanswered
                    writer.close()
                    return
                writer.write(ok)
                await writer.drain()
                if len(posts) == 2:  # answer, then close the kept-alive connection while it idles
                    await asyncio.sleep(0.05)
                    writer.close()
                    return

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        c = RawHTTPClient(f"http://127.0.0.1:{port}", timeout_s=5)
        with pytest.raises(ConnectionError):
            async with c.stream("POST", "/a", json={}):
                pass
        assert len(posts) == 1  # dropped on a new connection: not sent again
        async with c.stream("POST", "/b", json={}) as r:
            assert await r.aread() == b"ok"
        assert len(c._idle) == 1
        await asyncio.sleep(0.2)  # the server closes the idle connection
        with pytest.raises(ConnectionError):  # the retry, on a new connection, is dropped too
            async with c.stream("POST", "/c", json={}):
                pass
        await c.aclose()
        srv.close()
        return posts

    posts = asyncio.run(scenario())
    assert posts == [b"/a", b"/b", b"/c"]  # /c reached the server once: the stale connection took nothing
