"""Measuring the reader's machine: memory bandwidth, matmul rates and a decode-step sweep.

The measuring half of :mod:`servelab.roofline` (whose calculators need no
machine at all): :func:`measure` times a large copy and a matrix-vector
product (bandwidth), square matrix products (the arithmetic peak) and one
decode step of a random-weight decoder at each batch size, on one thread by
default, and returns a :class:`MeasureResult` that tabulates, plots and saves
them; :func:`plot_roofline` draws a roofline with points on it. Every call is timed by :func:`servelab.timing.time_call`. Torch is
imported inside the functions that measure. Every name is also importable
from :mod:`servelab.roofline`; ``python -m servelab.roofline`` runs :func:`main`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from servelab._checks import check_count as _check_count
from servelab._checks import check_positive as _check_positive
from servelab._checks import check_tokens as _check_tokens
from servelab.timing import CLOCKS, STATISTICS, check_device, time_call

__all__ = [
    "measure", "MeasureResult", "measure_bandwidth", "measure_matmul", "measure_decode",
    "build_sweep_model", "machine_info", "SWEEP_MODELS", "bf16_units", "recorded_bf16_units",
    "QUICK_BATCHES", "LARGE_BATCHES", "STATISTICS", "CLOCKS", "check_device", "main", "plot_roofline",
]


#: Decoder shapes for the decode-step sweep. Both are far bigger than this
#: kind of CPU's caches (tens of MiB), so every step streams its weights from
#: main memory, as a GPU streams them from HBM.
SWEEP_MODELS: dict[str, dict[str, int]] = {
    # ~62M parameters: 250 MB in fp32, 125 MB in bf16
    "quick": dict(vocab_size=8192, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                  num_attention_heads=12, num_key_value_heads=4),
    # ~213M parameters: 850 MB in fp32, 425 MB in bf16 (the speed goals' "200M" model)
    "large": dict(vocab_size=16_000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                  num_attention_heads=16, num_key_value_heads=4),
}
QUICK_BATCHES = (1, 2, 3, 4, 8, 32, 128)
LARGE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


@dataclass
class MeasureResult:
    """What :func:`measure` found: one tidy row per measurement, plus the machine.

    Each row has ``kind`` ('bandwidth', 'matmul' or 'decode'), ``name``,
    ``dtype``, ``batch`` (decode only), ``seconds`` (median), ``bytes`` and
    ``ops`` per run, and the derived ``GB_per_s`` and ``GFLOP_per_s``.
    """

    rows: list[dict[str, Any]]
    machine: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)

    def select(self, kind: str, name: str | None = None, dtype: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["kind"] == kind and (name is None or r["name"] == name)
                and (dtype is None or r["dtype"] == dtype)]

    def value(self, kind: str, name: str, dtype: str, column: str) -> float:
        rows = self.select(kind, name, dtype)
        if not rows:
            raise ValueError(f"no {kind} measurement named {name!r} in {dtype}")
        return rows[0][column]

    @property
    def matvec_bandwidth(self) -> float:
        """Bytes/s a matrix-vector product streams: the fair ceiling for batch-1 decode."""
        return self.value("bandwidth", "matrix-vector", "fp32", "GB_per_s") * 1e9

    def peak_ops(self, dtype: str = "bf16") -> float:
        return self.value("matmul", "matmul", dtype, "GFLOP_per_s") * 1e9

    def decode(self, dtype: str) -> list[dict[str, Any]]:
        return sorted(self.select("decode", dtype=dtype), key=lambda r: r["batch"])

    def step_ms(self, dtype: str, batch: int) -> float:
        for r in self.decode(dtype):
            if r["batch"] == batch:
                return r["seconds"] * 1e3
        raise ValueError(f"batch {batch} was not measured in {dtype}")

    def step_ratio(self, dtype: str, batch: int) -> float:
        """The step at ``batch`` over the step at batch 1: what the extra people cost.

        1.0 means they rode along free; ``batch`` means nothing was shared.
        """
        return self.step_ms(dtype, batch) / self.step_ms(dtype, 1)

    def plot_step_ratios(self, ax=None, title: str | None = None):
        """Each dtype's step(batch) / step(1) against the batch, between 'free' (1) and 'no sharing' (batch)."""
        import matplotlib.pyplot as plt  # only when drawing

        if ax is None:
            _, ax = plt.subplots(figsize=(6.5, 3.6))
        batches = sorted({r["batch"] for r in self.select("decode")})
        if not batches:
            raise ValueError("no decode measurements to plot: run measure() with some batches")
        ax.plot(batches, batches, color="gray", ls="--", lw=1, label="no sharing (cost grows with the batch)")
        ax.plot(batches, [1.0] * len(batches), color="gray", ls=":", lw=1, label="free (cost of batch 1)")
        for dtype, style in (("fp32", "s-"), ("bf16", "o-")):
            rows = self.decode(dtype)
            if rows and rows[0]["batch"] == 1:
                ax.plot([r["batch"] for r in rows], [self.step_ratio(dtype, r["batch"]) for r in rows],
                        style, label=dtype)
        ax.set(xscale="log", yscale="log", xlabel="batch (people in the step)",
               ylabel="step time / step at batch 1")
        ax.set_title(title or f"Decode step cost, one thread: {self.machine.get('cpu', 'CPU')}", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(True, which="major", alpha=0.3)
        return ax

    def table(self, columns: Sequence[str] = ("kind", "name", "dtype", "batch", "ms", "GB_per_s",
                                               "GFLOP_per_s", "tokens_per_s")) -> str:
        """The rows as an aligned text table (rounded for reading)."""
        def fmt(row: dict[str, Any], col: str) -> str:
            if col == "ms":
                return f"{row['seconds'] * 1e3:.2f}"
            v = row.get(col)
            if v is None or v == "":
                return ""
            if isinstance(v, float):
                return f"{v:,.1f}"
            return str(v)
        cells = [list(columns)] + [[fmt(r, c) for c in columns] for r in self.rows]
        widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells)

    def to_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "model": self.model, "rows": self.rows}

    @classmethod
    def load(cls, path) -> "MeasureResult":
        """A result saved as JSON (``python -m servelab.roofline --json``, or the benchmark's
        ``benchmarks/results/roofline.json``): its rows, machine and model; other keys are ignored."""
        import json
        from pathlib import Path

        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or "rows" not in data:
            raise ValueError(f"{path} holds no measurement rows: expected the JSON that measure() or "
                             "benchmarks/bench_roofline.py writes")
        return cls(rows=data["rows"], machine=data.get("machine", {}), model=data.get("model", {}))

    def plot(self, ax=None, title: str | None = None):
        """This machine's roofline (fp32 and bf16 peaks, matrix-vector bandwidth) with decode points."""
        bw = self.matvec_bandwidth
        ax = plot_roofline(self.peak_ops("bf16"), bw, ax=ax, label="bf16 matmul peak", color="tab:red",
                           intensity_range=(0.2, 2000))
        plot_roofline(self.peak_ops("fp32"), bw, ax=ax, label="fp32 matmul peak", color="tab:gray",
                      intensity_range=(0.2, 2000))
        for dtype, marker in (("fp32", "s"), ("bf16", "o")):
            rows = self.decode(dtype)
            if rows:
                ax.loglog([r["intensity"] for r in rows], [r["GFLOP_per_s"] * 1e9 for r in rows], marker + "-",
                          label=f"decode steps, {dtype} (batch {rows[0]['batch']}..{rows[-1]['batch']})")
        ax.set_title(title or f"This machine, one thread: {self.machine.get('cpu', 'CPU')}", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        return ax


def machine_info(threads: int | None = None) -> dict[str, Any]:
    """Platform, CPU model, load, library versions, thread count and the CPU's bf16 units
    (:func:`bf16_units`, which set the start of a bf16 decode curve), for recording results."""
    from servelab.machine import describe

    return {**describe(packages=("torch", "numpy"), threads=threads), "bf16_units": bf16_units()}


def bf16_units(flags: Iterable[str] | None = None) -> str:
    """What does bf16 matrix products on this CPU, from its /proc/cpuinfo flags (or ``flags``).

    'AMX tiles' (Intel's matrix tile units, ``amx_bf16``), 'AVX-512 bf16 dot products'
    (``avx512_bf16``), 'no bf16 units' (products widened to fp32) or 'unknown' where no
    flags can be read.
    """
    if flags is None:
        try:
            text = open("/proc/cpuinfo").read()
        except OSError:
            return "unknown"
        line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
        flags = line.split(":", 1)[1].split() if ":" in line else []
        if not flags:
            return "unknown"
    flags = set(flags)
    if "amx_bf16" in flags:
        return "AMX tiles"
    if "avx512_bf16" in flags:
        return "AVX-512 bf16 dot products"
    return "no bf16 units"


def recorded_bf16_units(machine: Mapping[str, Any]) -> str:
    """The bf16 units of a recorded machine (``MeasureResult.machine``), for a caption.

    Its recorded :func:`bf16_units` where the run recorded them. An older run did not, but an
    AMD CPU has no AMX tiles (AMX is Intel's), so that much is still known; anything more
    (AVX-512 bf16 or none) is not, and the answer says 'not recorded'.
    """
    if not isinstance(machine, Mapping):
        raise TypeError(f"machine must be a mapping (MeasureResult.machine), got {type(machine).__name__}")
    if machine.get("bf16_units"):
        return str(machine["bf16_units"])
    if "amd" in str(machine.get("cpu", "")).lower():
        return "no AMX tiles (an AMD CPU)"
    return "not recorded"


def plot_roofline(peak_ops: float, bandwidth: float, points: Iterable[tuple[float, float, str]] = (),
                  ax=None, label: str = "roofline", intensity_range: tuple[float, float] | None = None,
                  title: str | None = None, color: str = "black"):
    """Draw a roofline (log-log) and optional measured/model points on it.

    ``points`` are ``(intensity ops/byte, achieved ops/s, label)``. Returns the
    matplotlib Axes; matplotlib is imported here, not at module import.
    """
    import matplotlib.pyplot as plt  # only when drawing
    import numpy as np

    _check_positive("peak_ops", peak_ops)
    _check_positive("bandwidth", bandwidth)
    points = list(points)
    ridge = peak_ops / bandwidth
    lo, hi = intensity_range or (min([0.25, ridge / 100] + [p[0] / 2 for p in points]),
                                 max([ridge * 20] + [p[0] * 2 for p in points]))
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    ax.loglog(x, np.minimum(peak_ops, x * bandwidth), color=color, lw=2, label=label)
    ax.axvline(ridge, color=color, ls=":", lw=1)
    ax.annotate(f"ridge {ridge:,.0f} ops/B", (ridge, peak_ops), textcoords="offset points",
                xytext=(5, -14), fontsize=8, color=color)
    markers = "osD^v<>ph*"
    for i, (intensity, achieved, text) in enumerate(points):
        ax.loglog([intensity], [achieved], markers[i % len(markers)], label=text)
    ax.set_xlabel("arithmetic intensity (operations per byte)")
    ax.set_ylabel("operations per second")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="major", alpha=0.3)
    return ax




