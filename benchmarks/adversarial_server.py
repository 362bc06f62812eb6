"""An adversarial run against the real server: every answer in OpenAI's shape, no hung client,
no lost request.

    .venv/bin/python benchmarks/adversarial_server.py            # ~3-5 min on 2 CPUs
    .venv/bin/python benchmarks/adversarial_server.py --out D    # results into folder D

Starts ``python -m servelab.server`` (the committed ``servelab-main``, the
engine core in its own process, as deployed) and throws at it, over real HTTP:

* malformed bodies (truncated, not JSON, invalid UTF-8, a BOM, ~100 KB of nested
  arrays, nested objects inside a field, NaN and 1e400, a 2 MB body, no body);
* wrong types and out-of-range values for every field the server reads;
* limits (a 950 KB prompt, a 10,000-token prompt, ``max_tokens`` 10^9, ``n`` 17,
  a 100,000-character stop string, a burst past the 429 limit), and the longest
  gap a running stream sees while long prompts are answered;
* unicode (emoji, combining marks, right-to-left text, NUL, a lone surrogate,
  unicode stop strings), non-streamed and streamed;
* disconnects (streams dropped after k events, non-streamed calls cancelled, a
  body cut off mid-way, a client that sends headers only);
* 50 concurrent streams; then, each on a fresh server and under 50 streams:
  SIGTERM to the engine core (it ignores it: the API process decides), SIGKILL
  of the engine core (every stream must end with an error event and ``[DONE]``;
  the server exits 1 for its supervisor), and SIGTERM to the server (drain:
  new requests 503, short streams finish, long ones end with an error event
  after the grace, exit 0); and SIGKILL of a tensor-parallel worker
  (``--tensor-parallel-size 2``) under 8 streams.

A case passes when its status is the expected one and every non-200 answer
(and every error event inside a stream) is OpenAI's error object with a
message; a 500 must still have that shape. Every call has a timeout: a call
that hits it is a *hung client*. A stream that ends without ``[DONE]`` (or a
request with no answer at all) is a *lost request*. After the input cases the
server must be idle: nothing in flight, every KV block free.

Writes ``server_adversarial.md`` and ``server_adversarial.json`` into
benchmarks/results/ (or ``--out``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
MODEL_DIR = ROOT / "data" / "models" / "servelab-main"
NAME = "servelab-main"
CALL_TIMEOUT_S = 60.0           # a call that takes longer is a hung client
STREAMS = 50


# ---------------------------------------------------------------- checks
def error_shape_ok(obj) -> bool:
    """OpenAI's error object: {"error": {"message": str (non-empty), "type": str, "param", "code"}}."""
    if not isinstance(obj, dict) or set(obj) != {"error"}:
        return False
    e = obj["error"]
    return (isinstance(e, dict) and set(e) == {"message", "type", "param", "code"}
            and isinstance(e["message"], str) and e["message"] != "" and isinstance(e["type"], str))


class Results:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, group: str, name: str, ok: bool, status, note: str = "", seconds: float = 0.0,
            hung: bool = False, lost: int = 0, bad_500: bool = False):
        self.rows.append(dict(group=group, name=name, ok=bool(ok), status=status, note=note,
                              seconds=round(seconds, 3), hung=hung, lost=lost, bad_500=bad_500))
        mark = "ok  " if ok else "FAIL"
        print(f"  {mark} [{group}] {name}: {status} {note}", flush=True)


