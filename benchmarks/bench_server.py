"""Server benchmark: what HTTP streaming costs on top of the engine, and latency against load.

    .venv/bin/python benchmarks/bench_server.py                # full run (~2-3 min)
    .venv/bin/python benchmarks/bench_server.py --quick --out D  # smoke run (seconds), into folder D

Writes server.md, server.json and server.png into benchmarks/results/ (or ``--out``).

The server runs as its own process (``python -m servelab.server``, as
deployed); the load generator (``servelab.loadgen``) and the offline
reference (``LLM.generate``) run in this process. Model: the committed
``servelab-main`` checkpoint, fp32, one torch thread on each side. Prompts are
random token ids (no prefix-cache hits) and ``ignore_eos`` makes every reply
exactly ``output`` tokens, so both sides do the same work.

1. **Throughput at 64 concurrent streams**: the same requests through the
   server (64 clients in a closed loop) and through ``LLM.generate`` with 64
   seats, in interleaved pairs; the goal is server >= 0.85 x offline.
2. **TTFT overhead at low load**: one request at a time, one-token replies;
   the client's time to first token through the server minus the engine's own
   (``add_request`` to first token, in this process), interleaved; the goal is
   <= 5 ms.
3. **Latency against request rate**: Poisson arrivals at fractions of the
   measured saturation rate; TTFT, TPOT and E2E percentiles and the achieved
   throughput at each. The *knee* is the last rate before the median TTFT first
   leaves 3x the lowest rate's (past it, requests queue).
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from _common import RESULTS, parser, write_results

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "data" / "models" / "servelab-main"

FULL = dict(requests=384, concurrency=64, input="uniform:16:64", output=32, pairs=5, thread_pairs=3,
            ttft_reps=21, prompt_len=32, rates=(0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0), rate_requests=160)
QUICK = dict(requests=16, concurrency=8, input="uniform:4:16", output=4, pairs=1, thread_pairs=1, ttft_reps=3,
             prompt_len=8, rates=(0.5, 1.0), rate_requests=8)
GOAL_THROUGHPUT_RATIO = 0.85
GOAL_TTFT_OVERHEAD_MS = 5.0
KNEE_FACTOR = 3.0


def machine() -> dict:
    from servelab.machine import describe
    return describe(("torch", "numpy", "fastapi", "uvicorn", "httpx"), threads=1)


def offline_run(llm, reqs, output: int) -> dict:
    from servelab.sampling import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=output, ignore_eos=True)
    llm.engine.scheduler.kv.reset_prefix_cache()
    t0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate([r.prompt for r in reqs], sp)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(o.token_ids) for o in outs)
    assert tokens == output * len(reqs), "every request must produce its full length"
    return {"seconds": dt, "cpu_seconds": cpu, "output_tokens": tokens, "output_throughput": tokens / dt}


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) a process and its children (the engine core) have
    used so far, all their threads together."""
    import psutil
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def server_run(url, reqs, concurrency: int, rate=float("inf"), pid: int | None = None) -> dict:
    from servelab import loadgen
    c0, s0 = time.process_time(), (_cpu(pid) if pid else 0.0)
    s = asyncio.run(loadgen.run_load(url, reqs, model="servelab-main", rate=rate,
                                     max_concurrency=concurrency, progress=False, timeout_s=300))
    s["client_cpu_seconds"] = time.process_time() - c0
    s["server_cpu_seconds"] = (_cpu(pid) - s0) if pid else None
    if s["failed"]:
        bad = [r["error"] for r in s["requests"] if r["error"]][:3]
        raise RuntimeError(f"{s['failed']} requests failed: {bad}")
    return s


def measure_pair(llm, server, P, seed: int) -> dict:
    """One offline run and one server run of the same fresh requests (no prefix hits)."""
    from servelab import loadgen
    batch = loadgen.synthetic_requests(P["requests"], P["input"], f"fixed:{P['output']}", seed=seed)
    off = offline_run(llm, batch, P["output"])
    srv = server_run(server.url, batch, P["concurrency"], pid=server.pid)
    return {"offline_tok_s": off["output_throughput"], "server_tok_s": srv["output_throughput"],
            "ratio": srv["output_throughput"] / off["output_throughput"],
            "offline_tok_per_cpu_s": off["output_tokens"] / off["cpu_seconds"],
            "server_tok_per_cpu_s": srv["output_tokens"] / srv["server_cpu_seconds"],
            "client_tok_per_cpu_s": srv["output_tokens"] / srv["client_cpu_seconds"],
            "client_us_per_token": srv["client_cpu_seconds"] / srv["output_tokens"] * 1e6,
            "cpu_ratio": (srv["output_tokens"] / srv["server_cpu_seconds"])
            / (off["output_tokens"] / off["cpu_seconds"]),
            "server_ttft_p50_s": srv["ttft_s"]["p50"], "server_tpot_p50_s": srv["tpot_s"]["p50"]}


