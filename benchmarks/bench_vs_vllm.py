"""servelab's engine beside vLLM's, offline: 64 seats and one request alone, eager and compiled.

    .venv/bin/python benchmarks/make_vs_vllm_checkpoint.py                    # once: data/hf/servelab-large
    flock /work/coord/bench.lock .venv/bin/python benchmarks/bench_vs_vllm.py   # ~15 min
    .venv/bin/python benchmarks/bench_vs_vllm.py --quick --out D                # smoke run

Writes ``vs_vllm_offline.json`` into benchmarks/results/ (or ``--out``); the
prose is in ``benchmarks/results/vs_vllm.md``. Needs ``.venv-vllm`` (``make vllm``).

* **Engines**: one driver process per engine and case (``benchmarks/vs_vllm_driver.py``,
  written for ``vllm.LLM``; only the import differs), vLLM's from
  ``.venv-vllm``, servelab's from this venv. Both: float32, one torch thread
  (``OMP_NUM_THREADS=1``), no core pinning (``VLLM_CPU_OMP_THREADS_BIND=nobind``),
  vLLM's engine core and worker in the driver's process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the CPU time of one process is all
  of an engine's work. The same engine arguments on both: 64 seats, 2,048
  tokens a step, 32-token blocks, the same KV pool (``num_gpu_blocks_override``),
  prefix caching on (the prompts share no prefix), and ``enforce_eager`` True
  (eager) or False (compiled: ``torch.compile`` in each engine's own way).
* **Checkpoints**: ``servelab-main`` (5.8M parameters, trained) and
  ``servelab-large`` (the same architecture at ~104M parameters and a 2,048-token
  context, random weights: ``make_vs_vllm_checkpoint.py``).
* **Workloads**, greedy, ``ignore_eos``: *64 seats*: 64 prompts of random
  ids at once; *alone*: one request.
* **Order**: both engines load a case, run every workload once as a warm-up
  (compilation happens there), then ``rounds`` rounds in which the engines
  alternate, the first engine switching each round. Reported: medians over the
  rounds of output tokens per second (wall clock of the ``generate`` call) and
  per CPU-second (the process's CPU time over the same call), and whether the
  two engines produced the same tokens.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS, parser, results_folder

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "vs_vllm_driver.py"
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
MAIN = ROOT / "data" / "models" / "servelab-main"
LARGE = ROOT / "data" / "hf" / "servelab-large"
ENGINES = ("vllm", "servelab")
BASE_ARGS = dict(block_size=32, max_num_seqs=64, max_num_batched_tokens=2048, enable_prefix_caching=True,
                 enable_chunked_prefill=True, seed=0)
MODELS = {
    "servelab-main": dict(path=MAIN, max_model_len=1024, blocks=2048,
                          seats=dict(n=64, prompt=(33, 257), output=(16, 192)), alone=dict(prompt=128, output=256)),
    "servelab-large": dict(path=LARGE, max_model_len=2048, blocks=1024,
                           seats=dict(n=64, prompt=(16, 64), output=(32, 32)), alone=dict(prompt=512, output=64)),
}
FULL = dict(models=("servelab-main", "servelab-large"), modes=("eager", "compiled"), rounds=3)
QUICK = dict(models=("servelab-main",), modes=("eager",), rounds=1,
             shapes=dict(seats=dict(n=8, prompt=(8, 32), output=(8, 8)), alone=dict(prompt=16, output=8)))


def workloads(spec: dict, seed: int = 22) -> dict:
    """The prompts (random ordinary ids, below the special tokens at 4091) and lengths."""
    rng = random.Random(seed)
    s, a = spec["seats"], spec["alone"]
    seats = [[rng.randrange(4091) for _ in range(rng.randint(*s["prompt"]))] for _ in range(s["n"])]
    return {"seats": {"prompts": seats, "max_tokens": [rng.randint(*s["output"]) for _ in seats]},
            "alone": {"prompts": [[rng.randrange(4091) for _ in range(a["prompt"])]], "max_tokens": [a["output"]]}}


class Driver:
    def __init__(self, engine: str, log_dir: Path, tag: str = ""):
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_CPU_KVCACHE_SPACE="2",
                   VLLM_LOGGING_LEVEL="WARNING", TQDM_DISABLE="1")
        py = str(VLLM_PY) if engine == "vllm" else sys.executable
        self.engine = engine
        self.log = open(log_dir / f"{engine}{'-' + tag if tag else ''}.log", "w")
        self.proc = subprocess.Popen([py, str(DRIVER), engine], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, cwd=log_dir, env=env)
        self.info = None  # the ready line; read by started(), so both engines import at once

    def started(self) -> "Driver":
        if self.info is None:
            self.info = self._read()
        return self

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.log.flush()
            tail = Path(self.log.name).read_text()[-3000:]
            raise RuntimeError(f"the {self.engine} driver stopped; its log ends:\n{tail}")
        return json.loads(line)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.close()
            self.proc.wait(120)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.log.close()


def run_case(drivers: dict, name: str, mode: str, spec: dict, rounds: int, warm: bool) -> dict:
    args = dict(BASE_ARGS, max_model_len=spec["max_model_len"], num_gpu_blocks_override=spec["blocks"],
                enforce_eager=(mode == "eager"))
    case = {"model": name, "mode": mode, "engine_args": args, "load": {}, "runs": {}}
    for e, d in drivers.items():
        case["load"][e] = d.ask(op="load", model=str(spec["path"]), engine_args=args)
    work = workloads(spec)
    if warm:  # compilation and first-touch costs land here, not in the timed rounds
        for e, d in drivers.items():
            for w in work.values():
                d.ask(op="run", **w)
    same = {w: [] for w in work}
    for r in range(rounds):
        order = list(drivers) if r % 2 == 0 else list(drivers)[::-1]
        for wname, w in work.items():
            ids = {}
            for e in order:
                res = drivers[e].ask(op="run", **w)
                ids[e] = res.pop("token_ids")
                res.update(round=r, tokens_per_s=res["output_tokens"] / res["wall_s"],
                           tokens_per_cpu_s=res["output_tokens"] / max(res["cpu_s"], 1e-9))
                case["runs"].setdefault(wname, {}).setdefault(e, []).append(res)
                print(f"{name} {mode} {wname} round {r} {e}: {res['tokens_per_s']:.0f} tok/s, "
                      f"{res['tokens_per_cpu_s']:.0f} tok/CPU-s", flush=True)
            if len(ids) == 2:
                a, b = ids.values()
                same[wname].append(sum(x == y for x, y in zip(a, b)))
    case["same_outputs"] = {w: {"identical": v, "of": len(work[w]["prompts"])} for w, v in same.items()}
    case["summary"] = {}
    for wname, per in case["runs"].items():
        row = {}
        for e, runs in per.items():
            row[e] = {"tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs),
                      "tokens_per_cpu_s": statistics.median(x["tokens_per_cpu_s"] for x in runs),
                      "ms_per_token": 1e3 / statistics.median(x["tokens_per_s"] for x in runs)
                      if wname == "alone" else None,
                      "range_tokens_per_s": [min(x["tokens_per_s"] for x in runs),
                                             max(x["tokens_per_s"] for x in runs)]}
        if "vllm" in row and "servelab" in row:
            row["servelab_over_vllm"] = row["servelab"]["tokens_per_s"] / row["vllm"]["tokens_per_s"]
            row["servelab_over_vllm_per_cpu_s"] = (row["servelab"]["tokens_per_cpu_s"] /
                                                   row["vllm"]["tokens_per_cpu_s"])
        case["summary"][wname] = row
    return case


def main(argv=None) -> int:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--servelab-only", action="store_true", help="no vLLM (a smoke run of this side)")
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), help="run only these checkpoints")
    p.add_argument("--modes", nargs="+", choices=("eager", "compiled"), help="run only these modes")
    p.add_argument("--merge", type=Path, default=None,
                   help="an earlier vs_vllm_offline.json: its cases not run now are kept (marked with "
                        "that run's date and load)")
    args = p.parse_args(argv)
    out_dir = results_folder(p, args)
    cfg = dict(QUICK if args.quick else FULL)
    if args.models:
        cfg["models"] = tuple(args.models)
    if args.modes:
        cfg["modes"] = tuple(args.modes)
    engines = ("servelab",) if args.servelab_only else ENGINES
    if "vllm" in engines and not VLLM_PY.exists():
        print("needs vLLM's CPU build in .venv-vllm: run 'make vllm' (or pass --servelab-only)")
        return 2
    if "servelab-large" in cfg["models"] and not (LARGE / "model.safetensors").exists():
        print(f"no {LARGE}: run .venv/bin/python benchmarks/make_vs_vllm_checkpoint.py first")
        return 2
    from servelab.machine import describe
    log_dir = out_dir / "vs_vllm_logs" if not args.quick else out_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    t_start, load_before = time.perf_counter(), os.getloadavg()
    cases, infos = [], {}
    for name in cfg["models"]:
        spec = dict(MODELS[name])
        spec.update(cfg.get("shapes", {}))
        for mode in cfg["modes"]:
            # fresh processes per case: compiled code (and its recompile budget) stays with
            # the model it was compiled for, as when each engine serves one model
            t_case, load_case = time.strftime("%Y-%m-%dT%H:%M:%S"), os.getloadavg()
            drivers = {e: Driver(e, log_dir, f"{name}-{mode}") for e in engines}
            try:
                drivers = {e: d.started() for e, d in drivers.items()}
                infos = {e: d.info for e, d in drivers.items()}
                cases.append(run_case(drivers, name, mode, spec, cfg["rounds"], warm=not args.quick))
                cases[-1].update(started=t_case, load_average_before=load_case, load_average_after=os.getloadavg())
                (out_dir / "vs_vllm_offline.partial.json").write_text(json.dumps(cases, default=str) + "\n")
            finally:
                for d in drivers.values():
                    d.close()
    result = {"machine": describe(("torch",), threads=1), "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "wall_s": time.perf_counter() - t_start,
              "engines": infos,
              "settings": {"threads": "OMP_NUM_THREADS=1 in both (torch threads as each engine reports)",
                           "vllm_env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                                        "VLLM_CPU_KVCACHE_SPACE": "2"}, "dtype": "float32"},
              "workloads": {n: {k: MODELS[n][k] for k in ("seats", "alone")} for n in cfg["models"]},
              "rounds": cfg["rounds"], "quick": bool(args.quick), "cases": cases}
    if args.merge:
        old = json.loads(args.merge.read_text())
        done = {(c["model"], c["mode"]) for c in cases}
        kept = [dict(c, from_earlier_run={"date": old["machine"]["date"], "load_average_before":
                                          old["load_average_before"], "load_average_after": old["load_average_after"]})
                for c in old["cases"] if (c["model"], c["mode"]) not in done]
        cases = sorted(kept + cases, key=lambda c: (list(MODELS).index(c["model"]), c["mode"] != "eager"))
        result.update(cases=cases, merged_from=str(args.merge))
    (out_dir / "vs_vllm_offline.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    for c in cases:
        for w, row in c["summary"].items():
            ratio = row.get("servelab_over_vllm")
            print(f"{c['model']:15s} {c['mode']:8s} {w:6s} " + "  ".join(
                f"{e} {row[e]['tokens_per_s']:.0f} tok/s {row[e]['tokens_per_cpu_s']:.0f} tok/CPU-s"
                for e in engines) + (f"  servelab/vLLM {ratio:.2f}x" if ratio else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