def _row(kind: str, name: str, dtype: str, seconds: float, nbytes: float = 0.0, ops: float = 0.0,
         batch: int | None = None, **extra: Any) -> dict[str, Any]:
    row = {"kind": kind, "name": name, "dtype": dtype, "batch": batch, "seconds": seconds,
           "bytes": nbytes, "ops": ops, "GB_per_s": nbytes / seconds / 1e9 if nbytes else None,
           "GFLOP_per_s": ops / seconds / 1e9 if ops else None}
    row.update(extra)
    return row


def measure_bandwidth(size_mb: int = 512, repeats: int = 5, statistic: str = "median",
                      device: str = "cpu", clock: str = "wall") -> list[dict[str, Any]]:
    """Memory bandwidth two ways: a large copy (read + write) and a matrix-vector product (read)."""
    import torch

    _check_count("size_mb", size_mb)
    device = check_device(device)
    n = size_mb * 1_000_000 // 4
    src = torch.full((n,), 0.5, device=device)  # values do not matter; filling beats random numbers
    dst = torch.empty_like(src)
    copy_s = time_call(lambda: dst.copy_(src), repeats, statistic=statistic, device=device, clock=clock)
    del dst
    side = int(math.sqrt(n))
    w = src[: side * side].view(side, side)
    x = torch.full((side,), 0.5, device=device)
    mv_s = time_call(lambda: torch.mv(w, x), repeats, statistic=statistic, device=device, clock=clock)
    return [_row("bandwidth", "copy (read+write)", "fp32", copy_s, nbytes=2 * src.numel() * 4),
            _row("bandwidth", "matrix-vector", "fp32", mv_s, nbytes=side * side * 4, ops=2 * side * side)]


