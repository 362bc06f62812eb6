"""servelab.server: OpenAI's fields and shapes, every refusal, disconnects.

Every server here listens on 127.0.0.1 at a port the OS picks, runs in a
background thread, and is stopped by its fixture. Every client call has a
timeout. The served model is a random-weight tiny Llama in float64 with the
course tokenizer, so that greedy text can be compared with ``LLM.generate``
exactly (float64 keeps batched and unbatched argmaxes equal).
"""
import asyncio
import json
import threading
import time

import httpx
import pytest

from servelab.bpe import load_course_tokenizer
from servelab.engine import LLM
from servelab.sampling import SamplingParams
from servelab.server import (APIError, Limits, ServerSettings, ServerThread, build_engine,
                             create_app, encode_chat, parse_request, sse)
from servelab.server.metrics import Histogram

from server_builders import tiny_model

MODEL = "tiny"
TIMEOUT = httpx.Timeout(20.0)
PROMPTS = ["def add(a, b):", "The cache holds", "import numpy as np\n", "Once upon a time",
           "x = [1, 2, 3]", "SELECT * FROM", "Hello, world", "for i in range(10):"]


@pytest.fixture(scope="module")
def tok():
    return load_course_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def serve(model, tok, settings=None, **engine_options):
    engine_options.setdefault("num_kv_blocks", 256)
    engine = build_engine(model, tok, **engine_options)
    settings = settings or ServerSettings(model_name=MODEL)
    return ServerThread(create_app(engine, settings)), engine


@pytest.fixture(scope="module")
def server(model, tok):
    srv, engine = serve(model, tok)
    with srv:
        yield srv, engine


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server[0].url, timeout=TIMEOUT) as c:
        yield c


def body(**kw):
    b = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
    b.update(kw)
    return {k: v for k, v in b.items() if v is not ...}


def read_stream(resp):
    """The decoded SSE payloads of a streamed response, [DONE] as the string."""
    events = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def wait_until(cond, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def idle(engine, loop):
    return loop.num_in_flight == 0 and not engine.has_unfinished_requests()


# ------------------------------------------------------------------ protocol
LIMITS = Limits(model=MODEL, max_model_len=256, pool_tokens=4096, vocab_size=4096)


def test_parse_maps_openai_fields_to_sampling_params(tok):
    req = parse_request({"model": MODEL, "prompt": "hi", "max_tokens": 5, "temperature": 0.5,
                         "top_p": 0.9, "top_k": -1, "seed": 3, "stop": "\n", "stream": True,
                         "stream_options": {"include_usage": True}, "logprobs": 2, "user": "u1"},
                        "completion", tok, LIMITS)
    sp = req.sampling_params
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.seed, sp.stop, sp.logprobs) == \
        (5, 0.5, 0.9, 0, 3, ["\n"], 2)
    assert req.stream and req.include_usage and req.user == "u1"
    assert req.prompt_token_ids == tok.encode("hi")