def throughput_pairs_thread_mode(llm, P) -> list[dict]:
    """The same pairs against a server whose engine loop is a thread of the API process
    (``--no-engine-process``): what the separate engine-core process buys."""
    from servelab.server import launch
    server = launch(MODEL_DIR, args=["--max-num-seqs", P["concurrency"], "--max-queued-requests", 100_000,
                                     "--no-engine-process"])
    try:
        from servelab import loadgen
        warm = loadgen.synthetic_requests(P["concurrency"] // 2 or 1, P["input"], f"fixed:{P['output']}", seed=499)
        server_run(server.url, warm, P["concurrency"])
        return [measure_pair(llm, server, P, seed=500 + k) for k in range(P["thread_pairs"])]
    finally:
        server.stop()


def engine_ttft(llm, prompt_ids) -> float:
    from servelab.sampling import SamplingParams
    eng = llm.engine
    rid = f"ttft-{time.perf_counter_ns()}"
    t0 = time.perf_counter()
    eng.add_request(rid, prompt_ids, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while True:
        for out in eng.step():
            if out.request_id == rid and out.token_ids:
                t1 = time.perf_counter()
                while eng.has_unfinished_requests():
                    eng.step()
                return t1 - t0


def server_ttft(client, prompt_ids) -> tuple[float, dict]:
    """Client-side TTFT, and where it went (the server's own timestamps; the monotonic
    clock is shared by the processes of one machine)."""
    from servelab.loadgen import SSEDecoder
    body = {"model": "servelab-main", "prompt": prompt_ids, "max_tokens": 1, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_timings": True}
    dec = SSEDecoder()
    t0 = time.perf_counter()
    first, timings = None, None
    with client.stream("POST", "/v1/completions", json=body) as r:
        for raw in r.iter_raw():
            now = time.perf_counter()
            for data in dec.feed(raw):
                if data == "[DONE]":
                    continue
                ev = json.loads(data)
                if first is None and ev["choices"]:
                    first = now
                timings = ev.get("servelab_timings", timings)
    assert first is not None and timings is not None
    t = timings
    split = {"client_to_server": t["received"] - t0, "http_and_tokenize": t["submitted"] - t["received"],
             "engine_queue": t["first_scheduled"] - t["submitted"],
             "engine_prefill": t["first_token"] - t["first_scheduled"],
             "token_to_client": first - t["first_token"]}
    return first - t0, split


def summarize_load(s: dict) -> dict:
    def pick(name):
        return {k: s[name][k] for k in ("p50", "p90", "p99", "mean")}
    return {"request_throughput": s["request_throughput"], "output_throughput": s["output_throughput"],
            "ttft_s": pick("ttft_s"), "tpot_s": pick("tpot_s"), "itl_s": pick("itl_s"), "e2e_s": pick("e2e_s"),
            "duration_s": s["duration_s"], "completed": s["completed"]}


def main(argv=None) -> int:
    a = parser(__doc__.split("\n\n")[0], out_default=RESULTS).parse_args(argv)
    torch.set_num_threads(1)
    P = QUICK if a.quick else FULL
    a.out.mkdir(parents=True, exist_ok=True)
    import httpx

    from servelab import loadgen
    from servelab.engine import LLM
    from servelab.server import launch

    result = {"quick": a.quick, "machine": machine(), "params": {k: list(v) if isinstance(v, tuple) else v
                                                                 for k, v in P.items()},
              "goals": {"throughput_ratio": GOAL_THROUGHPUT_RATIO, "ttft_overhead_ms": GOAL_TTFT_OVERHEAD_MS}}
    t_start = time.perf_counter()
    llm = LLM(MODEL_DIR, max_num_seqs=P["concurrency"])
    server = launch(MODEL_DIR, args=["--max-num-seqs", P["concurrency"], "--max-queued-requests", 100_000])
    try:
        reqs = loadgen.synthetic_requests(P["requests"], P["input"], f"fixed:{P['output']}", seed=0)
        # warm both sides up (first-call costs, allocator growth)
        offline_run(llm, reqs[:P["concurrency"] // 2 or 1], P["output"])
        server_run(server.url, reqs[:P["concurrency"] // 2 or 1], P["concurrency"])

        # 1. throughput, interleaved pairs (fresh prompts per pair: no prefix hits on either side)
        pairs = [measure_pair(llm, server, P, seed=100 + k) for k in range(P["pairs"])]
        ratios = [p["ratio"] for p in pairs]
        thread_pairs = throughput_pairs_thread_mode(llm, P)
        result["throughput"] = {"pairs": pairs, "ratio_median": statistics.median(ratios),
                                "cpu_ratio_median": statistics.median(p["cpu_ratio"] for p in pairs),
                                "offline_tok_s_median": statistics.median(p["offline_tok_s"] for p in pairs),
                                "server_tok_s_median": statistics.median(p["server_tok_s"] for p in pairs),
                                "concurrency": P["concurrency"], "requests": P["requests"], "output": P["output"],
                                "thread_mode_pairs": thread_pairs,
                                "thread_mode_ratio_median": statistics.median(p["ratio"] for p in thread_pairs),
                                "thread_mode_cpu_ratio_median": statistics.median(p["cpu_ratio"]
                                                                                  for p in thread_pairs)}

        # 2. TTFT at low load: engine alone vs through HTTP, interleaved, fresh prompts
        prompts = [r.prompt for r in loadgen.synthetic_requests(P["ttft_reps"], f"fixed:{P['prompt_len']}",
                                                                "fixed:1", seed=7)]
        eng_s, srv_s, splits = [], [], []
        with httpx.Client(base_url=server.url, timeout=60) as client:
            server_ttft(client, prompts[0][::-1])  # open the connection
            for p in prompts:
                eng_s.append(engine_ttft(llm, p))
                ttft, split = server_ttft(client, p)
                srv_s.append(ttft)
                splits.append(split)
        diffs = [b - a for a, b in zip(eng_s, srv_s)]
        result["ttft_low_load"] = {"engine_ms_median": statistics.median(eng_s) * 1e3,
                                   "server_ms_median": statistics.median(srv_s) * 1e3,
                                   "overhead_ms_median": statistics.median(diffs) * 1e3,
                                   "overhead_ms_each": [d * 1e3 for d in diffs], "prompt_len": P["prompt_len"],
                                   "server_split_ms_median": {k: statistics.median(x[k] for x in splits) * 1e3
                                                              for k in splits[0]}}

        # 3. latency against offered rate (open loop: Poisson arrivals, no client cap)
        sat_rps = result["throughput"]["server_tok_s_median"] / P["output"]
        sweep = []
        for i, frac in enumerate(P["rates"]):
            rate = frac * sat_rps
            batch = loadgen.synthetic_requests(P["rate_requests"], P["input"], f"fixed:{P['output']}",
                                               seed=1000 + i)
            s = asyncio.run(loadgen.run_load(server.url, batch, model="servelab-main", rate=rate, seed=i,
                                             progress=False, timeout_s=300))
            if s["failed"]:
                bad = [r["error"] for r in s["requests"] if r["error"]][:3]
                raise RuntimeError(f"rate {rate:.1f}/s: {s['failed']} requests failed: {bad}")
            sweep.append({"fraction_of_saturation": frac, "offered_rps": rate, **summarize_load(s)})
        base = sweep[0]["ttft_s"]["p50"]
        knee = None
        for row in sweep:  # the knee: the last rate before the median TTFT first leaves the band
            if row["ttft_s"]["p50"] > KNEE_FACTOR * base:
                break
            knee = row
        result["rate_sweep"] = {"saturation_rps_estimate": sat_rps, "rows": sweep, "knee_factor": KNEE_FACTOR,
                                "knee_offered_rps": knee["offered_rps"] if knee else None,
                                "knee_fraction": knee["fraction_of_saturation"] if knee else None}
    finally:
        code = server.stop()
    result["server_exit_code"] = code
    result["run_seconds"] = time.perf_counter() - t_start
    result["machine"]["load_average_1min_end"] = round(os.getloadavg()[0], 2)
    t, tt = result["throughput"], result["ttft_low_load"]
    result["verdicts"] = {"throughput_ratio_met": t["ratio_median"] >= GOAL_THROUGHPUT_RATIO,
                          "ttft_overhead_met": tt["overhead_ms_median"] <= GOAL_TTFT_OVERHEAD_MS}

    report = markdown(result)
    write_results(a.out, "server", result, report)
    plot(result, a.out / "server.png")
    print(report)
    return 0


def _modes_verdict(t: dict) -> str:
    """Whether the pairs separate the two server modes (process against thread), in words."""
    proc = [p["ratio"] for p in t["pairs"]]
    thread = [p["ratio"] for p in t["thread_mode_pairs"]]
    span = (f"Process-mode pairs spanned {min(proc):.2f}-{max(proc):.2f}, "
            f"thread-mode {min(thread):.2f}-{max(thread):.2f}")
    if min(proc) > max(thread):
        return span + ": the engine-core process did better in every pair."
    if min(thread) > max(proc):
        return span + ": the thread did better in every pair."
    return span + ": the ranges overlap, so this run does not separate the two modes."


def markdown(r: dict) -> str:
    m, t, tt, sw = r["machine"], r["throughput"], r["ttft_low_load"], r["rate_sweep"]
    ok = {True: "met", False: "MISSED"}
    lines = [
        "# Server benchmark (`benchmarks/bench_server.py`)" + (" — QUICK smoke run" if r["quick"] else ""), "",
        f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, load average {m['load_average_1min']} "
        f"at start and {m['load_average_1min_end']} at the end; torch {m['torch']}, fastapi {m['fastapi']}, "
        f"uvicorn {m['uvicorn']}, httpx {m['httpx']}, Python {m['python']}; one torch thread per process; "
        f"{m['date']}. Run time {r['run_seconds']:.0f} s. Model `servelab-main` (fp32). The server "
        "(`python -m servelab.server`) is two processes: the API server (HTTP, server-sent events, "
        "tokenizing) and the engine core (scheduler, model, sampler, and here also the detokenizer and "
        "stop strings, which vLLM V1 keeps in its API server process: its engine core returns token ids "
        "only), talking over a Unix socket with one message per engine step. The load generator (`servelab.loadgen`, its lean "
        "HTTP/1.1 client) and the offline reference run in the benchmark's process, so all of them "
        "share the machine's cores.", "",
        f"## Throughput at {t['concurrency']} concurrent streams", "",
        f"{t['requests']} requests, prompts {r['params']['input']} tokens, {t['output']} output tokens each "
        "(`ignore_eos`), greedy. Offline = `LLM.generate` with the same seats. Interleaved pairs:", "",
        "| pair | offline tok/s | server tok/s | server / offline | offline tok per CPU-s | server "
        "tok per CPU-s | server / offline per CPU-s | client tok per CPU-s |", "|---|---|---|---|---|---|---|---|"]
    for k, p in enumerate(t["pairs"], 1):
        lines.append(f"| {k} | {p['offline_tok_s']:,.0f} | {p['server_tok_s']:,.0f} | {p['ratio']:.2f} | "
                     f"{p['offline_tok_per_cpu_s']:,.0f} | {p['server_tok_per_cpu_s']:,.0f} | "
                     f"{p['cpu_ratio']:.2f} | {p['client_tok_per_cpu_s']:,.0f} |")
    client_us = statistics.median(p["client_us_per_token"] for p in t["pairs"])
    lines += ["", f"Median ratio **{t['ratio_median']:.2f}** (goal >= {r['goals']['throughput_ratio']}: "
              f"{ok[r['verdicts']['throughput_ratio_met']]}). Per CPU-second of the server (both its "
              f"processes, all their threads) against the offline engine's: **{t['cpu_ratio_median']:.2f}**, "
              "a figure that other processes on the machine do not skew. The load generator spent a median "
              f"{client_us:.0f} us of CPU per streamed token, on top, competing for the same cores in the "
              "wall-clock ratio.", "",
              f"The same pairs against the server with its engine loop as a thread of the API process "
              f"(`--no-engine-process`, {len(t['thread_mode_pairs'])} pairs): median ratio "
              f"**{t['thread_mode_ratio_median']:.2f}** (pairs: "
              + ", ".join(f"{p['ratio']:.2f}" for p in t["thread_mode_pairs"])
              + f"), per CPU-second **{t['thread_mode_cpu_ratio_median']:.2f}**. " + _modes_verdict(t)
              + " The reason for two processes (vLLM's design): in one, the engine's Python and the HTTP "
              "layer's take turns on one interpreter lock; in two, the engine core can step on one core while "
              "HTTP runs on another, when a core is free (here the load generator and the offline reference "
              "used the same cores).", "",
              "## Time to first token at low load", "",
              f"One request at a time, {tt['prompt_len']}-token prompts, one-token replies, "
              f"{len(tt['overhead_ms_each'])} interleaved pairs. Engine alone (add_request -> first token): "
              f"median {tt['engine_ms_median']:.2f} ms; through the server as the client sees it: median "
              f"{tt['server_ms_median']:.2f} ms; the server adds **{tt['overhead_ms_median']:.2f} ms** "
              f"(goal <= {r['goals']['ttft_overhead_ms']} ms: {ok[r['verdicts']['ttft_overhead_met']]}).", "",
              "Where the server's TTFT went (medians, from the server's own timestamps): "
              + ", ".join(f"{k.replace('_', ' ')} {v:.2f} ms" for k, v in tt["server_split_ms_median"].items())
              + " ('engine queue' runs from the API server's hand-off to the engine core's scheduling, so it "
              "includes the message to the core and its wake-up). Everything but the prefill is the serving "
              "path: client to API server, API server to engine core, and back twice; each hand-off is a wake-up of a process blocked on a socket, "
              "which waits for a free core when the machine is busy.", "",
              "## Latency against request rate (Poisson arrivals)", "",
              f"Saturation estimate {sw['saturation_rps_estimate']:.1f} requests/s (the throughput above / "
              "output length). Each row sends "
              f"{r['params']['rate_requests']} fresh requests.", "",
              "| offered req/s | x saturation | achieved req/s | output tok/s | TTFT p50 ms | TTFT p99 ms "
              "| TPOT p50 ms | TPOT p99 ms | E2E p50 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for row in sw["rows"]:
        lines.append(f"| {row['offered_rps']:.1f} | {row['fraction_of_saturation']:.2f} | "
                     f"{row['request_throughput']:.1f} | {row['output_throughput']:,.0f} | "
                     f"{row['ttft_s']['p50'] * 1e3:.1f} | {row['ttft_s']['p99'] * 1e3:.1f} | "
                     f"{row['tpot_s']['p50'] * 1e3:.1f} | {row['tpot_s']['p99'] * 1e3:.1f} | "
                     f"{row['e2e_s']['p50'] * 1e3:.0f} |")
    knee = (f"{sw['knee_offered_rps']:.1f} requests/s ({sw['knee_fraction']:.2f} x the saturation estimate)"
            if sw["knee_offered_rps"] is not None else "not reached")
    top = max(row["request_throughput"] for row in sw["rows"])
    before_full = sw["knee_offered_rps"] is not None and sw["knee_offered_rps"] < top
    climb = ": queueing delay climbs before the server is full" if before_full else ""
    lines += ["", f"Knee (the last rate before the median TTFT first exceeds {sw['knee_factor']:.0f}x the "
              f"lowest rate's): {knee}{climb}. The achieved rate "
              f"levelled off at {top:.1f} requests/s ({top / sw['saturation_rps_estimate']:.2f} x the "
              "estimate, which comes from a different run: the throughput pairs at a fixed concurrency). Other processes shared this machine's cores (see the load average "
              "above), so single rows are noisy; the shape, flat and then rising, is the result.", ""]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = r["rate_sweep"]["rows"]
    x = [row["offered_rps"] for row in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    a1.plot(x, [row["ttft_s"]["p50"] * 1e3 for row in rows], "o-", label="TTFT p50")
    a1.plot(x, [row["ttft_s"]["p99"] * 1e3 for row in rows], "o--", label="TTFT p99")
    a1.plot(x, [row["tpot_s"]["p50"] * 1e3 for row in rows], "s-", label="TPOT p50")
    a1.set_xlabel("offered requests/s")
    a1.set_ylabel("ms")
    a1.set_yscale("log")
    a1.legend()
    a2.plot(x, [row["request_throughput"] for row in rows], "o-", label="achieved")
    a2.plot(x, x, ":", color="gray", label="offered")
    a2.set_xlabel("offered requests/s")
    a2.set_ylabel("completed requests/s")
    a2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