def measure_matmul(n: int = 2048, dtypes: Sequence[str] = ("fp32", "bf16"), repeats: int = 5,
                   statistic: str = "median", device: str = "cpu", clock: str = "wall") -> list[dict[str, Any]]:
    """Square matrix-product rate per format: the machine's arithmetic peak in practice."""
    import torch

    _check_count("n", n)
    device = check_device(device)
    rows = []
    for dtype in dtypes:
        tdt = _torch_dtype(dtype)
        a = torch.rand(n, n, device=device, dtype=tdt)   # made on the device, not copied there
        b = torch.rand(n, n, device=device, dtype=tdt)
        s = time_call(lambda: torch.mm(a, b), repeats, statistic=statistic, device=device, clock=clock)
        rows.append(_row("matmul", "matmul", dtype, s, nbytes=3 * n * n * a.element_size(), ops=2.0 * n ** 3))
    return rows


def _torch_dtype(name: str):
    import torch

    table = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"measurements run in 'fp32' or 'bf16', got {name!r}")
    return table[name]


def build_sweep_model(size: str | Mapping[str, int] = "quick", dtype: str = "fp32", seed: int = 0,
                      device: str = "cpu"):
    """A random-weight Llama-style decoder (servelab.model) for timing decode steps.

    Its Q/K/V and gate/up projections are fused (``LlamaModel.fuse_projections``),
    as in a serving engine: a decode step streams its weights in fewer, longer
    matrix-vector products. Built on the CPU, then moved to ``device``.
    """
    import torch

    from servelab.model import LlamaConfig, LlamaModel

    shape = SWEEP_MODELS.get(size) if isinstance(size, str) else dict(size)
    if shape is None:
        raise ValueError(f"unknown sweep model {size!r}; choose from {sorted(SWEEP_MODELS)} or pass a shape dict")
    config = LlamaConfig(max_position_embeddings=4096, **shape)
    with torch.device("cpu"):
        model = LlamaModel(config).init_weights(seed=seed)
    return model.to(check_device(device), _torch_dtype(dtype)).eval().fuse_projections()


