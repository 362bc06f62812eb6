"""A load generator for any OpenAI-compatible server: ``python -m servelab.loadgen``.

It sends requests at a chosen *rate* (Poisson arrivals, or gamma arrivals for
burstier traffic) or at a fixed *concurrency* (each client sends its next
request when the last one finishes), streams every reply, and times each
token's arrival on the client:

* **TTFT** - time to first token: request sent -> first content chunk;
* **TPOT** - time per output token after the first: ``(E2E - TTFT) / (n - 1)``;
* **ITL** - inter-token latency: every gap between consecutive chunks;
* **E2E** - request sent -> last chunk;
* **throughput** - requests and tokens per second over the whole run;
* **goodput** - requests per second that met every SLO you set (TTFT, TPOT, E2E).

It speaks plain HTTP (server-sent events), so it measures vLLM, SGLang or a
hosted API as readily as ``servelab.server``. Prompt and output lengths come
from distributions (``fixed:128``, ``uniform:16:256``, ``lognormal:128:0.8``,
``exponential:96``) or are replayed from a JSONL trace, both from
:mod:`servelab.workload` (the simulator's format: a run can be recorded with
``--record-trace`` and replayed by ``python -m servelab.sim check``). Python and numpy (its own
lean HTTP/1.1 streaming client, or httpx); no torch.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from servelab import workload as _workload
from servelab.workload import PERCENTILES, Trace, arrival_times, parse_length, percentiles, trace_prompts

__all__ = ["SSEDecoder", "RawHTTPClient", "RequestSpec", "RequestRecord", "parse_length_dist", "synthetic_requests",
           "load_trace", "trace_of", "arrival_times", "token_latencies", "summarize", "percentiles", "run_load",
           "plot_results", "main", "PERCENTILES"]


# ------------------------------------------------------------ server-sent events
class SSEDecoder:
    """Incremental server-sent-events parser.

    Feed it the bytes (or text) as they arrive, in pieces of any size; it
    returns the complete events' ``data`` payloads. A line may be split across
    reads, so a partial line waits in the buffer for its end. ``data: [DONE]``
    comes back as the string ``"[DONE]"``; comments (``:``) and other fields are
    skipped; several ``data:`` lines in one event are joined with newlines.
    """

    def __init__(self):
        self._buf = ""
        self._data: list[str] = []
        self._bytes = b""
        self._raw = b""  # the fast path's partial line (bytes)

    def feed(self, chunk: bytes | str) -> list[str]:
        if isinstance(chunk, bytes) and not self._buf and not self._bytes and b"\r" not in chunk:
            return self._feed_lf(chunk)
        if self._raw:  # leaving the fast path: its partial line goes first
            chunk = self._raw + (chunk if isinstance(chunk, bytes) else chunk.encode())
            self._raw = b""
        if isinstance(chunk, bytes):
            raw = self._bytes + chunk
            try:
                text = raw.decode("utf-8")
                self._bytes = b""
            except UnicodeDecodeError as exc:  # a character split across reads
                text = raw[:exc.start].decode("utf-8")
                self._bytes = raw[exc.start:]
        else:
            text = chunk
        self._buf += text
        events = []
        while True:
            cut = min((i for i in (self._buf.find("\n"), self._buf.find("\r")) if i != -1), default=-1)
            if cut == -1:
                break
            line = self._buf[:cut]
            rest = self._buf[cut + 1:]
            if self._buf[cut] == "\r" and rest.startswith("\n"):
                rest = rest[1:]
            elif self._buf[cut] == "\r" and rest == "":
                break  # wait: the "\n" of a "\r\n" may be in the next read
            self._buf = rest
            if line == "":
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith(":"):
                continue
            else:
                name, _, value = line.partition(":")
                if value.startswith(" "):
                    value = value[1:]
                if name == "data":
                    self._data.append(value)
        return events

    def _feed_lf(self, chunk: bytes) -> list[str]:
        """The common case, ``\n`` line ends: split bytes on newlines and decode only
        complete ``data`` values (a UTF-8 character can never straddle a newline)."""
        lines = (self._raw + chunk).split(b"\n")
        self._raw = lines.pop()
        events, data = [], self._data
        for line in lines:
            if not line:
                if data:
                    events.append("\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                data.append(value.decode("utf-8"))
            # comments (":...") and other fields are skipped
        return events


# ------------------------------------------------------------------- workload
@dataclass
class RequestSpec:
    """One request to send: a prompt (text or token ids), how many tokens to ask for, when."""

    prompt: str | list[int]
    max_tokens: int
    prompt_len: int | None = None
    arrival_s: float | None = None  # from a trace: seconds after the start
    prefix_group: int = -1  # from a trace: the request's shared-prefix group (-1: none)
    prefix_tokens: int = 0


def parse_length_dist(spec: str | int):
    """``"fixed:N"`` / ``N``, ``"uniform:A:B"``, ``"lognormal:MEDIAN:SIGMA"``,
    ``"exponential:MEAN"`` -> a function ``rng -> length >= 1`` (``rng``: a
    :class:`random.Random`): the :mod:`servelab.workload` distribution's ``draw``."""
    return parse_length(spec).draw