def test_chat_template_uses_role_tokens_and_plain_content(tok):
    ids = encode_chat(tok, [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "say <|end|>"}])
    sp = tok.special_tokens
    assert ids[0] == sp["<|system|>"] and sp["<|user|>"] in ids
    assert ids.count(sp["<|end|>"]) == 2  # the typed "<|end|>" stays text
    assert ids[-2:] == [sp["<|assistant|>"]] + tok.encode("\n")
    req = parse_request({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "chat", tok, LIMITS)
    assert req.sampling_params.stop_token_ids == [sp["<|end|>"]]
    assert req.sampling_params.max_tokens == 256 - len(req.prompt_token_ids)  # chat: what the context leaves


def test_max_completion_tokens_and_defaults(tok):
    req = parse_request({"model": MODEL, "prompt": "hi", "max_completion_tokens": 7}, "completion", tok, LIMITS)
    assert req.sampling_params.max_tokens == 7
    assert parse_request({"model": MODEL, "prompt": "hi"}, "completion", tok, LIMITS).sampling_params.max_tokens == 16
    with pytest.raises(APIError, match="disagree"):
        parse_request({"model": MODEL, "prompt": "hi", "max_tokens": 3, "max_completion_tokens": 4},
                      "completion", tok, LIMITS)


@pytest.mark.parametrize("bad,param,status", [
    ({"prompt": "hi"}, "model", 400),
    ({"model": 3, "prompt": "hi"}, "model", 400),
    ({"model": "gpt-9", "prompt": "hi"}, "model", 404),
    ({"model": MODEL}, "prompt", 400),
    ({"model": MODEL, "prompt": ""}, "prompt", 400),
    ({"model": MODEL, "prompt": 5}, "prompt", 400),
    ({"model": MODEL, "prompt": [1, 99999]}, "prompt", 400),
    ({"model": MODEL, "prompt": ["a", "b"]}, "prompt", 400),
    ({"model": MODEL, "prompt": "hi", "temperature": "hot"}, "temperature", 400),
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, "temperature", 400),
    ({"model": MODEL, "prompt": "hi", "temperature": 2.5}, "temperature", 400),
    ({"model": MODEL, "prompt": "hi", "temperature": float("nan")}, "temperature", 400),
    ({"model": MODEL, "prompt": "hi", "top_p": 0}, "top_p", 400),
    ({"model": MODEL, "prompt": "hi", "top_p": 1.5}, "top_p", 400),
    ({"model": MODEL, "prompt": "hi", "top_k": -2}, "top_k", 400),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens", 400),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 2.5}, "max_tokens", 400),
    ({"model": MODEL, "prompt": "hi", "max_tokens": True}, "max_tokens", 400),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 300}, "max_tokens", 400),
    ({"model": MODEL, "prompt": "hi", "seed": -1}, "seed", 400),
    ({"model": MODEL, "prompt": "hi", "stop": 3}, "stop", 400),
    ({"model": MODEL, "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", 400),
    ({"model": MODEL, "prompt": "hi", "stop": [""]}, "stop", 400),
    ({"model": MODEL, "prompt": "hi", "n": 0}, "n", 400),
    ({"model": MODEL, "prompt": "hi", "n": 17}, "n", 400),
    ({"model": MODEL, "prompt": "hi", "n": 1.5}, "n", 400),
    ({"model": MODEL, "prompt": "hi", "logprobs": 6}, "logprobs", 400),
    ({"model": MODEL, "prompt": "hi", "stream": "yes"}, "stream", 400),
    ({"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options", 400),
    ({"model": MODEL, "prompt": "hi", "presence_penalty": 2.5}, "presence_penalty", 400),
    ({"model": MODEL, "prompt": "hi", "frequency_penalty": -3}, "frequency_penalty", 400),
    ({"model": MODEL, "prompt": "hi", "min_p": 1.5}, "min_p", 400),
    ({"model": MODEL, "prompt": "hi", "repetition_penalty": 0}, "repetition_penalty", 400),
    ({"model": MODEL, "prompt": "hi", "logit_bias": {"5": 1}}, "logit_bias", 400),
    ({"model": MODEL, "prompt": "hi", "user": 7}, "user", 400),
])
def test_parse_refuses_bad_fields_naming_them(tok, bad, param, status):
    with pytest.raises(APIError) as info:
        parse_request(bad, "completion", tok, LIMITS)
    assert info.value.status == status
    assert info.value.param == param
    assert param in info.value.message or status == 404


@pytest.mark.parametrize("messages,param", [
    (None, "messages"), ([], "messages"), ("hi", "messages"), ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 3}], "messages[0].content"), (["hi"], "messages[0]"),
])
def test_parse_refuses_bad_messages(tok, messages, param):
    b = {"model": MODEL} if messages is None else {"model": MODEL, "messages": messages}
    with pytest.raises(APIError) as info:
        parse_request(b, "chat", tok, LIMITS)
    assert info.value.param == param and info.value.status == 400


def test_parse_refuses_prompt_over_context_and_pool(tok):
    long_ids = [5] * 300
    with pytest.raises(APIError, match="maximum context length is 256"):
        parse_request({"model": MODEL, "prompt": long_ids}, "completion", tok, LIMITS)
    small = Limits(model=MODEL, max_model_len=256, pool_tokens=64, vocab_size=4096)
    with pytest.raises(APIError, match="KV cache pool holds 64"):
        parse_request({"model": MODEL, "prompt": [5] * 100}, "completion", tok, small)
    with pytest.raises(APIError, match=r"at most 4"):
        parse_request({"model": MODEL, "prompt": [5] * 60, "max_tokens": 10}, "completion", tok, small)