def measure_decode(model, batches: Sequence[int] = QUICK_BATCHES, context_tokens: int = 32, repeats: int = 5,
                   progress: Callable[[], None] | None = None, statistic: str = "median",
                   clock: str = "wall") -> list[dict[str, Any]]:
    """Median time of one decode step at each batch size, with ``context_tokens`` already cached.

    The cache is filled with random keys and values (no prefill needed) and
    cropped back after every step, so each timed step is the same step.
    ``GB_per_s`` counts the bytes a step really reads: every weight except the
    embedding table (a step looks up one row of it; a tied table is read whole,
    as the output head) plus the cached K and V.
    """
    import torch

    _check_tokens("context_tokens", context_tokens)
    params = sum(p.numel() for p in model.parameters())
    embed = model.embed_tokens.weight.numel()
    tied = model.config.tie_word_embeddings
    matmul_params = params - embed + (embed if tied else 0)
    elem = next(model.parameters()).element_size()
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}[next(model.parameters()).dtype]
    weight_bytes_read = (params - (0 if tied else embed)) * elem
    from servelab.kernels_measure import decode_step  # the one repeatable decode step

    rows = []
    device = str(next(model.parameters()).device)
    for batch in batches:
        _check_count("batch", batch)
        step = decode_step(model, batch, context_tokens)
        seconds = time_call(step, repeats, statistic=statistic, device=device, clock=clock)
        kv_bytes = 2 * step.cache.k[:, :, :, :context_tokens + 1].numel() * elem
        ops = 2.0 * matmul_params * batch
        rows.append(_row("decode", "decode step", dtype, seconds, nbytes=weight_bytes_read + kv_bytes, ops=ops,
                         batch=batch, tokens_per_s=batch / seconds,
                         intensity=ops / (weight_bytes_read + kv_bytes), kv_bytes=kv_bytes, params=params))
        del step
        if progress:
            progress()
    return rows


