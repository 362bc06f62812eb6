"""``n > 1`` through the server: one response with ``choices[i].index``, streams whose
chunks are tagged by index, usage that counts the prompt once, the prompt's full
blocks shared through the prefix cache, every block back. Both ways of running the
engine: a thread of the API process, and the engine-core process."""
import json
import time

import httpx
import pytest

from servelab.engine import LLM
from servelab.sampling import SamplingParams
from servelab.server import ServerSettings, ServerThread, build_engine, create_app

from server_builders import FAIL_SEED, fail_steps_of_seed, tiny_model
from test_server import MODEL, body, read_stream

TIMEOUT = httpx.Timeout(30.0)
PROMPT = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(6))  # > 2 blocks of 16


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request):
    if request.param == "thread":
        from servelab.bpe import load_course_tokenizer
        engine = fail_steps_of_seed(build_engine(tiny_model(), load_course_tokenizer(), num_kv_blocks=256))
    else:
        from servelab.server.client import EngineCoreClient
        engine = EngineCoreClient("tiny", builder="server_builders:failing_tiny_engine", num_kv_blocks=256,
                                  startup_timeout_s=120)
    with ServerThread(create_app(engine, ServerSettings(model_name=MODEL))) as srv:
        yield srv, engine, request.param


def health(srv):
    return httpx.get(srv.url + "/health", timeout=TIMEOUT).json()


def wait_idle(srv, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        h = health(srv)
        if h["in_flight"] == 0 and h["kv_blocks_used"] == 0 and h["running"] == h["waiting"] == 0:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(scope="module")
def reference():
    return LLM(tiny_model(), num_kv_blocks=256).generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=6))[0]


def cached_blocks(srv, engine, mode):
    if mode == "thread":
        return engine.scheduler.kv.prefix_cache.hits
    return health(srv)["prefix_cache_hit_blocks"]


def test_greedy_n2_is_one_response_with_two_identical_choices(server, reference):
    srv, engine, mode = server
    assert wait_idle(srv)
    hits0 = cached_blocks(srv, engine, mode)
    r = httpx.post(srv.url + "/v1/completions", json=body(prompt=PROMPT, max_tokens=6, n=2), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert out["choices"][0]["text"] == out["choices"][1]["text"] == reference.text
    u = out["usage"]
    assert u["prompt_tokens"] == len(reference.prompt_token_ids)  # the prompt counted once
    assert u["completion_tokens"] == 2 * len(reference.token_ids)
    full_blocks = (len(reference.prompt_token_ids) - 1) // 16
    assert full_blocks >= 2 and cached_blocks(srv, engine, mode) - hits0 >= full_blocks  # shared
    assert wait_idle(srv)


def test_seeded_n3_gives_distinct_choices_and_repeats(server):
    srv, _, _ = server
    b = body(prompt="Once upon a time", max_tokens=12, n=3, temperature=1.0, seed=11, ignore_eos=True)
    one = httpx.post(srv.url + "/v1/completions", json=b, timeout=TIMEOUT).json()
    two = httpx.post(srv.url + "/v1/completions", json=b, timeout=TIMEOUT).json()
    texts = [c["text"] for c in one["choices"]]
    assert len(set(texts)) == 3 and texts == [c["text"] for c in two["choices"]]
    assert one["usage"]["completion_tokens"] == 36
    assert wait_idle(srv)


def test_streamed_n2_interleaves_chunks_tagged_by_index(server, reference):
    srv, _, _ = server
    b = body(prompt=PROMPT, max_tokens=6, n=2, stream=True, stream_options={"include_usage": True})
    with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c, c.stream("POST", "/v1/completions", json=b) as r:
        events = read_stream(r)
    assert events[-1] == "[DONE]"
    texts, finishes = {0: "", 1: ""}, {0: [], 1: []}
    for ev in events[:-2]:
        for ch in ev["choices"]:
            texts[ch["index"]] += ch["text"]
            if ch["finish_reason"]:
                finishes[ch["index"]].append(ch["finish_reason"])
    assert texts[0] == texts[1] == reference.text
    assert finishes == {0: ["length"], 1: ["length"]}  # each choice ends exactly once
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == 2 * len(reference.token_ids)
    assert wait_idle(srv)


def test_chat_n2_and_a_dropped_n_stream_frees_every_block(server):
    srv, _, _ = server
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "temperature": 0, "n": 2}
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"]
    assert [c["index"] for c in ch] == [0, 1] and ch[0]["message"] == ch[1]["message"]
    b = body(prompt=PROMPT, max_tokens=150, n=3, ignore_eos=True, stream=True)
    with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c, c.stream("POST", "/v1/completions", json=b) as s:
        lines = s.iter_lines()
        seen = [json.loads(line[6:]) for line in (next(lines) for _ in range(12)) if line.startswith("data: {")]
        assert seen and {ch["index"] for ev in seen for ch in ev["choices"]} <= {0, 1, 2}
    assert wait_idle(srv)


def test_a_failed_engine_step_ends_every_n_request_in_it(server):
    """The step's requests are failed by the parent's id (the children are "<id>#i"):
    a stream gets an error event and [DONE], a plain call a 500, and nothing stays in flight."""
    srv, _, _ = server
    assert wait_idle(srv)
    b = body(prompt="Once upon a time", max_tokens=40, n=2, temperature=1.0, seed=FAIL_SEED, ignore_eos=True)
    with httpx.Client(base_url=srv.url, timeout=httpx.Timeout(20.0)) as c:
        with c.stream("POST", "/v1/completions", json={**b, "stream": True}) as s:
            events = read_stream(s)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_error", events[-2:]
        r = c.post("/v1/completions", json=b)
        assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
    assert wait_idle(srv)