def test_a_prompt_too_long_to_fit_is_refused_by_its_length_before_tokenizing(tok):
    from servelab.server.protocol import max_prompt_chars
    limit = max_prompt_chars(tok, 256)
    longest = max(len(t) for t in tok.mergeable_ranks)
    assert limit >= 256 * longest  # no prompt that fits is refused: a token covers <= `longest` chars
    limits = Limits(model=MODEL, max_model_len=256, pool_tokens=4096, vocab_size=4096, max_prompt_chars=limit)

    def boom(*a, **kw):
        raise AssertionError("tokenized a prompt that could not fit")
    tokenizer = type("T", (), {"encode": boom, "encode_ordinary": boom,
                               "special_tokens": tok.special_tokens})()
    for b, kind, param in [({"prompt": "x" * (limit + 1)}, "completion", "prompt"),
                           ({"messages": [{"role": "user", "content": "x" * limit},
                                          {"role": "user", "content": "y"}]}, "chat", "messages")]:
        with pytest.raises(APIError, match="characters") as e:
            parse_request({"model": MODEL, **b}, kind, tokenizer, limits)
        assert e.value.param == param and e.value.code == "context_length_exceeded"


def test_sse_and_histogram_format():
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert sse("[DONE]") == b"data: [DONE]\n\n"
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 5.0):
        h.observe(v)
    lines = h.lines("x", "help")
    assert 'x_bucket{le="0.1"} 1' in lines and 'x_bucket{le="1"} 2' in lines
    assert 'x_bucket{le="+Inf"} 3' in lines and "x_count 3" in lines


# ------------------------------------------------------------------ over HTTP
def test_models_health_metrics(server, client):
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["kv_blocks_total"] == 256
    assert h["block_size"] == server[1].config.block_size  # what cached_tokens counts in
    client.post("/v1/completions", json=body())
    text = client.get("/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_blocks_used",
                 "prefix_cache_hit_rate", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_bucket", "prompt_tokens_total", "generation_tokens_total"):
        assert f"servelab:{name}" in text, name


def test_greedy_text_equals_offline_generate(server, model, tok, client):
    offline = LLM(model, tok, num_kv_blocks=256).generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12))
    for prompt, ref in zip(PROMPTS, offline):
        r = client.post("/v1/completions", json=body(prompt=prompt, max_tokens=12))
        assert r.status_code == 200
        choice = r.json()["choices"][0]
        assert choice["text"] == ref.text and choice["finish_reason"] == ref.finish_reason
        # streamed, the same text in pieces
        with client.stream("POST", "/v1/completions", json=body(prompt=prompt, max_tokens=12, stream=True)) as s:
            events = read_stream(s)
        assert events[-1] == "[DONE]"
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == ref.text


def test_usage_and_cached_tokens_grow_with_a_resent_conversation(client, tok):
    messages = [{"role": "system", "content": "You are a terse assistant that answers in code. " * 4},
                {"role": "user", "content": "Write a loop."}]
    cached, prompt = [], []
    for turn in range(3):
        r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 6,
                                                       "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        out = r.json()
        u = out["usage"]
        assert u["completion_tokens"] == len(tok.encode(out["choices"][0]["message"]["content"],
                                                        allowed_special="all")) or u["completion_tokens"] <= 6
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        prompt.append(u["prompt_tokens"])
        cached.append(u["prompt_tokens_details"]["cached_tokens"])
        messages += [out["choices"][0]["message"], {"role": "user", "content": f"Again, {turn}."}]
    assert prompt[0] < prompt[1] < prompt[2]
    assert cached[1] > 0 and cached[2] > cached[1]
    assert all(c % 16 == 0 and c < p for c, p in zip(cached, prompt))