def measure(quick: bool = True, threads: int = 1, dtypes: Sequence[str] = ("fp32", "bf16"),
            batches: Sequence[int] | None = None, repeats: int | None = None, context_tokens: int = 32,
            progress: bool = True, model: str | Mapping[str, int] | None = None,
            bandwidth_mb: int | None = None, matmul_n: int = 2048, statistic: str = "median",
            device: str = "cpu", clock: str = "wall") -> MeasureResult:
    """Measure this machine: bandwidth, matmul rates and a decode-step sweep, on ``threads`` threads.

    ``device="cuda"`` measures the GPU instead (its memory, its matmul rates, the
    decoder on it; ``threads`` then only sets the CPU threads that launch the work).
    The CPU stays the default. ``clock="cpu"`` (one thread only) times with the
    process's CPU time, for machines shared with more runnable work than cores.

    ``quick=True`` (default) uses a ~62M-parameter decoder and seven batch
    sizes, under a minute on one laptop core; ``quick=False`` the ~213M one and
    fourteen batch sizes. One thread by default: results repeat within a few
    percent, and a GPU's single memory system is the thing being imitated.
    ``model`` (a :data:`SWEEP_MODELS` name or a shape dict), ``bandwidth_mb``
    and ``matmul_n`` override the sizes (the tests use tiny ones). ``statistic="min"``
    reports the fastest repeat instead of the median, for machines shared with other work.
    """
    import torch

    _check_count("threads", threads)
    device = check_device(device)
    if clock == "cpu" and threads != 1:
        raise ValueError(f"clock='cpu' adds up every thread's CPU time; use threads=1, got {threads}")
    batches = tuple(batches or (QUICK_BATCHES if quick else LARGE_BATCHES))
    repeats = repeats or (5 if quick else 7)
    size = model if model is not None else ("quick" if quick else "large")
    shape = SWEEP_MODELS.get(size) if isinstance(size, str) else dict(size)
    if shape is None:
        raise ValueError(f"unknown sweep model {size!r}; choose from {sorted(SWEEP_MODELS)} or pass a shape dict")
    bandwidth_mb = bandwidth_mb or (512 if quick else 1024)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    bar = None
    try:
        total = 2 + len(dtypes) * (1 + len(batches))
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=total, desc="measuring", leave=False)
        tick = bar.update if bar is not None else (lambda n=1: None)
        rows = measure_bandwidth(bandwidth_mb, repeats, statistic, device=device, clock=clock)
        tick()
        rows += measure_matmul(matmul_n, dtypes, repeats, statistic, device=device, clock=clock)
        tick()
        model_info: dict[str, Any] = {"size": size if isinstance(size, str) else "custom",
                                      "context_tokens": context_tokens, "shape": shape,
                                      "statistic": statistic, "repeats": repeats, "device": device,
                                      "clock": clock}
        for dtype in dtypes:
            decoder = build_sweep_model(shape, dtype, device=device)
            model_info["params"] = sum(p.numel() for p in decoder.parameters())
            tick()
            rows += measure_decode(decoder, batches, context_tokens, repeats, progress=tick, statistic=statistic,
                                   clock=clock)
            del decoder
        info = machine_info(threads)
        if device.startswith("cuda"):
            info["device"] = torch.cuda.get_device_name(device)
        return MeasureResult(rows=rows, machine=info, model=model_info)
    finally:
        if bar is not None:
            bar.close()
        torch.set_num_threads(old_threads)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m servelab.roofline [--large] [--threads N] [--plot FILE] [--json FILE]``."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m servelab.roofline",
                                     description="Measure this machine's memory bandwidth, matmul rates "
                                                 "and decode steps, and draw its roofline.")
    parser.add_argument("--large", action="store_true", help="the ~213M-parameter decoder and more batch sizes")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="cpu", help="'cpu' (default) or 'cuda' to measure a GPU")
    parser.add_argument("--plot", metavar="FILE", help="save the roofline plot (PNG)")
    parser.add_argument("--json", metavar="FILE", help="save the rows and machine as JSON")
    args = parser.parse_args(argv)
    result = measure(quick=not args.large, threads=args.threads, device=args.device)
    print(result.machine)
    print(result.table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_dict(), f, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        ax = result.plot()
        ax.figure.savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