def synthetic_requests(n: int, input_len="fixed:32", output_len="fixed:32", *, vocab_size: int = 4000,
                       seed: int = 0, max_input: int | None = None) -> list[RequestSpec]:
    """``n`` requests whose prompts are random token ids of the drawn lengths (OpenAI's
    completions API takes token-id prompts, so no tokenizer is needed)."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    rng = random.Random(seed)
    pin, pout = parse_length_dist(input_len), parse_length_dist(output_len)
    out = []
    for _ in range(n):
        p = pin(rng)
        if max_input is not None:
            p = min(p, max_input)
        out.append(RequestSpec([rng.randrange(vocab_size) for _ in range(p)], pout(rng), prompt_len=p))
    return out


def load_trace(path: str | Path, *, vocab_size: int = 4000, seed: int = 0) -> list[RequestSpec]:
    """Requests from a JSONL trace in :mod:`servelab.workload`'s format (the simulator's:
    ``arrival_s``, ``prompt_tokens``, ``output_tokens``, optional ``prefix_group`` /
    ``prefix_tokens`` and ``prompt``; the older ``timestamp`` / ``prompt_len`` /
    ``max_tokens`` names too). Prompts the trace does not give are random token ids, the
    members of a prefix group sharing their leading ``prefix_tokens`` ids, as the
    simulator's engine check makes them. An untimed trace's requests have no send time."""
    trace = _workload.load_trace(path)
    ids = trace_prompts(trace, vocab_size, seed)
    given = trace.prompts or [None] * len(trace)
    out = []
    for i in range(len(trace)):
        prompt = given[i] if given[i] is not None else ids[i]
        out.append(RequestSpec(prompt, int(trace.output_tokens[i]), int(trace.prompt_tokens[i]),
                               float(trace.arrival_s[i]) if trace.timed else None,
                               int(trace.prefix_group[i]), int(trace.prefix_tokens[i])))
    return out


def trace_of(summary: dict, specs: Sequence[RequestSpec] | None = None) -> Trace:
    """The trace a run actually sent, from :func:`run_load`'s summary: each request's send
    time (``arrival_s``), prompt tokens, output tokens received and, given the ``specs``
    it sent, their prefix groups and token-id prompts. Save it with
    :func:`servelab.workload.save_trace` and ``python -m servelab.sim check --trace`` replays
    it in the engine and the simulator (``--record-trace`` on the command line)."""
    rows = [r for r in summary["requests"] if r.get("error") is None and r.get("prompt_len")]
    if not rows:
        raise ValueError("no completed request with a known prompt length to record")
    by = {r["index"]: r for r in rows}
    keep = sorted(by)
    group = prefix = prompts = None
    if specs is not None:
        group = [specs[i].prefix_group for i in keep]
        prefix = [specs[i].prefix_tokens for i in keep]
        prompts = [specs[i].prompt if isinstance(specs[i].prompt, list) else None for i in keep]
    return Trace([by[i]["sent"] for i in keep], [by[i]["prompt_len"] for i in keep],
                 [max(by[i]["output_tokens"], 1) for i in keep], group, prefix, prompts)


# -------------------------------------------------------------------- metrics
@dataclass
class RequestRecord:
    """What the client saw of one request (``time.perf_counter`` seconds)."""

    index: int
    sent: float
    prompt_len: int | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each content chunk
    done: float | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    status: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.done is not None and bool(self.chunk_times)


def token_latencies(sent: float, token_times: Sequence[float]) -> dict:
    """TTFT, TPOT, ITLs and E2E from a request's send time and its tokens' arrival times.

    TPOT leaves the first token out (that wait is TTFT's): ``(last - first) / (n - 1)``;
    with one token there is no TPOT (``None``).
    """
    if not token_times:
        raise ValueError("no tokens arrived: TTFT, TPOT and ITL are undefined")
    times = list(token_times)
    if any(b < a for a, b in zip(times, times[1:])) or times[0] < sent:
        raise ValueError("token times must be sorted and not before the send time")
    ttft = times[0] - sent
    n = len(times)
    tpot = (times[-1] - times[0]) / (n - 1) if n > 1 else None
    return {"ttft": ttft, "tpot": tpot, "itl": [b - a for a, b in zip(times, times[1:])],
            "e2e": times[-1] - sent}


def summarize(records: Sequence[RequestRecord], duration_s: float, *, slo_ttft_s: float | None = None,
              slo_tpot_s: float | None = None, slo_e2e_s: float | None = None) -> dict:
    """Percentiles of TTFT/TPOT/ITL/E2E (seconds), throughput and goodput of a run."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    ok = [r for r in records if r.ok]
    lat = [token_latencies(r.sent, r.chunk_times) for r in ok]
    ttft = [x["ttft"] for x in lat]
    e2e = [r.done - r.sent for r in ok]
    tpot = [((r.chunk_times[-1] - r.chunk_times[0]) / (r.output_tokens - 1)) if r.output_tokens > 1 else None
            for r in ok]
    itl = [g for x in lat for g in x["itl"]]
    good = 0
    for r, t, tp, e in zip(ok, ttft, tpot, e2e):
        if slo_ttft_s is not None and t > slo_ttft_s:
            continue
        if slo_tpot_s is not None and tp is not None and tp > slo_tpot_s:
            continue
        if slo_e2e_s is not None and e > slo_e2e_s:
            continue
        good += 1
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len or 0 for r in ok)
    return {
        "num_requests": len(records), "completed": len(ok), "failed": len(records) - len(ok),
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (out_tokens + in_tokens) / duration_s,
        "output_tokens": out_tokens, "input_tokens": in_tokens,
        "ttft_s": percentiles(ttft), "tpot_s": percentiles(tpot), "itl_s": percentiles(itl),
        "e2e_s": percentiles(e2e),
        "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s, "e2e_s": slo_e2e_s},
        "goodput": good / duration_s, "good_requests": good,
    }


