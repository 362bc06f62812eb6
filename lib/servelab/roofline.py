"""The roofline: when a chip waits on memory, when on arithmetic, and what a decode step costs.

A chip does a fixed number of operations per byte it can fetch from memory
(its *ridge point*). A job's *arithmetic intensity* is the operations it does
per byte it reads. Below the ridge the job waits on memory; above it, on the
arithmetic units. Writing one token for one person reads every weight once and
does about 2 operations per weight, far below the ridge of any modern chip, so
serving batches many people into one read of the weights.

This module has two halves:

* pure calculators (no torch): intensity, ridge, balance batch, the step-time
  model (weights read + every seat's KV read + a fixed overhead), throughput per
  person and per replica, the lone-request ceiling, people per replica, and a
  roofline plot helper;
* :func:`measure` (torch imported inside): memory bandwidth, matmul rates and a
  decode-step sweep on the reader's own machine, with one thread. Also
  ``python -m servelab.roofline``.

Units: bytes, seconds, operations per second; decimal GB/TB as vendors quote.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from servelab._checks import check_count as _check_count
from servelab._checks import check_fraction as _check_fraction
from servelab._checks import check_non_negative as _check_non_negative
from servelab._checks import check_positive as _check_positive
from servelab._checks import check_tokens as _check_tokens
from servelab import sources as _sources
from servelab.kvcache import kv_bytes_per_token, kv_room_bytes, seats_granted
from servelab.specs import GB, TB, Chip, get_chip, get_model

__all__ = [
    "DEFAULT_BANDWIDTH_EFFICIENCY", "DEFAULT_COMPUTE_EFFICIENCY", "DEFAULT_STEP_OVERHEAD_S",
    "MemoryTier", "MEMORY_TIERS", "ops_per_byte", "decode_intensity", "prefill_intensity",
    "ridge_point", "balance_batch", "attainable_ops", "decode_step_seconds",
    "per_person_tokens_per_s", "replica_tokens_per_s", "lone_request_tokens_per_s",
    "people_per_replica", "Replica", "EXAMPLE_REPLICA", "RequestStages", "request_stages",
    "plot_roofline",
    "measure", "MeasureResult", "measure_bandwidth", "measure_matmul", "measure_decode",
    "build_sweep_model", "machine_info", "SWEEP_MODELS", "bf16_units", "recorded_bf16_units",
]

#: The 200B running example's efficiencies: decode reaches 60% of peak memory
#: bandwidth, prefill 50% of peak arithmetic. Typical of tuned kernels; an
#: assumption, not a measurement.
DEFAULT_BANDWIDTH_EFFICIENCY = 0.6
DEFAULT_COMPUTE_EFFICIENCY = 0.5
#: Fixed cost per decode step (kernel launches, all-reduce latencies, the
#: scheduler, sampling). The 200B running example charges 2 ms per step.
DEFAULT_STEP_OVERHEAD_S = 0.002


# ---------------------------------------------------------------------------
# Memory tiers (chapter 8's ladder)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryTier:
    """One rung of the memory ladder: how much it holds and how fast it feeds the chip."""

    name: str
    capacity_bytes: float | None
    bandwidth: float | None  # bytes per second; None where no single number is published
    note: str
    source: str


def _h100_sram_bytes() -> float:
    """An H100's on-chip SRAM: per-SM registers and L1/shared times its SMs, plus the L2.

    A sum of the whitepaper's figures (:mod:`servelab.sources`), not a published total:
    132 x (256 + 256) KiB + 50 MiB = 121.6 MB.
    """
    per_sm = _sources.value("h100_register_file_per_sm") + _sources.value("h100_l1_shared_per_sm")
    return _sources.value("h100_sxm_sms") * per_sm + _sources.value("h100_l2_cache")


MEMORY_TIERS: tuple[MemoryTier, ...] = (
    MemoryTier("on-chip SRAM (H100: registers + shared/L1 + L2)", _h100_sram_bytes(), None,
               "the sum of the whitepaper's per-SM figures (256 KB of registers and 256 KB of L1/shared "
               "memory on each of 132 SMs) plus the 50 MB L2; no single total is published. Far "
               "faster than HBM but tiny", _sources.cite("h100_sxm_sms")),
    MemoryTier("HBM (B200)", 192 * GB, 8 * TB, "stacked DRAM beside the compute die",
               get_chip("B200").source),
    MemoryTier("host memory over PCIe 5.0 x16", None, 64 * GB,
               "the server's main memory, reached over the PCIe link",
               "PCI-SIG PCIe 5.0 specification: 32 GT/s per lane, ~64 GB/s per direction for x16"),
    MemoryTier("NVMe SSD", None, 14 * GB, "about 7 GB/s (PCIe 4.0) to 14 GB/s (PCIe 5.0) per drive",
               "vendor data sheets of PCIe 4.0/5.0 NVMe drives (e.g. Samsung 990 PRO, 9100 PRO)"),
)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------











# ---------------------------------------------------------------------------
# Intensity and the ridge
# ---------------------------------------------------------------------------

def ops_per_byte(chip: Chip | str, dtype: str = "fp8") -> float:
    """Peak operations per byte of memory traffic: B200 at 8 bits = 4.5e15 / 8e12 = 562.5."""
    return get_chip(chip).ops_per_byte(dtype)


def decode_intensity(batch: int = 1, bytes_per_param: float = 1.0, kv_bytes_per_seat: float = 0.0,
                     params: float | None = None) -> float:
    """Operations per byte read by one decode step serving ``batch`` people.

    Each weight is read once per step and used once per person (a multiply and
    an add), so the intensity is ``2 x batch / bytes_per_param``: 2 at batch 1
    and 8 bits. If ``kv_bytes_per_seat`` and ``params`` are given, every seat's
    cache read is added to the bytes, which caps the intensity however large the
    batch grows.
    """
    _check_count("batch", batch)
    _check_positive("bytes_per_param", bytes_per_param)
    _check_non_negative("kv_bytes_per_seat", kv_bytes_per_seat)
    if not kv_bytes_per_seat:
        return 2.0 * batch / bytes_per_param
    if params is None:
        raise ValueError("with kv_bytes_per_seat, pass params= (the weight count) to weigh the two reads")
    _check_positive("params", params)
    return 2.0 * params * batch / (params * bytes_per_param + batch * kv_bytes_per_seat)


def prefill_intensity(prompt_tokens: int, bytes_per_param: float = 1.0) -> float:
    """Operations per weight byte while reading a prompt: every weight serves every prompt token."""
    _check_count("prompt_tokens", prompt_tokens)
    _check_positive("bytes_per_param", bytes_per_param)
    return 2.0 * prompt_tokens / bytes_per_param


def ridge_point(chip: Chip | str, dtype: str = "fp8", compute_efficiency: float = 1.0,
                bandwidth_efficiency: float = 1.0) -> float:
    """Operations per byte where the chip turns from memory-bound to compute-bound.

    With both efficiencies at 1 this is the spec-sheet :func:`ops_per_byte`; the
    efficiencies say how much of each peak real kernels reach.
    """
    _check_fraction("compute_efficiency", compute_efficiency)
    _check_fraction("bandwidth_efficiency", bandwidth_efficiency)
    c = get_chip(chip)
    return c.peak_flops(dtype) * compute_efficiency / (c.hbm_bandwidth * bandwidth_efficiency)


def balance_batch(chip: Chip | str, dtype: str = "fp8", bytes_per_param: float = 1.0,
                  compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY,
                  bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY) -> float:
    """The batch at which decode's intensity (2 x B / bytes per param) reaches the ridge.

    Below it, extra people ride along almost free; above it, each one adds
    arithmetic time. B200 at 8 bits, 50% arithmetic and 60% bandwidth:
    4.5e15 x 0.5 / (8e12 x 0.6) / 2 = 234 people (weights only; KV reads
    ignored, as in the running example's figure).
    """
    _check_positive("bytes_per_param", bytes_per_param)
    return ridge_point(chip, dtype, compute_efficiency, bandwidth_efficiency) * bytes_per_param / 2.0


def attainable_ops(intensity: float, peak_ops: float, bandwidth: float) -> float:
    """The roofline itself: min(peak, intensity x bandwidth) operations per second."""
    _check_positive("intensity", intensity)
    _check_positive("peak_ops", peak_ops)
    _check_positive("bandwidth", bandwidth)
    return min(peak_ops, intensity * bandwidth)


# ---------------------------------------------------------------------------
# The step-time model
# ---------------------------------------------------------------------------

def decode_step_seconds(weights_bytes: float, kv_bytes_per_token: float, batch: int, context_tokens: int,
                        bandwidth: float, bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY,
                        overhead_s: float = DEFAULT_STEP_OVERHEAD_S) -> float:
    """One decode step: read the weights once and every seat's whole cache, plus overhead.

    ``(weights + batch x context x kv_bytes_per_token) / (bandwidth x efficiency)
    + overhead``. ``bandwidth`` is the whole replica's (chips x per-chip). The
    200B running example: (200 GB + 128 x 8,000 x 163,840 B) / (64 TB/s x 0.6) + 2 ms
    = 11.6 ms. Memory-bound by construction; :class:`Replica` also checks the
    arithmetic.
    """
    _check_positive("weights_bytes", weights_bytes)
    _check_positive("kv_bytes_per_token", kv_bytes_per_token)
    _check_count("batch", batch)
    _check_tokens("context_tokens", context_tokens)
    _check_positive("bandwidth", bandwidth)
    _check_fraction("bandwidth_efficiency", bandwidth_efficiency)
    _check_non_negative("overhead_s", overhead_s)
    bytes_read = weights_bytes + batch * context_tokens * kv_bytes_per_token
    return bytes_read / (bandwidth * bandwidth_efficiency) + overhead_s


def per_person_tokens_per_s(step_s: float) -> float:
    """Each person gets one token per step: 1 / step."""
    _check_positive("step_s", step_s)
    return 1.0 / step_s


def replica_tokens_per_s(batch: int, step_s: float) -> float:
    """The replica writes one token for each of ``batch`` people per step: batch / step."""
    _check_count("batch", batch)
    return batch * per_person_tokens_per_s(step_s)


def lone_request_tokens_per_s(weights_bytes: float, bandwidth: float, efficiency: float = 1.0) -> float:
    """The fastest one request can stream: every token re-reads all the weights.

    70B parameters in bf16 = 140 GB over 3.35 TB/s -> about 24 tokens/s, no
    matter how many operations per second the card offers.
    """
    _check_positive("weights_bytes", weights_bytes)
    _check_positive("bandwidth", bandwidth)
    _check_fraction("efficiency", efficiency)
    return bandwidth * efficiency / weights_bytes


def people_per_replica(free_bytes: float, kv_bytes_per_token: float, context_tokens: int) -> int:
    """How many conversations of ``context_tokens`` fit in ``free_bytes`` of KV room (rounded down)."""
    _check_positive("free_bytes", free_bytes)
    _check_positive("kv_bytes_per_token", kv_bytes_per_token)
    _check_count("context_tokens", context_tokens)
    return seats_granted(free_bytes, kv_bytes_per_token, context_tokens)


@dataclass(frozen=True)
class Replica:
    """One serving replica: chips, weights, cache cost per token, and the efficiency assumptions.

    The 200B running example is :data:`EXAMPLE_REPLICA`: 8 B200s holding a
    200B model at 8 bits (200 GB) with an 8-bit cache of 163,840 B per token.
    Free memory for the cache is ``(chips x usable memory - weights) x (1 -
    kv_margin)``, the same rule as the KV calculator of chapter 11.
    """

    chip: Chip
    num_chips: int
    num_params: float
    weights_bytes: float
    kv_bytes_per_token: float
    dtype: str = "fp8"  # the arithmetic format, for the compute rate
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    kv_margin: float = 0.05

    def __post_init__(self) -> None:
        object.__setattr__(self, "chip", get_chip(self.chip))
        _check_count("num_chips", self.num_chips)
        _check_positive("num_params", self.num_params)
        _check_positive("weights_bytes", self.weights_bytes)
        _check_positive("kv_bytes_per_token", self.kv_bytes_per_token)
        _check_fraction("bandwidth_efficiency", self.bandwidth_efficiency)
        _check_fraction("compute_efficiency", self.compute_efficiency)
        _check_non_negative("overhead_s", self.overhead_s)
        self.chip.peak_flops(self.dtype)  # raises on an unknown format

    @classmethod
    def for_model(cls, model, chip: Chip | str, num_chips: int, weight_dtype: str = "fp8",
                  cache_dtype: str = "fp8", num_params: float | None = None, **kwargs: Any) -> "Replica":
        """Build from a registry model: headline parameters, weights and KV bytes per token."""
        from servelab.arith import bytes_per_param  # local: arith imports nothing from here

        config = get_model(model)
        params = num_params if num_params is not None else config.nominal_params
        if params is None:
            raise ValueError(f"{config.name} has no nominal_params; pass num_params=")
        return cls(chip=get_chip(chip), num_chips=num_chips, num_params=params,
                   weights_bytes=params * bytes_per_param(weight_dtype),
                   kv_bytes_per_token=kv_bytes_per_token(config, cache_dtype),
                   dtype=kwargs.pop("dtype", weight_dtype), **kwargs)

    def with_(self, **changes: Any) -> "Replica":
        return replace(self, **changes)

    # -- the machine ---------------------------------------------------
    @property
    def bandwidth(self) -> float:
        """Peak memory bandwidth of all chips together."""
        return self.num_chips * self.chip.hbm_bandwidth

    @property
    def peak_ops(self) -> float:
        return self.num_chips * self.chip.peak_flops(self.dtype)

    @property
    def free_bytes(self) -> float:
        """KV room: usable memory minus weights, less the margin."""
        return kv_room_bytes(self.num_chips * self.chip.usable_memory_bytes, self.weights_bytes, self.kv_margin)

    @property
    def balance_batch(self) -> float:
        return balance_batch(self.chip, self.dtype, self.weights_bytes / self.num_params,
                             self.compute_efficiency, self.bandwidth_efficiency)

    # -- one step --------------------------------------------------------
    def memory_seconds(self, batch: int, context_tokens: int) -> float:
        """Time to read the weights and every seat's cache at the bandwidth efficiency."""
        return decode_step_seconds(self.weights_bytes, self.kv_bytes_per_token, batch, context_tokens,
                                   self.bandwidth, self.bandwidth_efficiency, overhead_s=0.0)

    def compute_seconds(self, batch: int) -> float:
        """Time for the arithmetic: 2 x parameters per person at the compute efficiency."""
        _check_count("batch", batch)
        return 2.0 * self.num_params * batch / (self.peak_ops * self.compute_efficiency)

    def step_seconds(self, batch: int, context_tokens: int) -> float:
        """Overhead + the slower of reading memory and doing the arithmetic.

        Below the balance batch the memory term wins and this is exactly the
        running example's model; above it the arithmetic takes over.
        """
        return self.overhead_s + max(self.memory_seconds(batch, context_tokens), self.compute_seconds(batch))

    def compute_knee(self, context_tokens: int) -> int | None:
        """The first batch whose arithmetic outlasts its memory reads at ``context_tokens``.

        Unlike :attr:`balance_batch` (weights only), each person's cache read is
        counted, so the knee lands right of the balance batch and moves away as
        contexts grow; ``None`` when the cache reads grow at least as fast as the
        arithmetic, so memory always wins. Whether that many caches fit is a
        separate question: compare with :meth:`people`.
        """
        _check_count("context_tokens", context_tokens)
        bw = self.bandwidth * self.bandwidth_efficiency
        per_person = (2.0 * self.num_params / (self.peak_ops * self.compute_efficiency)
                      - self.kv_bytes_per_token * context_tokens / bw)
        if per_person <= 0:
            return None
        b = max(1, int(self.weights_bytes / bw / per_person))
        while b > 1 and self.compute_seconds(b - 1) > self.memory_seconds(b - 1, context_tokens):
            b -= 1  # float rounding of the closed form, either way
        while self.compute_seconds(b) <= self.memory_seconds(b, context_tokens):
            b += 1
        return b

    def per_person_tokens_per_s(self, batch: int, context_tokens: int) -> float:
        return per_person_tokens_per_s(self.step_seconds(batch, context_tokens))

    def replica_tokens_per_s(self, batch: int, context_tokens: int) -> float:
        return replica_tokens_per_s(batch, self.step_seconds(batch, context_tokens))

    def people(self, context_tokens: int) -> int:
        """People whose caches fit at once at ``context_tokens`` each."""
        return people_per_replica(self.free_bytes, self.kv_bytes_per_token, context_tokens)

    def lone_request_tokens_per_s(self) -> float:
        """The one-person ceiling, including the efficiency and overhead of a step."""
        return per_person_tokens_per_s(self.step_seconds(1, 0))

    def summary(self, batch: int, context_tokens: int) -> dict[str, float]:
        step = self.step_seconds(batch, context_tokens)
        return {"batch": batch, "context_tokens": context_tokens, "step_ms": step * 1e3,
                "memory_ms": self.memory_seconds(batch, context_tokens) * 1e3,
                "compute_ms": self.compute_seconds(batch) * 1e3,
                "per_person_tok_s": 1.0 / step, "replica_tok_s": batch / step,
                "people_that_fit": self.people(context_tokens) if context_tokens else float("inf")}


def _example_replica() -> Replica:
    config = get_model("Example-200B")
    return Replica(chip=get_chip("B200"), num_chips=8, num_params=config.nominal_params,
                   weights_bytes=config.nominal_params * 1.0,  # 8-bit weights: 1 byte each
                   kv_bytes_per_token=kv_bytes_per_token(config, "fp8"), dtype="fp8")


#: The 200B running example: a 200B model at 8 bits on one 8-chip B200 box.
EXAMPLE_REPLICA = _example_replica()


# ---------------------------------------------------------------------------
# One request's model time, stage by stage
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RequestStages:
    """Model time of one request on a replica: one prefill, then a decode step per further token.

    ``prefill_s`` is the first token's model time (prefill writes it); every
    later token costs one decode step, and a step grows with the context, so
    ``first_step_s`` (at the prompt's length) and ``last_step_s`` bracket them.
    Network, queueing and the HTTP layer are not in it.
    """

    prompt_tokens: int
    cached_tokens: int
    reply_tokens: int
    batch: int
    prefill_s: float
    first_step_s: float
    last_step_s: float
    decode_s: float

    @property
    def mean_step_s(self) -> float:
        """The average decode step (0 when the reply is one token: prefill wrote it)."""
        steps = self.reply_tokens - 1
        return self.decode_s / steps if steps else 0.0

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def request_stages(replica: Replica, prompt_tokens: int, reply_tokens: int, batch: int = 1,
                   config=None, cached_tokens: int = 0) -> RequestStages:
    """Prefill and decode time of one request on ``replica`` at its efficiency assumptions.

    Prefill is one pass over the prompt's uncached tokens: the step overhead
    plus the slower of its arithmetic (:func:`servelab.arith.prefill_ops` at
    the replica's compute efficiency; ``config`` adds attention work) and one
    read of the weights. Each of the ``reply_tokens - 1`` later tokens is one
    :meth:`Replica.step_seconds` shared by ``batch`` requests, all assumed at
    this request's context, which grows by one token a step. Llama 3 8B in
    bf16 on one H100 SXM (60% bandwidth, 50% arithmetic, 2 ms a step), a
    3,000-token prompt: prefill about 0.1 s, then about 10 ms a token alone.
    """
    from servelab.arith import prefill_ops  # local: arith imports nothing from here

    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servelab.roofline.Replica, got {type(replica).__name__}")
    _check_count("prompt_tokens", prompt_tokens)
    _check_count("reply_tokens", reply_tokens)
    _check_count("batch", batch)
    if isinstance(cached_tokens, bool) or not isinstance(cached_tokens, int) \
            or not 0 <= cached_tokens < prompt_tokens:
        raise ValueError(f"cached_tokens must be a whole number in [0, prompt_tokens={prompt_tokens}) "
                         f"(at least one prompt token is computed), got {cached_tokens!r}")
    config = get_model(config) if config is not None else None
    ops = prefill_ops(replica.num_params, prompt_tokens, config, cached_tokens=cached_tokens)
    arithmetic_s = ops / (replica.peak_ops * replica.compute_efficiency)
    weights_s = replica.weights_bytes / (replica.bandwidth * replica.bandwidth_efficiency)
    prefill_s = replica.overhead_s + max(arithmetic_s, weights_s)
    steps = [replica.step_seconds(batch, prompt_tokens + i) for i in range(1, reply_tokens)]
    return RequestStages(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
                         reply_tokens=reply_tokens, batch=batch, prefill_s=prefill_s,
                         first_step_s=steps[0] if steps else 0.0,
                         last_step_s=steps[-1] if steps else 0.0, decode_s=sum(steps))


# ---------------------------------------------------------------------------
# Plotting
# ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------
# Measuring the reader's machine (torch imported inside)
# ---------------------------------------------------------------------------

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


STATISTICS = ("median", "min")
CLOCKS = ("wall", "cpu")


def check_device(device: str = "cpu") -> str:
    """``device`` as torch spells it ("cpu", "cuda", "cuda:1", or a ``torch.device``); a GPU must be present.

    Returns the device as a string. Anything else (a typo, "gpu", "mps") is a ValueError naming the choices.
    """
    import torch

    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"measurements run on 'cpu' or 'cuda' ('cuda:N'), got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but this machine has no CUDA GPU that torch can use; "
                         "measure on device='cpu'")
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA GPU(s); "
                         "use 'cuda' or a smaller index")
    return device


