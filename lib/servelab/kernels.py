"""Kernels: what happens between the big matrix products, counted and measured.

A decode step is a few large matrix products and many small operations around
them (norms, residual adds, activations, rotations, sampling). This module
makes the costs of the small ones concrete:

* **Fusion** (:data:`SEQUENCES`, :func:`bytes_moved`, :func:`fusion_measurement`):
  each unfused element-wise operation reads its inputs from memory and writes
  its output back; a fused kernel reads the original inputs once and writes
  only what is needed afterwards. RMSNorm with its residual add, and SwiGLU,
  counted and timed eager vs ``torch.compile``.
* **Per-op overhead** (:func:`op_overhead_seconds`, :func:`count_ops`,
  :func:`step_overhead`): the fixed cost of launching one operation, the
  number of operations in a decode step, and the share of the step they take.
  :func:`compile_step` times the same step eager and under ``torch.compile``
  (compilation: captured Python, fused ops, generated kernels; not CUDA graphs,
  which replay recorded launches), compile time included.
* **FlashAttention's tiling** (:func:`flash_attention`, :func:`tile_bytes`):
  queries *and* keys in blocks, the real kernel's loop nest, equal to naive
  attention, with the bytes of the largest live tile next to an H100 SM's
  on-chip memory (:data:`H100_SMEM_PER_SM`).
* **Overlap** (:func:`overlap_measurement`): two independent jobs (a matrix
  product and a memory copy standing in for communication) run one after the
  other and side by side; the time saved is the overlap.

Every timing function runs on the CPU by default and on a GPU with ``device="cuda"``
(functions given a model use the model's device): tensors are made on the device,
the device is synchronised before the clock starts and after each timed call, and
an unknown device, or "cuda" without a GPU, is a ValueError that says so.

The counting (:func:`bytes_moved`, :func:`tile_bytes`, :func:`decode_attention_grid`)
lives in :mod:`servelab.kernels_arith` and loads no torch; the measuring in
:mod:`servelab.kernels_measure`, imported the first time one of its names is asked for.
"""
from __future__ import annotations

from servelab._lazy import lazy_exports
from servelab.kernels_arith import (  # noqa: F401  (torch-free: loaded at once)
    H100_L1_SMEM_PER_SM, H100_MAX_REGISTERS_PER_THREAD, H100_REGISTERS_PER_SM, H100_SMEM_PER_SM, H100_SMS, SEQUENCES,
    Op, bytes_moved, decode_attention_grid, tile_bytes,
)
from servelab.timing import time_call  # noqa: F401  (the one timer, under its old name here)

#: The names that need torch (servelab.kernels_measure, imported on first use).
_TORCH_NAMES = ("rmsnorm_residual", "swiglu", "fusion_measurement", "op_overhead_seconds", "count_ops",
                "decode_step", "step_overhead", "compiled_step", "compile_step", "flash_attention",
                "overlap_measurement", "_sync", "_check_device", "_model_device", "_fusion_inputs",
                "_overlap_cuda")

__all__ = [
    "Op", "SEQUENCES", "bytes_moved", "rmsnorm_residual", "swiglu", "fusion_measurement",
    "op_overhead_seconds", "count_ops", "decode_step", "step_overhead", "compile_step",
    "flash_attention", "tile_bytes", "H100_SMEM_PER_SM", "H100_L1_SMEM_PER_SM", "H100_REGISTERS_PER_SM",
    "H100_SMS", "overlap_measurement", "time_call", "decode_attention_grid",
]


__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(_TORCH_NAMES, "servelab.kernels_measure"))
