"""Benchmark servelab.parallel on this machine's processes: collectives, tensor-parallel decoding, bubbles.

    .venv/bin/python benchmarks/bench_parallel.py [--repeats 10] [--tokens 32]
    .venv/bin/python benchmarks/bench_parallel.py --quick --out /tmp/x   # smoke run, seconds

Three measurements, all over gloo on 127.0.0.1 (loopback, not a GPU fabric):
  * collectives: gloo all-reduce, the send/recv ring all-reduce and all-to-all on two
    processes at message sizes from 4 KB to 4 MB, interleaved, fastest and median of
    ``--repeats``; a least-squares alpha-beta fit of gloo's all-reduce;
  * tensor-parallel decoding of the course model (servelab-main) on 1, 2 and 4 processes:
    milliseconds per generated token, all-reduces per token, and the loopback all-reduce
    time those all-reduces imply (from the fit);
  * pipeline bubbles: 3 stages of the course model, each stage's work padded to a fixed
    time, for 1, 2, 4, 8 micro-batches, measured against (p - 1)/(m + p - 1).
Writes benchmarks/results/parallel.md and parallel.json (``--out`` picks another folder).
"""
from __future__ import annotations

import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from servelab import comm  # noqa: E402
from servelab.machine import describe, git_commit  # noqa: E402
from servelab.model import COURSE_MODELS_DIR, load_pretrained  # noqa: E402
from servelab.parallel import collectives, pipeline, tensor  # noqa: E402

from _common import RESULTS, parser, write_results  # noqa: E402


def bench_collectives(sizes, repeats):
    rows = collectives.measure_collectives(sizes, world_size=2, repeats=repeats)
    try:
        alpha, bw = comm.fit_alpha_beta([r["bytes"] for r in rows], [r["gloo_min_s"] for r in rows])
    except ValueError:  # timings too noisy to show a slope (small sizes on a busy machine)
        alpha = bw = None
    return {"rows": rows, "fit_alpha_s": alpha, "fit_bandwidth": bw}


def bench_tensor(tokens, worlds):
    folder = COURSE_MODELS_DIR / "servelab-main"
    model = load_pretrained(folder)
    torch.set_num_threads(1)
    prompt = torch.arange(5, 21)[None]
    out = {}
    # one process: the same greedy loop with the model's own cache
    with torch.no_grad():
        times = []
        for _ in range(2):
            cache, ids = model.new_cache(1, prompt.shape[1] + tokens), prompt
            t0 = time.perf_counter()
            for _ in range(tokens):
                nxt = model(ids, cache=cache)[0, -1].argmax()
                ids = nxt.view(1, 1)
            times.append(time.perf_counter() - t0)
    out[1] = {"ms_per_token": min(times) / tokens * 1e3, "all_reduces_per_token": 0}
    for w in worlds:
        job = {"kind": "generate", "input_ids": prompt[0], "max_new_tokens": tokens}
        res = tensor.run_tensor_parallel(folder, [job, job], w)
        best = min(res[0][0]["seconds"], res[0][1]["seconds"])   # includes the prompt pass
        traffic = res[0][1]["traffic"]
        out[w] = {"ms_per_token": best / tokens * 1e3,
                  "all_reduces_per_token": traffic["all_reduces"] / tokens,
                  "all_reduce_bytes_per_token": traffic["all_reduce_bytes"] / tokens,
                  "weight_bytes_rank0": res[0][0]["weight_bytes"]}
    return out


def bench_pipeline(microbatches, pad):
    model = load_pretrained(COURSE_MODELS_DIR / "servelab-main")
    batch = torch.arange(1, 17).repeat(8, 1)
    rows = []
    for m in microbatches:
        run = pipeline.run_pipeline(model, batch, 3, m, pad_s=pad)
        rows.append({"microbatches": m, "measured": run["bubble"],
                     "formula": comm.bubble_fraction(3, m), "span_s": run["span_s"]})
    return {"stages": 3, "pad_s": pad, "rows": rows}