def body(**kw):
    b = {"model": NAME, "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
    b.update(kw)
    return {k: v for k, v in b.items() if v is not ...}


def post_case(res: Results, client: httpx.Client, group: str, name: str, *, json_body=None,
              content=None, headers=None, expect=(400,), path="/v1/completions", method="POST"):
    """One request; passes if the status is expected and any error answer has OpenAI's shape."""
    t0 = time.perf_counter()
    hdrs = {"content-type": "application/json", **(headers or {})}
    try:
        if json_body is not None:
            content = json.dumps(json_body, allow_nan=True).encode()
        r = client.request(method, path, content=content, headers=hdrs)
    except httpx.TimeoutException:
        res.add(group, name, False, "timeout", "hung client", time.perf_counter() - t0, hung=True)
        return None
    except httpx.HTTPError as exc:
        res.add(group, name, False, "no answer", f"{type(exc).__name__}: {exc}", time.perf_counter() - t0,
                lost=1)
        return None
    dt = time.perf_counter() - t0
    try:
        payload = r.json()
    except ValueError:
        payload = None
    shaped = r.status_code == 200 or error_shape_ok(payload)
    bad_500 = r.status_code >= 500 and not error_shape_ok(payload)
    note = ""
    if r.status_code != 200 and isinstance(payload, dict) and "error" in payload:
        e = payload["error"]
        note = f"{e.get('code')}: {str(e.get('message'))[:90]}"
    elif r.status_code == 200 and isinstance(payload, dict):
        note = f"text {payload['choices'][0].get('text', payload['choices'][0].get('message'))!r}"[:100]
    if not shaped:
        note = f"not OpenAI's shape: {r.text[:120]!r}"
    res.add(group, name, r.status_code in expect and shaped, r.status_code, note, dt, bad_500=bad_500)
    return r


async def stream_one(client: httpx.AsyncClient, b: dict, stop_after: int | None = None,
                     on_first=None) -> dict:
    """Stream one request; what came back: status, events, done, error, finish.
    ``on_first()`` is called once the answer's status, or its first event, is in."""
    out = {"status": None, "events": 0, "done": False, "error": None, "finish": None, "text": "",
           "shape_ok": True, "hung": False, "id": None}
    try:
        async with client.stream("POST", "/v1/completions", json=b) as r:
            out["status"] = r.status_code
            if r.status_code != 200:
                if on_first is not None:
                    on_first()
                    on_first = None
                data = await r.aread()
                try:
                    out["shape_ok"] = error_shape_ok(json.loads(data))
                except ValueError:
                    out["shape_ok"] = False
                out["error"] = "http"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if on_first is not None:
                    on_first()
                    on_first = None
                data = line[6:]
                if data == "[DONE]":
                    out["done"] = True
                    continue
                ev = json.loads(data)
                out["events"] += 1
                if "error" in ev:
                    out["error"] = ev["error"].get("code")
                    out["shape_ok"] = out["shape_ok"] and error_shape_ok(ev)
                    continue
                out["id"] = ev.get("id")
                for ch in ev.get("choices", []):
                    out["text"] += ch.get("text") or ""
                    out["finish"] = ch.get("finish_reason") or out["finish"]
                if stop_after is not None and out["events"] >= stop_after:
                    return out  # hang up
    except httpx.TimeoutException:
        out["hung"] = True
    except httpx.HTTPError as exc:
        out["error"] = out["error"] or f"transport: {type(exc).__name__}"
    if on_first is not None:  # it ended before its first event
        on_first()
    return out


def health(url: str) -> dict | None:
    try:
        return httpx.get(url + "/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None


def wait_idle(url: str, timeout_s: float = 60.0) -> dict | None:
    deadline = time.monotonic() + timeout_s
    h = None
    while time.monotonic() < deadline:
        h = health(url)
        if h and h["in_flight"] == 0 and h["running"] == h["waiting"] == h["kv_blocks_used"] == 0:
            return h
        time.sleep(0.05)
    return h


# ---------------------------------------------------------------- the input cases
def malformed(res: Results, c: httpx.Client) -> None:
    g = "malformed"
    for name, content in [("truncated object", b'{"model": "servelab-main", "prompt": "hi"'),
                          ("not JSON", b"hello"), ("empty body", b""),
                          ("invalid UTF-8", b'{"model": "servelab-main", "prompt": "\xff\xfe"}'),
                          ("a BOM before the object", '\ufeff{"model": "servelab-main"}'.encode()),
                          ("100 KB of nested arrays", b"[" * 50_000 + b"]" * 50_000),
                          ("nested objects as the prompt", ('{"model":"servelab-main","prompt":' + '{"a":' * 20_000
                                                            + "1" + "}" * 20_000 + "}").encode()),
                          ("a JSON array", b'[{"model": "servelab-main", "prompt": "hi"}]'),
                          ("a JSON string", b'"hi"'), ("null", b"null"), ("a number", b"42"),
                          ("trailing garbage", b'{"model": "servelab-main", "prompt": "hi"} x')]:
        post_case(res, c, g, name, content=content)
    post_case(res, c, g, "NaN temperature", content=b'{"model":"servelab-main","prompt":"hi","temperature":NaN}')
    post_case(res, c, g, "1e400 temperature", content=b'{"model":"servelab-main","prompt":"hi","temperature":1e400}')
    post_case(res, c, g, "Infinity max_tokens", content=b'{"model":"servelab-main","prompt":"hi","max_tokens":Infinity}')
    post_case(res, c, g, "duplicate keys (last wins)", content=b'{"model":"x","model":"servelab-main","prompt":"hi",'
                                                              b'"max_tokens":2}', expect=(200,))
    post_case(res, c, g, "2 MB body", content=b'{"model":"servelab-main","prompt":"' + b"a" * 2_000_000 + b'"}',
              expect=(413,))
    post_case(res, c, g, "text/plain content type", json_body=body(), headers={"content-type": "text/plain"},
              expect=(200,))
    post_case(res, c, g, "GET on a POST endpoint", method="GET", content=b"", expect=(405,))
    post_case(res, c, g, "unknown path", path="/v1/nothing", content=b"{}", expect=(404,))
    post_case(res, c, g, "legacy path /v1/engines", path="/v1/engines/x/completions", content=b"{}", expect=(404,))


def wrong_types(res: Results, c: httpx.Client) -> None:
    g = "types"
    cases = [("model missing", {"model": ...}), ("model an int", {"model": 3}), ("model unknown", {"model": "gpt-9"}),
             ("prompt missing", {"prompt": ...}), ("prompt a dict", {"prompt": {"a": 1}}), ("prompt empty", {"prompt": ""}),
             ("prompt null", {"prompt": None}), ("prompt mixed list", {"prompt": [1, "a"]}),
             ("prompt of bools", {"prompt": [True, False]}), ("prompt of floats", {"prompt": [1.5, 2.0]}),
             ("two prompts", {"prompt": ["a", "b"]}), ("max_tokens a string", {"max_tokens": "5"}),
             ("max_tokens 1.5", {"max_tokens": 1.5}), ("max_tokens true", {"max_tokens": True}),
             ("max_tokens 0", {"max_tokens": 0}), ("max_tokens -1", {"max_tokens": -1}),
             ("temperature a string", {"temperature": "hot"}), ("temperature -0.1", {"temperature": -0.1}),
             ("temperature 2.0001", {"temperature": 2.0001}), ("top_p 0", {"top_p": 0}), ("top_p 1.5", {"top_p": 1.5}),
             ("top_k -2", {"top_k": -2}), ("top_k 10^9", {"top_k": 10 ** 9}), ("stream 'yes'", {"stream": "yes"}),
             ("stream 1", {"stream": 1}), ("stop an int", {"stop": 5}), ("stop of ints", {"stop": [1, 2]}),
             ("stop empty string", {"stop": [""]}), ("five stops", {"stop": ["a", "b", "c", "d", "e"]}),
             ("n '2'", {"n": "2"}), ("n 0", {"n": 0}), ("n 17", {"n": 17}), ("logprobs -1", {"logprobs": -1}),
             ("logprobs 6", {"logprobs": 6}), ("seed -1", {"seed": -1}), ("seed 2^64", {"seed": 2 ** 64}),
             ("user an int", {"user": 5}), ("stream_options without stream", {"stream_options": {"include_usage": True}}),
             ("stream_options a list", {"stream": True, "stream_options": [1]}),
             ("presence_penalty 2.5 (past OpenAI's range)", {"presence_penalty": 2.5}), ("logit_bias set", {"logit_bias": {"1": 5}}),
             ("best_of 2", {"best_of": 2}), ("echo true", {"echo": True}),
             ("max_tokens and max_completion_tokens disagree", {"max_tokens": 3, "max_completion_tokens": 4}),
             ("temperature 1e-300 (the sampler's dry run)", {"temperature": 1e-300})]
    for name, fields in cases:
        expect = (404,) if name == "model unknown" else (400,)
        post_case(res, c, g, name, json_body=body(**fields), expect=expect)
    chat = "/v1/chat/completions"
    for name, msgs in [("messages a string", "hi"), ("messages empty", []), ("a message not an object", ["hi"]),
                       ("role robot", [{"role": "robot", "content": "hi"}]),
                       ("content an int", [{"role": "user", "content": 5}]),
                       ("content an image part", [{"role": "user", "content": [{"type": "image_url",
                                                                               "image_url": {"url": "x"}}]}])]:
        post_case(res, c, g, f"chat: {name}", path=chat, json_body={"model": NAME, "messages": msgs})
    post_case(res, c, g, "chat: top_logprobs without logprobs", path=chat,
              json_body={"model": NAME, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})
    post_case(res, c, g, "chat: top_logprobs 21", path=chat,
              json_body={"model": NAME, "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                         "top_logprobs": 21})


def limits(res: Results, c: httpx.Client, url: str) -> None:
    g = "limits"
    post_case(res, c, g, "950 KB prompt (refused by its length, untokenized)", json_body=body(prompt="word " * 190_000))
    post_case(res, c, g, "10,000-token prompt (token ids)", json_body=body(prompt=[17] * 10_000))
    post_case(res, c, g, "prompt token id -1", json_body=body(prompt=[1, -1]))
    post_case(res, c, g, "prompt token id 10^9", json_body=body(prompt=[1, 10 ** 9]))
    post_case(res, c, g, "max_tokens 10^9", json_body=body(max_tokens=10 ** 9))
    post_case(res, c, g, "n 16 x max_tokens 8", json_body=body(n=16, max_tokens=8, temperature=0.8, seed=1),
              expect=(200,))
    post_case(res, c, g, "100,000-character stop string", json_body=body(stop=["ab" * 50_000], max_tokens=16),
              expect=(200,))
    post_case(res, c, g, "stop string matching at once", json_body=body(stop=[" "], max_tokens=16), expect=(200,))
    post_case(res, c, g, "chat of 1,000 messages", path="/v1/chat/completions",
              json_body={"model": NAME, "max_tokens": 2,
                         "messages": [{"role": "user", "content": "hi"}] * 1_000})

    # a burst past the 429 limit: non-streamed one-token requests, all at once
    async def burst(k: int):
        lim = httpx.Limits(max_connections=k + 10, max_keepalive_connections=k + 10)
        async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT_S, limits=lim) as ac:
            async def one():
                try:
                    r = await ac.post("/v1/completions", json=body(max_tokens=1))
                    return r.status_code, (r.status_code == 200 or error_shape_ok(r.json())), \
                        r.headers.get("retry-after")
                except httpx.TimeoutException:
                    return "timeout", False, None
                except httpx.HTTPError as exc:
                    return f"transport {type(exc).__name__}", False, None
            return await asyncio.gather(*(one() for _ in range(k)))
    t0 = time.perf_counter()
    got = asyncio.run(burst(400))
    dt = time.perf_counter() - t0
    codes = [s for s, _, _ in got]
    ok = all(shape for _, shape, _ in got) and set(codes) <= {200, 429} and codes.count(200) >= 1
    ok = ok and all(ra == "1" for s, _, ra in got if s == 429)
    res.add(g, "burst of 400 past the 429 limit (320 in flight)", ok,
            f"{codes.count(200)}x200 {codes.count(429)}x429", f"others: {[s for s in codes if s not in (200, 429)][:5]}",
            dt, hung="timeout" in codes, lost=sum(1 for s in codes if isinstance(s, str)))


def long_prompts_while_streaming(res: Results, url: str, trials: int = 7) -> None:
    """A 950 KB prompt (refused by its length, untokenized), then five 39 KB prompts of random
    words at once (tokenized on the server's tokenizing thread, then refused: too many tokens),
    each sent while a 120-token stream runs: the stream's longest gap between events while the
    long prompts were answered, beside its gaps otherwise (median of ``trials`` runs)."""
    import random
    import statistics
    rng = random.Random(0)
    words = [" ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
                      for _ in range(6_000))[:39_000] for _ in range(5 * trials)]
    # encoded up front: this client's own JSON encoding must not delay the events it times
    b950 = json.dumps(body(prompt="word " * 190_000)).encode()
    b39 = [json.dumps(body(prompt=w)).encode() for w in words]
    hdrs = {"content-type": "application/json"}

    async def trial(bodies):
        async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT_S) as ac:
            times: list[float] = []

            async def watch():
                b = body(max_tokens=120, ignore_eos=True, stream=True)
                async with ac.stream("POST", "/v1/completions", json=b) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            times.append(time.perf_counter())
            w = asyncio.create_task(watch())
            while len(times) < 20:
                await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            rs = await asyncio.gather(*(ac.post("/v1/completions", content=b, headers=hdrs) for b in bodies))
            t1 = time.perf_counter()
            await w
        gaps = [(a, b - a) for a, b in zip(times, times[1:])]
        during = max((g for a, g in gaps if a + g >= t0 and a <= t1), default=0.0)
        outside = [g for a, g in gaps if not (a + g >= t0 and a <= t1)]
        ok = all(r.status_code == 400 and error_shape_ok(r.json()) for r in rs)
        return ok, t1 - t0, during, statistics.median(outside), max(outside)

    for label, make in [("a 950 KB prompt", lambda i: [b950]),
                        ("five 39 KB prompts at once", lambda i: b39[5 * i:5 * i + 5])]:
        rows = [asyncio.run(trial(make(i))) for i in range(trials)]
        med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
        res.add("limits", f"{label} while a stream runs ({trials} runs)", all(r[0] for r in rows), "400",
                f"answered in {med(1) * 1e3:.0f} ms; the stream's longest gap meanwhile {med(2) * 1e3:.0f} ms "
                f"(otherwise: median gap {med(3) * 1e3:.0f} ms, longest {med(4) * 1e3:.0f} ms; medians of the "
                f"runs)", med(1))


def unicode(res: Results, c: httpx.Client, url: str) -> None:
    g = "unicode"
    for name, prompt in [("emoji", "Translate 🙂🚀👩‍👩‍👧 into words:"), ("combining marks", "e\u0301\u0302\u0303 Z\u0335\u0336"),
                         ("right-to-left", "שלום עולם مرحبا"), ("NUL characters", "a\x00b\x00c"),
                         ("a lone surrogate", "bad \ud800 half"), ("CJK", "缓存的作用是什么？"),
                         ("special token text", "<|endoftext|><|user|>hi")]:
        post_case(res, c, g, f"prompt: {name}", json_body=body(prompt=prompt, max_tokens=6),
                  expect=(200, 400) if "surrogate" in name else (200,))
    post_case(res, c, g, "unicode stop string", json_body=body(prompt="🙂🙂🙂", stop=["🙂"], max_tokens=8),
              expect=(200,))
    post_case(res, c, g, "chat: a lone surrogate", path="/v1/chat/completions",
              json_body={"model": NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "x\udfff"}]},
              expect=(200, 400))

    async def streamed():
        async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT_S) as ac:
            return await asyncio.gather(*(stream_one(ac, body(prompt=p, max_tokens=24, ignore_eos=True, stream=True,
                                                              stop=["\u00e9", "🙂"], temperature=0.9, seed=i))
                                          for i, p in enumerate(["🙂 e\u0301", "é é é", "日本語のテキスト"])))
    t0 = time.perf_counter()
    outs = asyncio.run(streamed())
    ok = all(o["status"] == 200 and o["done"] and o["shape_ok"] and not o["hung"] for o in outs)
    res.add(g, "streams with unicode stop strings", ok, [o["status"] for o in outs],
            f"texts {[o['text'][:12] for o in outs]}", time.perf_counter() - t0,
            lost=sum(not o["done"] for o in outs))


