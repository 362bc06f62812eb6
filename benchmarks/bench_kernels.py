"""Kernel benchmark: fusion, per-op overhead, eager vs torch.compile, overlap (chapter 21 reads it).

Run:  .venv/bin/python benchmarks/bench_kernels.py                       # a few minutes (compiles)
      .venv/bin/python benchmarks/bench_kernels.py --quick --out /tmp/x  # smoke run, no compiling
      .venv/bin/python benchmarks/bench_kernels.py --device cuda --out /tmp/gpu   # a GPU, where present

Writes kernels.md and kernels.json into benchmarks/results/ (or ``--out``). One thread.
Measured: RMSNorm + residual add and SwiGLU, eager (one kernel per op) vs
``torch.compile`` (one generated loop), with bytes each moves and the cold compile
time; the cost of one trivial op; a decode step of the course model counted in ops
and timed, eager vs compiled; a matrix product and a memory copy run one after the
other vs side by side. Timings are minima of repeats (interference only adds time);
the load average is recorded before and after.
"""
from __future__ import annotations

import os
import tempfile

# A fresh compiler cache: the compile times reported are cold, not a cache hit from an
# earlier run (set before torch is imported, so inductor never sees an older cache).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="servelab-inductor-"))

import sys
import time

import torch

from servelab import kernels as K
from servelab.machine import describe
from servelab.model import load_course_model
from servelab.roofline import check_device

from _common import parser, results_folder, write_results

def _load():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def keep_allocator_warm() -> bool:
    """Ask glibc to keep freed memory instead of returning it to the OS.

    Without this, each eager op's fresh 8-64 MB output is mmap'd and page-faulted
    anew, and the fusion timings measure the kernel's page-fault handling rather
    than memory traffic (eager RMSNorm took 23-34 ms or 3.5 ms in one process
    depending on it). A serving process reuses its buffers, as this setting does.
    Returns whether the call took effect (glibc only)."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        m_trim_threshold, m_mmap_threshold = -1, -3   # glibc's mallopt parameter numbers
        return bool(libc.mallopt(m_mmap_threshold, 2**30) and libc.mallopt(m_trim_threshold, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def run(quick: bool, device: str = "cpu") -> dict:
    device = check_device(device)
    torch.set_num_threads(1)
    allocator_warm = keep_allocator_warm()
    t0 = time.perf_counter()
    load_before = _load()
    rows, width = (64, 1024) if quick else (256, 8192)
    fusion = {kind: K.fusion_measurement(kind, rows=rows, width=width, repeats=3 if quick else 10,
                                         compile=not quick, device=device) for kind in K.SEQUENCES}
    op_s = K.op_overhead_seconds(200 if quick else 4000, device=device)
    model = load_course_model().to(device)
    step = K.step_overhead(model, repeats=5 if quick else 30, op_seconds=op_s)
    compiled = None if quick else K.compile_step(model, repeats=30)
    overlap = K.overlap_measurement(n=128 if quick else 768, copy_mb=4 if quick else 64,
                                    repeats=2 if quick else 7, device=device)
    machine = describe(threads=1)
    if device.startswith("cuda"):
        machine["gpu"] = torch.cuda.get_device_name(device)
    return {"quick": quick, "device": device, "machine": machine, "load_before": load_before,
            "load_after": _load(),
            "fusion": fusion, "op_overhead_s": op_s, "course_step": step, "compile_step": compiled,
            "overlap": overlap, "run_seconds": time.perf_counter() - t0,
            "allocator_warm": allocator_warm}


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [f"# Kernel benchmark{' (quick)' if r['quick'] else ''}", "",
             "Command: `.venv/bin/python benchmarks/bench_kernels.py`", "",
             f"Machine: {m['cpu']}, one thread"
             + (f", measuring {m['gpu']} ({r['device']})" if m.get("gpu") else "")
             + f"; torch {m['torch']}; {m['date']}. Load average (1 min) "
             f"before {r['load_before']}, after {r['load_after']}. Allocator kept warm (glibc mallopt: freed "
             f"memory is reused, not returned to the OS and page-faulted again): "
             f"{'yes' if r.get('allocator_warm') else 'no'}.", "",
             "## Fusion", "", "| sequence | elements | unfused MB | fused MB | eager ms | compiled ms | speedup "
             "| compile s |", "|---|---|---|---|---|---|---|---|"]
    for kind, f in r["fusion"].items():
        fused = f"{f['fused_s'] * 1e3:.2f}" if "fused_s" in f else "-"
        speed = f"{f['speedup']:.2f}" if "speedup" in f else "-"
        comp = f"{f['compile_s']:.1f}" if "compile_s" in f else "-"
        lines.append(f"| {kind} | {f['numel']:,} | {f['unfused_bytes'] / 1e6:.1f} | {f['fused_bytes'] / 1e6:.1f} "
                     f"| {f['eager_s'] * 1e3:.2f} | {fused} | {speed} | {comp} |")
    s = r["course_step"]
    lines += ["", "## Per-op overhead", "", f"- one trivial op: {r['op_overhead_s'] * 1e6:.2f} µs",
              f"- course model decode step: {s['ops']} ops, {s['step_seconds'] * 1e3:.2f} ms; "
              f"ops x per-op cost = {s['overhead_share']:.0%} of the step"]
    c = r["compile_step"]
    if c:
        lines += [f"- eager {c['eager_s'] * 1e3:.2f} ms vs compiled {c['compiled_s'] * 1e3:.2f} ms "
                  f"({c['speedup']:.2f}x), graph capture alone (backend=eager) "
                  f"{c['captured_s'] * 1e3:.2f} ms ({c['captured_speedup']:.2f}x), "
                  f"cold compile {c['compile_s']:.1f} s "
                  + (f"(repaid after {c['steps_to_repay_compile']:,.0f} steps)" if c["speedup"] > 1
                     else "(never repaid: the compiled step was not faster)")]
    o = r["overlap"]
    lines += ["", "## Overlap", "", f"- matmul {o['compute_s'] * 1e3:.1f} ms, copy {o['copy_s'] * 1e3:.1f} ms, "
              f"sum {o['sum_s'] * 1e3:.1f} ms, side by side {o['together_s'] * 1e3:.1f} ms: "
              + (f"{o['hidden']:.0%} of the shorter job hidden" if o["hidden"] >= 0 else
                 f"nothing hidden (side by side took {o['together_s'] / o['sum_s'] - 1:.0%} longer "
                 "than in sequence)"), "", f"Run time {r['run_seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="'cpu' (default) or 'cuda' to measure a GPU")
    args = p.parse_args(argv)
    try:
        check_device(args.device)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.device != "cpu" and args.out is None:
        print("--device writes another machine's run; pass --out DIR so it does not overwrite the recorded "
              "(CPU) results", file=sys.stderr)
        return 2
    out = results_folder(p, args)
    r = run(args.quick, args.device)
    report = markdown(r)
    write_results(out, "kernels", r, report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