def test_streaming_shapes_usage_chunk_and_done(client):
    with client.stream("POST", "/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        events = read_stream(s)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks].count("length") == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_string_is_never_streamed_in_part(client):
    full = client.post("/v1/completions", json=body(max_tokens=24, ignore_eos=True)).json()["choices"][0]["text"]
    stop = full[8:11]
    assert len(stop) == 3 and stop.strip()
    expect = full[:full.index(stop)]
    with client.stream("POST", "/v1/completions", json=body(max_tokens=24, ignore_eos=True, stop=[stop],
                                                               stream=True)) as s:
        events = read_stream(s)
    pieces = [e["choices"][0]["text"] for e in events[:-1]]
    assert "".join(pieces) == expect
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_logprobs_shapes(client):
    c = client.post("/v1/completions", json=body(logprobs=2, max_tokens=4, ignore_eos=True)).json()["choices"][0]
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert all(len(t) <= 2 and all(v <= 0 for v in t.values()) for t in lp["top_logprobs"])
    assert "".join(lp["tokens"]) == c["text"]
    chat = client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
        "ignore_eos": True, "logprobs": True, "top_logprobs": 3}).json()["choices"][0]["logprobs"]["content"]
    assert len(chat) == 3 and all(len(t["top_logprobs"]) == 3 and t["logprob"] <= 0 for t in chat)
    # greedy: the chosen token is the best alternative
    assert all(t["top_logprobs"][0]["logprob"] == pytest.approx(t["logprob"]) for t in chat)


def test_seeded_sampling_repeats(client):
    b = body(temperature=1.0, seed=11, max_tokens=10, ignore_eos=True)
    a = client.post("/v1/completions", json=b).json()["choices"][0]["text"]
    assert client.post("/v1/completions", json=b).json()["choices"][0]["text"] == a


def test_openai_client_completes_and_streams(server):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=server[0].url + "/v1", api_key="none", timeout=20, max_retries=0)
    r = c.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.prompt_tokens > 0
    stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       temperature=0, stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    parts = list(stream)
    assert parts[-1].usage.completion_tokens == 4
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="gpt-9", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt="x", max_tokens=2, temperature=-3)