def to_markdown(res) -> str:
    m = res["machine"]
    lines = ["# servelab.parallel on this machine's processes (gloo over loopback)", "",
             f"{m['cpu']}, {m['logical_cpus']} logical CPUs, load average {m['load_average_1min']} (1 min, "
             f"at the start; {res.get('load_at_end', '?')} at the end), Python {m.get('python')}, "
             f"torch {m.get('torch')}, numpy {m.get('numpy')}, {m['date']}, git commit {res.get('git_commit', '?')}, "
             f"one thread per process. Command: `{res['command']}` ({res.get('run_seconds', 0):.0f} s).", "",
             "Every process is a real OS process talking over gloo on 127.0.0.1: the times are this machine's "
             "loopback and cores, not a GPU fabric. With more processes than logical CPUs "
             f"({m['logical_cpus']} here) the processes take turns on the cores, so those rows measure "
             "oversubscription as much as splitting.", "",
             "## Collectives (two processes)", "",
             "| bytes | gloo all-reduce ms (fastest / median) | ring ms | all-to-all ms |", "|---|---|---|---|"]
    for r in res["collectives"]["rows"]:
        lines.append(f"| {r['bytes']:,} | {r['gloo_min_s'] * 1e3:.2f} / {r['gloo_s'] * 1e3:.2f} | "
                     f"{r['ring_min_s'] * 1e3:.2f} | {r['all_to_all_min_s'] * 1e3:.2f} |")
    c = res["collectives"]
    fit = ("no slope in these timings" if c["fit_bandwidth"] is None else
           f"alpha {c['fit_alpha_s'] * 1e6:.0f} us, bandwidth {c['fit_bandwidth'] / 1e9:.2f} GB/s")
    lines += ["", f"alpha-beta fit of gloo's all-reduce: {fit} "
              f"(NVLink H100: {comm.get_link('NVLink H100').bandwidth / 1e9:.0f} GB/s).", "",
              "## Tensor-parallel decoding of the course model", "",
              "| processes | ms per token | all-reduces per token | rank 0 weights MB |", "|---|---|---|---|"]
    for w, r in res["tensor"].items():
        held = f"{r['weight_bytes_rank0'] / 1e6:.1f}" if "weight_bytes_rank0" in r else "all"
        lines.append(f"| {w} | {r['ms_per_token']:.2f} | {r['all_reduces_per_token']:.0f} | {held} |")
    p = res["pipeline"]
    lines += ["", f"## Pipeline bubbles ({p['stages']} stages, each padded to {p['pad_s'] * 1e3:.0f} ms)", "",
              "| micro-batches | measured | (p-1)/(m+p-1) |", "|---|---|---|"]
    for r in p["rows"]:
        lines.append(f"| {r['microbatches']} | {r['measured']:.3f} | {r['formula']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = parser(__doc__.splitlines()[0], quick_help="tiny sizes, a few tokens: a smoke run", out_default=RESULTS)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args(argv)
    if args.quick:
        sizes, repeats, tokens, worlds, mbs, pad = [4096, 1_048_576], 2, 4, (2,), (1, 2), 0.01
    else:
        sizes = [4_096, 65_536, 524_288, 2_097_152, 4_194_304]
        repeats, tokens, worlds, mbs, pad = args.repeats, args.tokens, (2, 4), (1, 2, 4, 8), 0.1
    start = time.perf_counter()
    res = {"machine": describe(threads=1),
           "command": "python benchmarks/bench_parallel.py" + (" --quick" if args.quick else ""),
           "collectives": bench_collectives(sizes, repeats),
           "tensor": bench_tensor(tokens, worlds),
           "pipeline": bench_pipeline(mbs, pad)}
    res["run_seconds"] = time.perf_counter() - start
    res["load_at_end"] = round(os.getloadavg()[0], 2)
    res["git_commit"] = git_commit()
    report = to_markdown(res)
    write_results(args.out, "parallel", res, report)
    print(report)


if __name__ == "__main__":
    main()