def disconnects(res: Results, url: str, host: str, port: int) -> None:
    g = "disconnects"

    async def drops():
        async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT_S,
                                     limits=httpx.Limits(max_connections=60)) as ac:
            outs = await asyncio.gather(*(stream_one(ac, body(prompt=f"story {k}", max_tokens=200, ignore_eos=True,
                                                              stream=True, temperature=0.7, seed=k), stop_after=k % 7 + 1)
                                          for k in range(30)))
            # non-streamed calls cancelled mid-way
            tasks = [asyncio.create_task(ac.post("/v1/completions", json=body(max_tokens=200, ignore_eos=True)))
                     for _ in range(10)]
            await asyncio.sleep(0.3)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # n = 3 streams dropped
            outs += await asyncio.gather(*(stream_one(ac, body(n=3, max_tokens=100, ignore_eos=True, stream=True,
                                                               temperature=0.8, seed=k), stop_after=2)
                                           for k in range(5)))
            return outs
    t0 = time.perf_counter()
    outs = asyncio.run(drops())
    res.add(g, "30 streams dropped after 1-7 events, 10 calls cancelled, 5 n=3 streams dropped",
            all(o["status"] == 200 and not o["hung"] for o in outs), "dropped",
            "", time.perf_counter() - t0, hung=any(o["hung"] for o in outs))

    # a body cut off mid-way, and a client that sends headers only and leaves
    for name, raw in [("body cut off", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                       b"Content-Length: 1000\r\n\r\n{\"model\": \"servelab-main\", \"pro"),
                      ("headers only", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n"),
                      ("half a request line", b"POST /v1/compl")]:
        t0 = time.perf_counter()
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(raw)
        time.sleep(0.2)
        s.close()
        res.add(g, name, True, "closed", "", time.perf_counter() - t0)
    h = wait_idle(url)
    idle = bool(h) and h["in_flight"] == 0 and h["kv_blocks_used"] == 0
    res.add(g, "server idle afterwards: nothing in flight, every KV block free", idle,
            "idle" if idle else "busy", f"in_flight {h and h['in_flight']}, kv_blocks_used {h and h['kv_blocks_used']}")


def concurrent(res: Results, url: str, group: str = "concurrency") -> None:
    async def go():
        lim = httpx.Limits(max_connections=STREAMS + 10, max_keepalive_connections=STREAMS + 10)
        async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT_S, limits=lim) as ac:
            return await asyncio.gather(*(stream_one(ac, body(prompt=f"item {k}:", max_tokens=8 + k % 24,
                                                              ignore_eos=True, stream=True,
                                                              stream_options={"include_usage": True}))
                                          for k in range(STREAMS)))
    t0 = time.perf_counter()
    outs = asyncio.run(go())
    ids = {o["id"] for o in outs}
    ok = all(o["status"] == 200 and o["done"] and o["finish"] == "length" and o["shape_ok"] for o in outs)
    res.add(group, f"{STREAMS} concurrent streams complete once each", ok and len(ids) == STREAMS,
            f"{sum(o['done'] for o in outs)}/{STREAMS} [DONE]", f"{len(ids)} distinct ids",
            time.perf_counter() - t0, hung=any(o["hung"] for o in outs), lost=sum(not o["done"] for o in outs))