@pytest.mark.parametrize("payload,status,param", [
    (b"{not json", 400, None),
    (b'["a list"]', 400, None),
    (json.dumps({"model": MODEL, "prompt": "hi", "top_p": 7}).encode(), 400, "top_p"),
    (json.dumps({"model": MODEL}).encode(), 400, "prompt"),
    (json.dumps({"model": "other", "prompt": "hi"}).encode(), 404, "model"),
    (json.dumps({"model": MODEL, "prompt": [5] * 250, "max_tokens": 10}).encode(), 400, "max_tokens"),
    (json.dumps({"model": MODEL, "prompt": [5] * 300}).encode(), 400, "prompt"),
])
def test_bad_input_over_http_gets_openai_error_body(client, payload, status, param):
    r = client.post("/v1/completions", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param


def test_deeply_nested_json_is_a_400_in_openai_shape(client):
    nested = b"[" * 50_000 + b"]" * 50_000  # ~100 KB: under the size limit, past Python's recursion limit
    r = client.post("/v1/completions", content=nested, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_an_unexpected_error_is_a_500_in_openai_shape(client, monkeypatch):
    from servelab.server import protocol

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the server")
    monkeypatch.setattr(protocol, "parse_request", broken)
    r = client.post("/v1/completions", json=body())
    assert r.status_code == 500
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "internal_server_error"


def test_a_950_kb_prompt_is_a_400_naming_the_character_limit_before_tokenizing(server, client,
                                                                              monkeypatch):
    srv = server[0]
    limit = srv.app.state.limits.max_prompt_chars
    tokenizer = srv.app.state.engine_loop.tokenizer
    real, seen = tokenizer.encode, []

    def counting(text, **kw):
        seen.append(len(text))
        return real(text, **kw)
    monkeypatch.setattr(tokenizer, "encode", counting)
    r = client.post("/v1/completions", json=body(prompt="word " * 190_000))  # 950 KB
    assert r.status_code == 400 and f"{limit:,} characters" in r.json()["error"]["message"]
    assert not [n for n in seen if n > limit], "the over-long prompt was tokenized before refusal"


def test_tokenizing_a_long_prompt_does_not_stall_the_event_loop(server, client, monkeypatch):
    """A body over ``inline_parse_bytes`` is checked and tokenized in a worker thread;
    meanwhile the event loop answers (here: /health) as if nothing were running."""
    srv, _ = server
    tokenizer = srv.app.state.engine_loop.tokenizer
    real = tokenizer.encode

    where = []

    def slow(text, **kw):  # a tokenization that takes a second
        if text.startswith("SLOW"):
            where.append(threading.current_thread().name)
            time.sleep(1.0)
        return real(text, **kw)
    monkeypatch.setattr(tokenizer, "encode", slow)
    big = body(prompt="SLOW prompt", max_tokens=2, user="u" * 8_000)  # a body over 4 KB

    async def go():
        async with httpx.AsyncClient(base_url=srv.url, timeout=TIMEOUT) as c:
            slow_req = asyncio.create_task(c.post("/v1/completions", json=big))
            await asyncio.sleep(0.2)  # the slow tokenization is under way
            health = await c.get("/health")
            answered_first = not slow_req.done()  # order, not a clock: no time limit to flake
            return (await slow_req).status_code, health.status_code, answered_first

    slow_status, health_status, answered_first = asyncio.run(go())
    assert slow_status == 200 and health_status == 200
    assert where and where[0] != srv.thread.name, where  # not the event loop's thread
    assert answered_first, f"/health waited behind a tokenization (in {where})"


def test_a_request_the_engine_refuses_is_an_http_error_before_any_stream(client):
    """Admission (the sampler's dry run) happens before the 200: no 200 then an error event."""
    with client.stream("POST", "/v1/completions", json=body(temperature=1e-300, stream=True)) as r:
        assert r.status_code == 400, r.read()
        r.read()
        assert r.json()["error"]["message"]
    assert client.post("/v1/completions", json=body(temperature=1e-300)).status_code == 400


def test_streamed_text_offsets_equal_the_non_streamed_ones_with_a_stop_string(client):
    """Offsets count the tokens' text, not the characters sent (those lag behind a stop
    string's holdback)."""
    full = client.post("/v1/completions", json=body(max_tokens=24, ignore_eos=True)).json()["choices"][0]["text"]
    b = body(max_tokens=24, ignore_eos=True, stop=[full[8:11]], logprobs=1)
    want = client.post("/v1/completions", json=b).json()["choices"][0]["logprobs"]
    with client.stream("POST", "/v1/completions", json={**b, "stream": True}) as s:
        events = read_stream(s)
    got = [ch["logprobs"] for e in events[:-1] for ch in e["choices"] if ch["logprobs"]]
    assert [t for lp in got for t in lp["tokens"]] == want["tokens"]
    assert [o for lp in got for o in lp["text_offset"]] == want["text_offset"]


def test_body_over_the_size_limit_is_413(model, tok):
    srv, _ = serve(model, tok, ServerSettings(model_name=MODEL, max_body_bytes=2_000), num_kv_blocks=32)
    with srv, httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        big = json.dumps({"model": MODEL, "prompt": "x" * 5_000})
        r = c.post("/v1/completions", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "2,000 bytes" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: the limit is enforced while reading
            for _ in range(10):
                yield b" " * 500
        r = c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.post("/v1/completions", json=body(max_tokens=2)).status_code == 200


def test_a_stopped_server_keeps_no_dispatcher(model, tok):
    """The engine thread's events reach the event loop through a dispatcher made when the
    server starts and dropped when it stops (a module-wide table keyed by id(loop) once
    kept one per event loop ever served, each holding its loop, never pruned)."""
    from servelab.server import app as app_module
    fronts = []
    for _ in range(2):
        srv, _ = serve(model, tok, num_kv_blocks=32)
        with srv, httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
            assert c.post("/v1/completions", json=body(max_tokens=2)).status_code == 200
            fronts.append(srv.app.state.engine_loop)
            assert fronts[-1]._dispatcher is not None
    assert [f._dispatcher for f in fronts] == [None, None]
    assert not getattr(app_module, "_DISPATCHERS", {})


def test_an_engine_that_cannot_step_any_more_is_an_engine_loss(model, tok):
    """EngineDeadError (a tensor-parallel worker died) fails the step's requests, and since
    the engine stays dead the loop stops: /health 503, new requests 503, on_lost says why."""
    from server_builders import DEATH_SEED, make_mortal
    srv, engine = serve(model, tok, ServerSettings(model_name=MODEL, exit_on_engine_loss=False),
                        num_kv_blocks=32)
    make_mortal(engine)
    with srv, httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        assert c.post("/v1/completions", json=body(max_tokens=2)).status_code == 200
        r = c.post("/v1/completions", json=body(temperature=0.8, seed=DEATH_SEED))
        assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
        assert "rank 1" in r.json()["error"]["message"]
        assert wait_until(lambda: srv.app.state.engine_lost is not None)
        assert "cannot step any more" in srv.app.state.engine_lost
        assert c.get("/health").status_code == 503
        assert c.post("/v1/completions", json=body()).json()["error"]["code"] == "engine_down"


def test_prompt_larger_than_the_pool_is_400(model, tok):
    srv, engine = serve(model, tok, num_kv_blocks=4, block_size=16)  # 64 slots, context 256
    with srv, httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        r = c.post("/v1/completions", json=body(prompt=[7] * 100))
        assert r.status_code == 400 and "KV cache pool holds 64" in r.json()["error"]["message"]
        assert engine.get_num_unfinished_requests() == 0


def test_too_many_requests_is_429_with_retry_after(model, tok):
    srv, engine = serve(model, tok, ServerSettings(model_name=MODEL, max_queued_requests=0), max_num_seqs=2)
    loop = srv.app.state.engine_loop
    real = engine.sampler

    def slow(logits, seqs):  # keep the two streams busy while the third request arrives
        time.sleep(0.02)
        return real(logits, seqs)

    engine.sampler = slow
    with srv, httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        b = body(max_tokens=200, ignore_eos=True, stream=True)
        with c.stream("POST", "/v1/completions", json=b) as s1, c.stream("POST", "/v1/completions", json=b) as s2:
            lines1, lines2 = s1.iter_lines(), s2.iter_lines()  # keep them: a dropped iterator closes
            next(lines1), next(lines2)
            r = c.post("/v1/completions", json=body())
            assert r.status_code == 429, (loop.snapshot(), r.text[:300])
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error" and "limit is 2" in r.json()["error"]["message"]
        assert wait_until(lambda: idle(engine, loop))
        assert c.post("/v1/completions", json=body()).status_code == 200

        async def burst(k=8):  # k streams at once: at most 2 may be admitted, the rest 429
            async with httpx.AsyncClient(base_url=srv.url, timeout=TIMEOUT) as ac:
                async def one():
                    async with ac.stream("POST", "/v1/completions",
                                         json=body(max_tokens=20, ignore_eos=True, stream=True)) as r:
                        await r.aread()
                        return r.status_code
                return await asyncio.gather(*(one() for _ in range(k)))
        codes = asyncio.run(burst())
        assert set(codes) <= {200, 429} and 1 <= codes.count(200) <= 2, codes
        assert wait_until(lambda: idle(engine, loop))


def test_disconnect_frees_blocks_within_one_step(server):
    srv, engine = server
    loop = srv.app.state.engine_loop
    assert wait_until(lambda: idle(engine, loop))
    total = engine.scheduler.kv.allocator.num_free
    n_aborts = len(loop.abort_log)
    with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=body(max_tokens=200, ignore_eos=True, stream=True)) as s:
            lines = s.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(g.startswith("data: ") for g in got)
            assert engine.scheduler.kv.allocator.num_free < total  # it holds blocks now
    # leaving the block closed the connection
    assert wait_until(lambda: len(loop.abort_log) > n_aborts)
    rec = loop.abort_log[-1]
    assert rec.freed and rec.step_applied - rec.step_requested <= 1
    assert wait_until(lambda: idle(engine, loop))
    assert engine.scheduler.kv.allocator.num_free == total
    text = httpx.get(srv.url + "/metrics", timeout=TIMEOUT).text  # an abort is not a success
    assert 'finished_reason="abort"' not in text
    assert int(text.split("\nservelab:request_aborted_total ")[1].split()[0]) >= 1


def test_a_request_whose_sampling_raises_fails_alone(server, monkeypatch):
    import servelab.sampling as sampling
    real = sampling.sample

    def picky(logits, params, generator=None, *a, **kw):
        if getattr(params, "seed", None) == 13:
            raise RuntimeError("this sampler cannot handle seed 13")
        return real(logits, params, generator, *a, **kw)

    monkeypatch.setattr(sampling, "sample", picky)
    srv, engine = server
    with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=body(max_tokens=30, ignore_eos=True, stream=True)) as ok:
            lines = ok.iter_lines()
            next(lines)
            bad = c.post("/v1/completions", json=body(temperature=0.8, seed=13))
            assert bad.status_code == 400 and "seed 13" in bad.json()["error"]["message"]
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_a_request_whose_sampling_raises_mid_stream_ends_alone(server, monkeypatch):
    """Past the admission dry run: the engine isolates the failing row, the stream gets
    OpenAI's error event, its neighbour streams on, and every block comes back."""
    import servelab.sampling as sampling
    real = sampling.sample
    calls = {"n": 0}

    def picky(logits, params, generator=None, *a, **kw):
        if getattr(params, "seed", None) == 14:
            calls["n"] += 1
            if calls["n"] > 4:  # the dry run and three tokens pass, then it breaks
                raise RuntimeError("this sampler broke on seed 14")
        return real(logits, params, generator, *a, **kw)

    monkeypatch.setattr(sampling, "sample", picky)
    srv, engine = server
    loop = srv.app.state.engine_loop
    with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=body(max_tokens=30, ignore_eos=True, stream=True)) as ok:
            lines = ok.iter_lines()
            next(lines)
            with c.stream("POST", "/v1/completions",
                          json=body(max_tokens=30, ignore_eos=True, stream=True, temperature=0.8,
                                    seed=14)) as bad:
                bad_events = read_stream(bad)
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert bad_events[-1] == "[DONE]" and bad_events[-2]["error"]["code"] == "request_failed"
    assert "seed 14" in bad_events[-2]["error"]["message"]
    assert sum(1 for e in bad_events[:-2] if e["choices"] and e["choices"][0]["text"]) <= 3
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert wait_until(lambda: idle(engine, loop))
    assert engine.scheduler.kv.allocator.num_used == 0