# ---------------------------------------------------------------- the client
class _RawResponse:
    """A streamed HTTP/1.1 response read off an asyncio stream (chunked or sized body)."""

    def __init__(self, reader, status: int, headers: dict):
        self.reader, self.status_code, self.headers = reader, status, headers
        self.reusable = headers.get("connection", "").lower() != "close"
        self.complete = False  # the whole body was read: the connection may serve another request

    async def aiter_raw(self):
        r = self.reader
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size = int((await r.readline()).split(b";", 1)[0], 16)
                if size == 0:
                    while (await r.readline()) not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    self.complete = True
                    return
                data = await r.readexactly(size + 2)
                yield data[:-2]
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 1 << 16))
                if not data:
                    raise ConnectionError("the server closed the connection mid-body")
                left -= len(data)
                if left <= 0:
                    self.complete = True
                yield data
            self.complete = True
        else:  # the body runs to the end of the connection
            self.reusable = False
            while data := await r.read(1 << 16):
                yield data

    async def aread(self) -> bytes:
        return b"".join([part async for part in self.aiter_raw()])


class RawHTTPClient:
    """A minimal HTTP/1.1 client on asyncio streams, for streaming POSTs.

    A load generator competes with the server for the same CPU, so what it
    spends per streamed token matters: this client parses the status line,
    the headers and chunked framing itself (about a tenth of a general client's
    work per chunk, see ``benchmarks/results/server.md``), and keeps idle
    connections for reuse. It speaks plain HTTP/1.1 (``http://`` or
    ``https://``) to any server; :func:`run_load` takes ``client="httpx"`` for
    the general client instead.
    """

    def __init__(self, base_url: str, timeout_s: float = 600.0):
        from urllib.parse import urlsplit
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.host, self.tls = u.hostname or "127.0.0.1", u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        self.timeout_s = timeout_s
        self._idle: list = []

    async def _connect(self, fresh: bool = False):
        """``(reader, writer, reused)``: an idle kept-alive connection if one is open (and
        ``fresh`` is false), else a new one."""
        while self._idle and not fresh:
            reader, writer = self._idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=True if self.tls else None,
                                                       limit=1 << 20)
        return reader, writer, False

    def stream(self, method: str, path: str, json=None) -> "_RawStream":
        """``async with client.stream("POST", "/v1/completions", json=body) as r``:
        the same call as ``httpx.AsyncClient(base_url=...).stream``, so either client serves."""
        return _RawStream(self, method, path, json)

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class _RawStream:
    def __init__(self, client: RawHTTPClient, method: str, path: str, json_body):
        self.client, self.method, self.path, self.body = client, method, path, json_body
        self.conn = None
        self.response = None

    async def __aenter__(self) -> _RawResponse:
        c = self.client
        payload = json.dumps(self.body, separators=(",", ":")).encode()
        head = (f"{self.method} {c.prefix}{self.path} HTTP/1.1\r\nHost: {c.host}:{c.port}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        fresh = False
        while True:
            reader, writer, reused = await c._connect(fresh)
            self.conn = reader, writer
            try:
                writer.write(head + payload)
                status_line = await asyncio.wait_for(reader.readline(), c.timeout_s)
                if not status_line:
                    raise ConnectionError("the server closed the connection")
                break
            except (ConnectionError, OSError):
                writer.close()
                # Only a kept-alive connection that the server had closed while it sat idle is
                # retried (once, on a new connection): nothing came back, and the request most
                # likely never reached it. A failure on a new connection is final: the server
                # may have received the POST, and sending it again could serve it twice.
                if not reused:
                    raise
                fresh = True
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ConnectionError(f"not an HTTP response: {status_line[:80]!r}")
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        self.response = _RawResponse(reader, int(parts[1]), headers)
        return self.response

    async def __aexit__(self, exc_type, exc, tb):
        reader, writer = self.conn
        r = self.response
        if exc_type is None and r is not None and r.reusable and r.complete and not reader.at_eof():
            self.client._idle.append((reader, writer))
        else:
            writer.close()
        return False


async def _one(client, path: str, model: str, spec: RequestSpec, index: int, *, chat: bool,
               ignore_eos: bool, temperature: float, extra: dict | None) -> RequestRecord:
    """Send one streamed request to ``path``; ``client`` is a :class:`RawHTTPClient` or an
    ``httpx.AsyncClient`` with a ``base_url`` (both take ``stream(method, path, json=...)``)."""
    if chat:
        if not isinstance(spec.prompt, str):
            raise ValueError("the chat endpoint needs text prompts (use completions for token ids)")
        body = {"model": model, "messages": [{"role": "user", "content": spec.prompt}]}
    else:
        body = {"model": model, "prompt": spec.prompt}
    body.update(max_tokens=spec.max_tokens, temperature=temperature, stream=True,
                stream_options={"include_usage": True})
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra or {})
    rec = RequestRecord(index, time.perf_counter(), prompt_len=spec.prompt_len)
    dec = SSEDecoder()
    pieces = []
    try:
        async with client.stream("POST", path, json=body) as r:
            rec.status = r.status_code
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return rec
            async for raw in r.aiter_raw():
                now = time.perf_counter()
                for data in dec.feed(raw):
                    if data == "[DONE]":
                        rec.done = now
                        continue
                    ev = json.loads(data)
                    if "error" in ev:
                        rec.error = ev["error"].get("message", "error")
                        continue
                    if ev.get("usage"):
                        rec.output_tokens = ev["usage"].get("completion_tokens", rec.output_tokens)
                        rec.cached_tokens = (ev["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
                        if rec.prompt_len is None:
                            rec.prompt_len = ev["usage"].get("prompt_tokens")
                    for ch in ev.get("choices", []):
                        piece = ch["delta"].get("content") if "delta" in ch else ch.get("text")
                        if piece:
                            pieces.append(piece)
                            rec.chunk_times.append(now)
                        if ch.get("finish_reason"):
                            rec.finish_reason = ch["finish_reason"]
        if rec.done is None and rec.error is None:
            rec.error = "the stream ended without data: [DONE]"
        if rec.done is not None and rec.chunk_times:
            rec.done = rec.chunk_times[-1]
        if rec.output_tokens == 0:
            rec.output_tokens = len(rec.chunk_times)  # no usage chunk: one token per chunk
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash
        rec.error = f"{type(exc).__name__}: {exc}"
    rec.text = "".join(pieces)
    return rec


async def run_load(base_url: str, requests: Sequence[RequestSpec], *, model: str, rate: float = math.inf,
                   burstiness: float = 1.0, max_concurrency: int | None = None, chat: bool = False,
                   ignore_eos: bool = True, temperature: float = 0.0, seed: int = 0,
                   timeout_s: float = 600.0, progress: bool = True, extra_body: dict | None = None,
                   slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
                   slo_e2e_s: float | None = None, client: str = "raw") -> dict:
    """Send ``requests`` to ``base_url`` and measure them (see the module docstring).

    Arrivals follow the trace's timestamps if every request has one, else
    :func:`arrival_times` at ``rate`` with ``burstiness``; ``max_concurrency``
    caps requests in flight (with ``rate=inf`` that is a closed loop of that
    many clients). ``client``: ``"raw"`` (:class:`RawHTTPClient`, cheap per
    token) or ``"httpx"``.
    """
    if client not in ("raw", "httpx"):
        raise ValueError(f"client must be 'raw' or 'httpx', got {client!r}")
    n = len(requests)
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
    if requests and all(r.arrival_s is not None for r in requests):
        times = [r.arrival_s for r in requests]
    else:
        times = arrival_times(n, rate, burstiness, seed)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=n, desc="requests", leave=False)
    cap = max_concurrency or n or 1
    if client == "raw":
        http = RawHTTPClient(base_url, timeout_s)
    else:
        import httpx
        limits = httpx.Limits(max_connections=cap + 8, max_keepalive_connections=cap + 8)
        http = httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout_s), limits=limits)

    try:
        start = time.perf_counter()

        async def task(i):
            delay = start + times[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is not None:
                async with sem:
                    rec = await _one(http, path, model, requests[i], i, chat=chat, ignore_eos=ignore_eos,
                                     temperature=temperature, extra=extra_body)
            else:
                rec = await _one(http, path, model, requests[i], i, chat=chat, ignore_eos=ignore_eos,
                                 temperature=temperature, extra=extra_body)
            if bar is not None:
                bar.update(1)
            return rec

        records = await asyncio.gather(*(task(i) for i in range(n)))
        duration = time.perf_counter() - start
    finally:
        await http.aclose()
    if bar is not None:
        bar.close()
    summary = summarize(records, max(duration, 1e-9), slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s,
                        slo_e2e_s=slo_e2e_s)
    summary["config"] = {"base_url": base_url, "model": model, "rate": rate, "burstiness": burstiness,
                         "max_concurrency": max_concurrency, "chat": chat, "num_prompts": n, "seed": seed}
    summary["requests"] = [
        {k: v for k, v in asdict(r).items() if k != "text"} | {"start": r.sent - start}
        for r in records]
    for row in summary["requests"]:
        row["chunk_times"] = [t - start for t in row["chunk_times"]]
        row["sent"] = row["sent"] - start
        if row["done"] is not None:
            row["done"] = row["done"] - start
    return summary


def plot_results(summary: dict, ax=None, title: str | None = None):
    """Each request as a line from its send time to its last token, a dot per token."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    rows = summary["requests"]
    for y, r in enumerate(rows):
        if not r["chunk_times"]:
            ax.plot([r["sent"]], [y], "x", color="tab:red")
            continue
        ax.plot([r["sent"], r["chunk_times"][0]], [y, y], color="tab:orange", lw=1)
        ax.plot([r["chunk_times"][0], r["chunk_times"][-1]], [y, y], color="tab:blue", lw=1)
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("request")
    ax.set_title(title or "orange: waiting for the first token; blue: streaming")
    return ax


# ------------------------------------------------------------------- the shell
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m servelab.loadgen", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="servelab-main")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 = Poisson, <1 burstier")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--input-len", default="fixed:32", help="fixed:N uniform:A:B lognormal:MED:SIGMA exponential:MEAN")
    p.add_argument("--output-len", default="fixed:32")
    p.add_argument("--trace", default=None, help="JSONL trace to replay instead (servelab.workload's format)")
    p.add_argument("--record-trace", default=None,
                   help="write the trace actually sent (JSONL) here: `python -m servelab.sim check --trace` replays it")
    p.add_argument("--vocab-size", type=int, default=4000, help="for random token-id prompts")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", action="store_true", help="let replies end early at the end token")
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--slo-e2e-ms", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON results here")
    p.add_argument("--plot", default=None, help="write a timeline plot (PNG) here")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--client", choices=("raw", "httpx"), default="raw",
                   help="HTTP client: raw (lean, asyncio streams) or httpx")
    return p


def _fmt(summary: dict) -> str:
    lines = [f"requests: {summary['completed']} done, {summary['failed']} failed in {summary['duration_s']:.2f} s",
             f"throughput: {summary['request_throughput']:.2f} req/s, {summary['output_throughput']:.1f} "
             f"output tok/s; goodput {summary['goodput']:.2f} req/s"]
    for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        s = summary[name]
        if s["n"]:
            lines.append(f"{name[:-2].upper():5s} ms  " + "  ".join(
                f"{k} {s[k] * 1e3:8.1f}" for k in ("mean", "p50", "p90", "p95", "p99")))
    return "\n".join(lines)


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    if a.trace:
        reqs = load_trace(a.trace, vocab_size=a.vocab_size, seed=a.seed)
    else:
        reqs = synthetic_requests(a.num_prompts, a.input_len, a.output_len, vocab_size=a.vocab_size, seed=a.seed)
    ms = (lambda v: None if v is None else v / 1e3)
    summary = asyncio.run(run_load(a.base_url, reqs, model=a.model, rate=a.request_rate,
                                   burstiness=a.burstiness, max_concurrency=a.max_concurrency,
                                   chat=a.endpoint == "chat", ignore_eos=not a.no_ignore_eos,
                                   temperature=a.temperature, seed=a.seed, progress=not a.no_progress,
                                   slo_ttft_s=ms(a.slo_ttft_ms), slo_tpot_s=ms(a.slo_tpot_ms),
                                   slo_e2e_s=ms(a.slo_e2e_ms), client=a.client))
    print(_fmt(summary))
    if a.record_trace:
        _workload.save_trace(trace_of(summary, reqs), a.record_trace)
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1, default=float))
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        ax = plot_results(summary)
        ax.figure.tight_layout()
        ax.figure.savefig(a.plot, dpi=120)
        plt.close(ax.figure)
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