def log_clean(res: Results, group: str, server, label: str) -> None:
    """The server's log (its core's too) holds no stack trace and no 'unexpected error'."""
    log = server.log()
    bad = [line for line in log.splitlines() if "Traceback" in line or "unexpected error" in line]
    res.add(group, f"{label}: no stack trace in the server log", not bad, f"{len(log.splitlines())} log lines",
            bad[0][:150] if bad else "")


# ---------------------------------------------------------------- signals under load
def _all_started(n: int):
    """``(event, on_first)``: call ``on_first`` at each stream's first event; the event is set
    once all ``n`` streams have had theirs."""
    started = asyncio.Event()
    seen = [0]

    def on_first():
        seen[0] += 1
        if seen[0] == n:
            started.set()
    return started, on_first


async def _streams_then(url: str, action, max_tokens) -> tuple[list, list]:
    """Start STREAMS streams, run ``action`` once every stream has its first event, then
    try new requests while they end; return (stream results, new-request statuses)."""
    lim = httpx.Limits(max_connections=STREAMS + 20, max_keepalive_connections=STREAMS + 20)
    async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT_S, limits=lim) as ac:
        started, first = _all_started(STREAMS)

        async def one(k):
            b = body(prompt=f"item {k}:", max_tokens=max_tokens(k), ignore_eos=True, stream=True)
            return await stream_one(ac, b, on_first=first)

        tasks = [asyncio.create_task(one(k)) for k in range(STREAMS)]
        await asyncio.wait_for(started.wait(), CALL_TIMEOUT_S)
        action()
        news = []
        for _ in range(3):
            await asyncio.sleep(0.3)
            try:
                r = await ac.post("/v1/completions", json=body(max_tokens=1))
                news.append((r.status_code, r.status_code == 200 or error_shape_ok(r.json()),
                             (r.json().get("error") or {}).get("code") if r.status_code != 200 else None))
            except httpx.HTTPError as exc:
                news.append((f"refused ({type(exc).__name__})", True, None))
        outs = await asyncio.gather(*tasks)
        return outs, news