def test_an_engine_failure_ends_its_requests_and_the_server_goes_on(server):
    srv, engine = server
    loop = srv.app.state.engine_loop
    real = engine.runner.execute
    calls = {"n": 0}

    def flaky(step):  # the forward pass itself fails (a sampler failure is one request's: below)
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated kernel failure")
        return real(step)

    engine.runner.execute = flaky
    try:
        with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
            with c.stream("POST", "/v1/completions", json=body(max_tokens=20, ignore_eos=True, stream=True)) as s:
                events = read_stream(s)
            assert "error" in events[-2] and events[-2]["error"]["code"] == "engine_error"
            assert events[-1] == "[DONE]"
            text = c.get("/metrics").text  # admitted, then failed: a failure, not a rejection
            assert 'servelab:request_failed_total{code="engine_error"}' in text
            assert 'request_rejected_total{status="500"}' not in text
            assert wait_until(lambda: idle(engine, loop))
            assert engine.scheduler.kv.allocator.num_used == 0
            r = c.post("/v1/completions", json=body())
            assert r.status_code == 200
    finally:
        engine.runner.execute = real
    assert loop.num_engine_errors >= 1


def test_non_streamed_client_that_leaves_is_aborted(server):
    srv, engine = server
    loop = srv.app.state.engine_loop
    real = engine.sampler

    def slow(logits, seqs):  # 200 tokens now take seconds: the client leaves long before
        time.sleep(0.02)
        return real(logits, seqs)

    async def go():
        async with httpx.AsyncClient(base_url=srv.url, timeout=TIMEOUT) as c:
            task = asyncio.create_task(c.post("/v1/completions", json=body(max_tokens=200, ignore_eos=True)))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    n = len(loop.abort_log)
    engine.sampler = slow
    try:
        asyncio.run(go())
        assert wait_until(lambda: len(loop.abort_log) > n)
    finally:
        engine.sampler = real
    assert wait_until(lambda: idle(engine, loop))
    assert engine.scheduler.kv.allocator.num_used == 0


def test_parse_accepts_penalties_and_min_p(tok):
    """OpenAI's presence and frequency penalties and vLLM's min_p and repetition_penalty reach
    the request's SamplingParams."""
    body = {"model": MODEL, "prompt": "hi", "presence_penalty": 0.5, "frequency_penalty": -0.25,
            "min_p": 0.1, "repetition_penalty": 1.2}
    sp = parse_request(body, "completion", tok, LIMITS).sampling_params
    assert (sp.presence_penalty, sp.frequency_penalty, sp.min_p, sp.repetition_penalty) == (0.5, -0.25, 0.1, 1.2)
