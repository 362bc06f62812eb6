"""Weights in fewer bits: formats, packed storage, real low-bit kernels, and the damage measured.

A decode step at a small batch reads every weight once and does little
arithmetic with each (chapter 8), so its time follows the bytes of the
weights: half the bytes, about half the time. This module makes that concrete:

* **Formats** (:data:`FORMATS`): symmetric int8 with one scale per output
  channel; int4 with one bf16 scale per group of 32 or 128 weights (codes
  -8..7); MXFP4 (4-bit E2M1 floats, one power-of-two E8M0 scale per 32, the
  OCP Microscaling spec); NVFP4 (E2M1, one FP8 E4M3 scale per 16 plus one
  fp32 scale per tensor). The FP4 formats are exact simulations of their
  rounding (round to nearest, ties to even on the E2M1 grid).
  :func:`bits_per_weight` counts what the scales add.
* **Round trips**: :func:`quantize_weight` returns the codes and scales,
  :func:`dequantize_weight` turns them back, :func:`fake_quantize` does both.
* :class:`QuantizedLinear`: an ``nn.Linear`` replacement that *stores* the
  packed codes (int8 one per byte, 4-bit codes two per byte) and its scales;
  :attr:`QuantizedLinear.nbytes` counts what it really holds. int8 and int4
  run PyTorch's CPU weight-only kernels (``aten._weight_int8pack_mm``,
  ``aten._weight_int4pack_mm_for_cpu``), which read the small codes and
  never materialise a full-precision matrix; MXFP4 and NVFP4 have no CPU
  kernel, so they dequantize the matrix and call an ordinary matmul (the
  bytes held are small, the bytes a step reads are not).
* :func:`quantize_model` swaps a :class:`servelab.model.LlamaModel`'s
  projections (q/k/v/o, gate/up/down) for quantized ones, in place. The
  output head stays in full precision unless ``lm_head=True``. In int8, Q/K/V
  and gate/up are stored as one matrix each (:class:`FusedQuantizedLinears`),
  so a decode step calls the kernel four times per layer, not seven.
* Quality: :func:`perplexity`, :func:`quality_table` (perplexity on the
  corpus's validation split, top-1 agreement and KL divergence against fp32)
  and :func:`outlier_demo` (one large channel and its fixes, rotation included).
* FP8 as a format: :func:`scaled_roundtrip_error` rounds a tensor to fp8
  (E4M3 or E5M2) or int8 with one scale per tensor or per row, the two
  granularities W8A8-FP8 serving uses (per-tensor, or per-channel weights and
  per-token activations).
* :func:`time_projection`: one projection at batch 1 in each format, timed on
  this machine (for a chapter's live cell; never used by a test's assertion).

Each job has its own module, and every name is importable from here:
:mod:`servelab.quant_formats` (formats and bit arithmetic, no torch),
:mod:`servelab.quant_codecs` (rounding, packing, round trips, FP8),
:mod:`servelab.quant_layers` (the quantized layers and :func:`quantize_model`)
and :mod:`servelab.quant_quality` (perplexity, outliers, timing). Importing
this module loads no torch; the first torch name asked for imports its module.
"""
from __future__ import annotations

from servelab._lazy import lazy_exports
from servelab.quant_formats import (  # noqa: F401  (torch-free: loaded at once)
    ALIASES, E4M3_MAX, FORMATS, FP4_E2M1_VALUES, FP4_EMAX, FP4_MAX, INT4_MAX, INT4_MIN, INT8_MAX,
    KERNEL_MAX_ROWS, SCHEMES, Format, bits_per_weight, get_format, memory_bound_step_seconds,
)

#: The names that need torch, by the module that holds them (imported on first use).
_TORCH_NAMES = {
    "quant_codecs": ("round_to_fp4", "_fp4_decode", "pack_nibbles", "unpack_nibbles", "quantize_weight",
                     "dequantize_weight", "fake_quantize", "roundtrip_error", "FP8_FORMATS",
                     "scaled_round_trip", "scaled_roundtrip_error"),
    "quant_layers": ("QuantizedLinear", "FusedQuantizedLinears", "fusable_quantized", "quantize_model",
                     "is_quantized", "linear_weight_bytes", "PROJECTIONS", "INT4PACK_OUT_MULTIPLE",
                     "_low_bit_matmul", "_check_layer"),
    "quant_quality": ("validation_tokens", "perplexity", "QUALITY_VARIANTS", "quality_table", "outlier_demo",
                      "_random_rotation", "outlier_activations", "activation_outlier_errors",
                      "time_projection"),
}

__all__ = [
    "Format", "FORMATS", "SCHEMES", "get_format", "bits_per_weight", "FP4_E2M1_VALUES",
    "round_to_fp4", "quantize_weight", "dequantize_weight", "fake_quantize", "roundtrip_error",
    "pack_nibbles", "unpack_nibbles", "QuantizedLinear", "FusedQuantizedLinears", "fusable_quantized",
    "quantize_model", "is_quantized",
    "linear_weight_bytes", "PROJECTIONS", "perplexity", "validation_tokens", "quality_table",
    "outlier_demo", "memory_bound_step_seconds", "FP8_FORMATS", "scaled_roundtrip_error",
    "time_projection",
]


__getattr__, __dir__ = lazy_exports(__name__, {name: f"servelab.{module}" for module, names in _TORCH_NAMES.items()
                                               for name in names})