def signals(res: Results, args) -> None:
    from servelab.server import launch

    def fresh(extra=()):
        return launch(MODEL_DIR, args=["--max-num-seqs", "64", *extra], timeout_s=180)

    # SIGTERM to the engine core: ignored (the API process decides when the core stops)
    g = "signals"
    server = fresh()
    try:
        core_pid = health(server.url)["engine_pid"]
        t0 = time.perf_counter()
        outs, news = asyncio.run(_streams_then(server.url, lambda: os.kill(core_pid, signal.SIGTERM),
                                               lambda k: 24 + k % 16))
        ok = all(o["status"] == 200 and o["done"] and o["finish"] == "length" for o in outs)
        ok = ok and all(s == 200 for s, _, _ in news) and health(server.url)["status"] == "ok"
        res.add(g, f"SIGTERM to the engine core under {STREAMS} streams: ignored, all finish", ok,
                f"{sum(o['done'] for o in outs)}/{STREAMS} [DONE], {sum(o['finish'] == 'length' for o in outs)} length",
                f"new requests {[s for s, _, _ in news]}", time.perf_counter() - t0,
                hung=any(o["hung"] for o in outs), lost=sum(not o["done"] for o in outs))
    finally:
        server.stop()
    log_clean(res, g, server, "SIGTERM to the core")

    # SIGKILL of the engine core: every stream ends (error event + [DONE]); the server exits 1
    server = fresh()
    try:
        core_pid = health(server.url)["engine_pid"]
        t0 = time.perf_counter()
        outs, news = asyncio.run(_streams_then(server.url, lambda: os.kill(core_pid, signal.SIGKILL),
                                               lambda k: 400))
        code = server.proc.wait(60)
        errors = sorted({str(o["error"]) for o in outs})
        ended = [o for o in outs if o["done"] or o["error"] == "http"]
        ok = (all(o["done"] and o["error"] == "engine_error" and o["shape_ok"] for o in outs) and code == 1
              and all(shape for _, shape, _ in news))
        log = server.log()
        ok = ok and "CRITICAL servelab.server: the engine core" in log
        res.add(g, f"SIGKILL of the engine core under {STREAMS} streams", ok,
                f"{sum(o['done'] for o in outs)}/{STREAMS} [DONE], exit {code}",
                f"stream errors {errors}; new requests {[(s, c) for s, _, c in news]}; CRITICAL logged: "
                f"{'CRITICAL servelab.server: the engine core' in log}", time.perf_counter() - t0,
                hung=any(o["hung"] for o in outs), lost=STREAMS - len(ended))
        # the server reads the core's exit status (so it is reaped, no zombie) and logs it
        reaped = "killed by SIGKILL" in log
        res.add(g, "the dead engine core is reaped and its end logged", reaped,
                "reaped" if reaped else "not reaped",
                next((line[:160] for line in log.splitlines() if "CRITICAL" in line), "no CRITICAL line"))
    finally:
        server.stop()
    log_clean(res, g, server, "SIGKILL of the core")

    # SIGTERM to the server: drain (503 for new requests), short streams finish, long ones end cleanly
    server = fresh(["--shutdown-grace", "3"])
    try:
        t0 = time.perf_counter()
        outs, news = asyncio.run(_streams_then(server.url, lambda: server.proc.send_signal(signal.SIGTERM),
                                               lambda k: 16 if k % 2 else 1_000))
        code = server.proc.wait(60)
        short = outs[1::2]
        long_ = outs[0::2]
        ok = all(o["done"] and o["finish"] == "length" for o in short)
        ok = ok and all(o["done"] and o["error"] == "shutting_down" and o["shape_ok"] for o in long_)
        ok = ok and code == 0 and all(shape for _, shape, _ in news)
        ok = ok and all(s == 503 and c == "shutting_down" or str(s).startswith("refused") for s, _, c in news)
        res.add(g, f"SIGTERM to the server under {STREAMS} streams (grace 3 s)", ok,
                f"{sum(o['done'] for o in outs)}/{STREAMS} [DONE], exit {code}",
                f"short: {sum(o['finish'] == 'length' for o in short)}/{len(short)} length; long: "
                f"{sum(o['error'] == 'shutting_down' for o in long_)}/{len(long_)} shutting_down; "
                f"new requests {[(s, c) for s, _, c in news]}", time.perf_counter() - t0,
                hung=any(o["hung"] for o in outs), lost=sum(not o["done"] for o in outs))
    finally:
        server.stop()
    log_clean(res, g, server, "SIGTERM to the server")


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return kids


