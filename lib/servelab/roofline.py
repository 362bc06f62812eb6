"""The roofline: when a chip waits on memory, when on arithmetic, and what a decode step costs.

A chip does a fixed number of operations per byte it can fetch from memory
(its *ridge point*). A job's *arithmetic intensity* is the operations it does
per byte it reads. Below the ridge the job waits on memory; above it, on the
arithmetic units. Writing one token for one person reads every weight once and
does about 2 operations per weight, far below the ridge of any modern chip, so
serving batches many people into one read of the weights.

Two halves:

* this module, pure calculators (no torch): intensity, ridge, balance batch, the
  step-time model (weights read + every seat's KV read + a fixed overhead),
  throughput per person and per replica, the lone-request ceiling, people per
  replica;
* :mod:`servelab.roofline_measure`, the measuring harness: :func:`measure`
  (torch imported inside) times memory bandwidth, matmul rates and a decode-step
  sweep on the reader's own machine, with one thread, and :func:`plot_roofline`
  draws a roofline. Also ``python -m servelab.roofline``. Its names are
  importable from here; it never imports this module.

Units: bytes, seconds, operations per second; decimal GB/TB as vendors quote.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from servelab._checks import check_count as _check_count
from servelab._checks import check_fraction as _check_fraction
from servelab._checks import check_non_negative as _check_non_negative
from servelab._checks import check_positive as _check_positive
from servelab._checks import check_tokens as _check_tokens
from servelab import sources as _sources
from servelab.roofline_measure import (  # noqa: F401  (the measuring half, re-exported)
    CLOCKS, LARGE_BATCHES, QUICK_BATCHES, STATISTICS, SWEEP_MODELS, MeasureResult, bf16_units,
    build_sweep_model, check_device, machine_info, main, measure, measure_bandwidth, measure_decode,
    measure_matmul, plot_roofline, recorded_bf16_units,
)
from servelab.timing import time_call  # noqa: F401  (the one timer)

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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