def _synchronizer(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1, statistic: str = "median",
                    device: str = "cpu", clock: str = "wall") -> float:
    """Median (default) or minimum of ``repeats`` timed calls after ``warmup`` untimed ones.

    The minimum estimates an undisturbed run on a machine shared with other work:
    interference only ever adds time. On a GPU (``device`` "cuda...") each call is
    followed by a synchronize, so the time is the kernels' and not their launch.
    ``clock="cpu"`` times with this process's CPU time instead of the wall clock:
    on a machine shared with more runnable work than cores, the wall clock counts
    the time other processes ran; CPU time counts only this one's (one thread only).
    """
    import statistics

    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if clock == "cpu" and device != "cpu":
        raise ValueError("clock='cpu' times CPU work; time a GPU with clock='wall'")
    now = time.perf_counter if clock == "wall" else time.process_time
    sync = _synchronizer(device)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = now()
        fn()
        sync()
        times.append(now() - t0)
    return statistics.median(times) if statistic == "median" else min(times)


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
    copy_s = _median_seconds(lambda: dst.copy_(src), repeats, statistic=statistic, device=device, clock=clock)
    del dst
    side = int(math.sqrt(n))
    w = src[: side * side].view(side, side)
    x = torch.full((side,), 0.5, device=device)
    mv_s = _median_seconds(lambda: torch.mv(w, x), repeats, statistic=statistic, device=device, clock=clock)
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
        s = _median_seconds(lambda: torch.mm(a, b), repeats, statistic=statistic, device=device, clock=clock)
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
    rows = []
    device = str(next(model.parameters()).device)
    g = torch.Generator(device=device).manual_seed(0)
    for batch in batches:
        _check_count("batch", batch)
        cache = model.new_cache(batch_size=batch, max_len=context_tokens + 1)
        cache.k.normal_(generator=g)
        cache.v.normal_(generator=g)
        cache.advance(context_tokens)
        ids = torch.randint(0, model.config.vocab_size, (batch, 1), generator=g, device=device)

        def step():
            with torch.inference_mode():
                model(ids, cache=cache)
            cache.crop(context_tokens)

        seconds = _median_seconds(step, repeats, statistic=statistic, device=device, clock=clock)
        kv_bytes = 2 * cache.k[:, :, :, :context_tokens + 1].numel() * elem
        ops = 2.0 * matmul_params * batch
        rows.append(_row("decode", "decode step", dtype, seconds, nbytes=weight_bytes_read + kv_bytes, ops=ops,
                         batch=batch, tokens_per_s=batch / seconds,
                         intensity=ops / (weight_bytes_read + kv_bytes), kv_bytes=kv_bytes, params=params))
        del cache
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