def tensor_parallel_worker_death(res: Results, streams: int = 8) -> None:
    """``--tensor-parallel-size 2``: SIGKILL the rank-1 worker under ``streams`` streams. Every
    stream must end with an error event naming the rank and ``[DONE]``; the server exits 1
    (a CRITICAL line says why); no process of the family is left."""
    from servelab.server import launch
    g = "signals"
    server = launch(MODEL_DIR, args=["--tensor-parallel-size", "2", "--kv-blocks", "64",
                                     "--max-model-len", "256"], timeout_s=180)
    try:
        core_pid = health(server.url)["engine_pid"]
        # the worker is a child of the core's fork server (a grandchild of the core)
        workers = [w for c in _children(core_pid) for w in _children(c)]
        family = {core_pid, *_children(core_pid), *workers}

        def kill():
            os.kill(workers[-1], signal.SIGKILL)

        async def go():
            async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT_S) as ac:
                started, first = _all_started(streams)
                tasks = [asyncio.create_task(stream_one(ac, body(prompt=f"item {k}:", max_tokens=100,
                                                                 ignore_eos=True, stream=True), on_first=first))
                         for k in range(streams)]
                await asyncio.wait_for(started.wait(), CALL_TIMEOUT_S)
                kill()
                return await asyncio.gather(*tasks)
        t0 = time.perf_counter()
        outs = asyncio.run(go()) if workers else []
        code = server.proc.wait(60)
        log = server.log()
        def alive(p):
            try:
                with open(f"/proc/{p}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False
        deadline = time.monotonic() + 10  # the family's last members may take a moment
        while any(alive(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in family if alive(p)]
        ok = (bool(workers) and all(o["done"] and o["error"] == "engine_error" and o["shape_ok"] for o in outs)
              and code == 1 and "EngineDeadError" in log and not left)
        res.add(g, f"SIGKILL of a tensor-parallel worker under {streams} streams", ok,
                f"{sum(o['done'] for o in outs)}/{streams} [DONE], exit {code}",
                f"stream errors {sorted({str(o['error']) for o in outs})}; processes left {left}; "
                + next((line[:200] for line in log.splitlines() if "CRITICAL" in line), "no CRITICAL line"),
                time.perf_counter() - t0, hung=any(o["hung"] for o in outs),
                lost=sum(not o["done"] for o in outs))
    finally:
        server.stop()
    log_clean(res, g, server, "SIGKILL of a tensor-parallel worker")


# ---------------------------------------------------------------- report
def write(res: Results, out: Path, meta: dict) -> None:
    rows = res.rows
    out.mkdir(parents=True, exist_ok=True)
    (out / "server_adversarial.json").write_text(json.dumps({"meta": meta, "cases": rows}, indent=1) + "\n")
    n_ok = sum(r["ok"] for r in rows)
    hung = sum(r["hung"] for r in rows)
    lost = sum(r["lost"] for r in rows)
    bad = sum(r["bad_500"] for r in rows)
    lines = ["# Adversarial run against the server", "",
             f"`{meta['command']}` on {meta['date']} (commit `{meta['commit']}`, {meta['machine']}).", "",
             f"**{n_ok} of {len(rows)} cases pass.** 500s outside OpenAI's shape: {bad}. Hung clients "
             f"(a call past its {CALL_TIMEOUT_S:g} s timeout): {hung}. Lost requests (no answer, or a stream "
             f"without `[DONE]`): {lost}.", "",
             "The server is `python -m servelab.server` with the committed `servelab-main` (engine core in its "
             "own process, 64 seats, 256 queued). A case passes when its status is the expected one and every "
             "error answer, and every error event inside a stream, is OpenAI's error object. "
             "What each group throws is in the script's docstring "
             "([benchmarks/adversarial_server.py](../adversarial_server.py)).", ""]
    for group in dict.fromkeys(r["group"] for r in rows):
        g_rows = [r for r in rows if r["group"] == group]
        lines += [f"## {group} ({sum(r['ok'] for r in g_rows)}/{len(g_rows)})", "",
                  "| case | pass | status | seconds | answer |", "|---|---|---|---:|---|"]
        for r in g_rows:
            note = str(r["note"]).replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {r['name']} | {'yes' if r['ok'] else '**no**'} | {r['status']} | {r['seconds']:.2f} "
                         f"| {note} |")
        lines.append("")
    (out / "server_adversarial.md").write_text("\n".join(lines))
    print(f"\n{n_ok}/{len(rows)} pass; bad 500s {bad}; hung {hung}; lost {lost} -> {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--skip-signals", action="store_true", help="only the input cases (one server)")
    args = p.parse_args(argv)
    import platform
    import subprocess
    from servelab.server import launch
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    meta = {"command": "python benchmarks/adversarial_server.py", "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"}
    res = Results()
    server = launch(MODEL_DIR, args=["--max-num-seqs", "64"], timeout_s=180)
    try:
        host, port = server.host, server.port
        with httpx.Client(base_url=server.url, timeout=CALL_TIMEOUT_S) as c:
            print("malformed bodies"), malformed(res, c)
            print("wrong types"), wrong_types(res, c)
            print("limits"), limits(res, c, server.url)
            long_prompts_while_streaming(res, server.url)
            print("unicode"), unicode(res, c, server.url)
        print("disconnects"), disconnects(res, server.url, host, port)
        print("concurrency"), concurrent(res, server.url)
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        res.add("metrics", "/metrics answers after all of it", "servelab:request_aborted_total" in metrics, 200,
                " ".join(line for line in metrics.splitlines()
                         if line.startswith(("servelab:request_", "servelab:num_requests"))))
        alive = server.proc.poll() is None and (health(server.url) or {}).get("status") == "ok"
        res.add("metrics", "the server is still up and healthy", alive, "ok" if alive else "down")
    finally:
        code = server.stop()
    res.add("metrics", "SIGTERM when idle: exit 0", code == 0, f"exit {code}")
    log_clean(res, "metrics", server, "all the input cases")
    if not args.skip_signals:
        print("signals under load"), signals(res, args)
        print("a tensor-parallel worker's death"), tensor_parallel_worker_death(res)
    write(res, Path(args.out), meta)
    return 0 if all(r["ok"] for r in res.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
