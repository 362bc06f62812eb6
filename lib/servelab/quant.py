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
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "Format", "FORMATS", "SCHEMES", "get_format", "bits_per_weight", "FP4_E2M1_VALUES",
    "round_to_fp4", "quantize_weight", "dequantize_weight", "fake_quantize", "roundtrip_error",
    "pack_nibbles", "unpack_nibbles", "QuantizedLinear", "FusedQuantizedLinears", "fusable_quantized",
    "quantize_model", "is_quantized",
    "linear_weight_bytes", "PROJECTIONS", "perplexity", "validation_tokens", "quality_table",
    "outlier_demo", "memory_bound_step_seconds", "FP8_FORMATS", "scaled_roundtrip_error",
    "time_projection",
]


# ====================================================================== formats

@dataclass(frozen=True)
class Format:
    """One weight format: element bits, how many weights share a scale, the scale's bits.

    ``group=None`` means one scale per output channel (a whole row of the
    matrix). ``tensor_scale_bits`` is a second-level scale for the whole
    tensor (NVFP4's fp32). ``kernel`` names the CPU path :class:`QuantizedLinear` takes.
    """

    name: str
    element: str          # "int8", "int4", "fp4_e2m1"
    element_bits: int
    group: int | None     # weights per scale; None = per output channel
    scale: str            # "bf16", "e8m0", "e4m3"
    scale_bits: int
    kernel: str           # "int8pack", "int4pack" or "dequantize"
    tensor_scale_bits: int = 0
    source: str = ""


#: The schemes :func:`quantize_model` accepts. "int4" means group 128.
FORMATS: dict[str, Format] = {
    "int8": Format("int8", "int8", 8, None, "bf16", 16, "int8pack"),
    "int4-g32": Format("int4-g32", "int4", 4, 32, "bf16", 16, "int4pack"),
    "int4-g128": Format("int4-g128", "int4", 4, 128, "bf16", 16, "int4pack"),
    "mxfp4": Format("mxfp4", "fp4_e2m1", 4, 32, "e8m0", 8, "dequantize",
                    source="OCP Microscaling Formats (MX) Specification v1.0 (2023): "
                           "32 E2M1 elements share one E8M0 (power-of-two) scale"),
    "nvfp4": Format("nvfp4", "fp4_e2m1", 4, 16, "e4m3", 8, "dequantize", tensor_scale_bits=32,
                    source="NVIDIA, 'Introducing NVFP4 for efficient and accurate low-precision "
                           "inference' (2025): 16 E2M1 elements share one FP8 E4M3 scale, "
                           "plus one FP32 scale per tensor"),
}
ALIASES = {"int4": "int4-g128"}
SCHEMES = tuple(FORMATS) + tuple(ALIASES)

#: The magnitudes an FP4 E2M1 number can take (1 sign, 2 exponent, 1 mantissa bit);
#: code ``i`` (0..7) is this value, code ``i + 8`` its negative.
FP4_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX = 6.0
FP4_EMAX = 2           # largest E2M1 exponent: 6 = 1.5 * 2**2
E4M3_MAX = 448.0       # largest finite FP8 E4M3 value (torch.float8_e4m3fn)
INT8_MAX = 127
INT4_MIN, INT4_MAX = -8, 7
#: Up to this many activation rows (tokens in a step) the int8/int4 kernels run;
#: above it a dense matmul on the dequantized matrix is faster on a CPU.
KERNEL_MAX_ROWS = 32


def get_format(scheme: str) -> Format:
    """The :class:`Format` of a scheme name; unknown names raise a ValueError listing the choices."""
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a string such as 'int8', got {type(scheme).__name__}")
    key = ALIASES.get(scheme.lower(), scheme.lower())
    if key not in FORMATS:
        raise ValueError(f"unknown quantization scheme {scheme!r}; choose one of {list(SCHEMES)}")
    return FORMATS[key]


def bits_per_weight(scheme: str, in_features: int | None = None, numel: int | None = None) -> float:
    """Bits each weight costs, scales included: ``element_bits + scale_bits / group``.

    Per-channel formats (int8) pay one scale per row, so ``in_features`` (the
    row length) is needed; NVFP4's per-tensor scale is spread over ``numel``
    weights when given (negligible for real matrices).
    """
    fmt = get_format(scheme)
    group = fmt.group
    if group is None:
        if in_features is None:
            raise ValueError(f"{fmt.name} has one scale per output channel: pass in_features "
                             "(the row length) to spread the scale's bits over it")
        if isinstance(in_features, bool) or not isinstance(in_features, int) or in_features <= 0:
            raise ValueError(f"in_features must be a positive whole number, got {in_features!r}")
        group = in_features
    bits = fmt.element_bits + fmt.scale_bits / group
    if fmt.tensor_scale_bits and numel:
        bits += fmt.tensor_scale_bits / numel
    return bits


def memory_bound_step_seconds(params: float, bits: float, bandwidth: float, overhead_s: float = 0.0) -> float:
    """A memory-bound decode step: ``params * bits / 8`` bytes at ``bandwidth`` bytes/s, plus overhead."""
    for name, value in (("params", params), ("bits", bits), ("bandwidth", bandwidth)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    return params * bits / 8 / bandwidth + overhead_s


# ====================================================================== rounding helpers

def round_to_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round to the nearest FP4 E2M1 value (ties to the even code), saturating at +-6.

    Returns ``(values, codes)``: the rounded numbers (same dtype as ``x``, fp32
    math) and 4-bit codes 0..15 (bit 3 = sign) as uint8.
    """
    grid = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32)
    a = x.float().abs().clamp(max=FP4_MAX)
    dist = (a.unsqueeze(-1) - grid).abs()
    nearest = dist == dist.min(-1, keepdim=True).values
    even = torch.arange(8) % 2 == 0
    pick = (nearest.to(torch.int8) * 2 + (nearest & even).to(torch.int8)).argmax(-1)
    negative = (x.float() < 0) & (pick > 0)
    values = torch.where(negative, -grid[pick], grid[pick]).to(x.dtype)
    codes = (pick + 8 * negative).to(torch.uint8)
    return values, codes


def _fp4_decode(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32)
    c = codes.long()
    mag = grid[c & 7]
    return torch.where(c >= 8, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes (0..15) per byte along the last dimension: ``[..., K] -> [..., K/2]`` uint8."""
    if codes.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even to pack two codes per byte, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: ``[..., K/2]`` uint8 -> ``[..., K]`` codes 0..15."""
    low, high = packed & 15, packed >> 4
    return torch.stack([low, high], -1).flatten(-2)


# ====================================================================== quantize / dequantize

def _check_weight(w: torch.Tensor, fmt: Format) -> None:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 2 or w.numel() == 0:
        raise ValueError(f"weight must be a non-empty [out_features, in_features] matrix, got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise TypeError(f"weight must be floating point, got {w.dtype}")
    if fmt.group is not None and w.shape[1] % fmt.group:
        divisors = [g for g in (16, 32, 64, 128) if w.shape[1] % g == 0]
        raise ValueError(f"{fmt.name} groups {fmt.group} weights per scale, which does not divide "
                         f"in_features={w.shape[1]}; pick a scheme whose group divides the width "
                         f"(groups that divide it: {divisors or 'none'}) or pad the matrix")


#: PyTorch's CPU int4 packing needs the output width to be a multiple of this.
INT4PACK_OUT_MULTIPLE = 16


def _check_layer(w: torch.Tensor, fmt: Format) -> None:
    """:func:`_check_weight` plus what the format's CPU kernel needs of the layer's shape."""
    _check_weight(w, fmt)
    if fmt.kernel == "int4pack" and w.shape[0] % INT4PACK_OUT_MULTIPLE:
        raise ValueError(f"{fmt.name} runs PyTorch's CPU int4 kernel, which needs out_features to be a "
                         f"multiple of {INT4PACK_OUT_MULTIPLE}, got {w.shape[0]}; use 'int8' for this "
                         "layer or pad its rows")


def quantize_weight(w: torch.Tensor, scheme: str) -> dict[str, Any]:
    """Codes and scales of ``w [out, in]`` in ``scheme``; see :func:`dequantize_weight`.

    Returns a dict with ``codes`` (int8 values for int8/int4, 4-bit FP4 codes
    0..15 as uint8 for the FP4 formats, one per weight, unpacked), ``scales``
    and, for NVFP4, ``tensor_scale``. Scales are stored in their format
    (bf16, E8M0 as an int8 exponent, float8_e4m3fn).
    """
    fmt = get_format(scheme)
    _check_weight(w, fmt)
    w = w.detach().float()
    n, k = w.shape
    if fmt.element == "int8":
        scale = (w.abs().amax(1) / INT8_MAX).clamp(min=1e-12).to(torch.bfloat16)
        codes = torch.round(w / scale.float()[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        return {"scheme": fmt.name, "codes": codes, "scales": scale}
    g = fmt.group
    wg = w.view(n, k // g, g)
    if fmt.element == "int4":
        # symmetric: the largest magnitude maps to +-7, so both signs fit in -8..7
        scale = (wg.abs().amax(-1) / INT4_MAX).clamp(min=1e-12).to(torch.bfloat16)
        codes = torch.round(wg / scale.float()[..., None]).clamp(INT4_MIN, INT4_MAX)
        return {"scheme": fmt.name, "codes": codes.to(torch.int8).view(n, k), "scales": scale}
    amax = wg.abs().amax(-1)
    if fmt.name == "mxfp4":
        # shared exponent: floor(log2(amax)) - emax of the element (OCP MX v1.0, section 6.3)
        exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=2.0 ** -126))) - FP4_EMAX,
                          torch.full_like(amax, -127.0)).clamp(-127, 127)
        block = torch.exp2(exp)
        _, codes = round_to_fp4(wg / block[..., None])
        return {"scheme": fmt.name, "codes": codes.view(n, k), "scales": exp.to(torch.int8)}
    # nvfp4: block scale amax/6 in E4M3, relative to one fp32 tensor scale
    tensor_scale = (amax.max() / (FP4_MAX * E4M3_MAX)).clamp(min=1e-12)
    block = (amax / FP4_MAX / tensor_scale).to(torch.float8_e4m3fn)
    denom = block.float() * tensor_scale
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    _, codes = round_to_fp4(wg / denom[..., None])
    return {"scheme": fmt.name, "codes": codes.view(n, k), "scales": block,
            "tensor_scale": tensor_scale.reshape(())}


def dequantize_weight(q: dict[str, Any], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The matrix the codes and scales stand for (inverse of :func:`quantize_weight`)."""
    fmt = get_format(q["scheme"])
    codes = q["codes"]
    n, k = codes.shape
    if fmt.element == "int8":
        return (codes.float() * q["scales"].float()[:, None]).to(dtype)
    g = fmt.group
    if fmt.element == "int4":
        return (codes.float().view(n, k // g, g) * q["scales"].float()[..., None]).view(n, k).to(dtype)
    if fmt.name == "mxfp4":
        block = torch.exp2(q["scales"].float())
    else:
        block = q["scales"].float() * q["tensor_scale"].float()
    return (_fp4_decode(codes).view(n, k // g, g) * block[..., None]).view(n, k).to(dtype)


def fake_quantize(w: torch.Tensor, scheme: str) -> torch.Tensor:
    """``w`` after a round trip through ``scheme`` (same shape and dtype)."""
    return dequantize_weight(quantize_weight(w, scheme), w.dtype)


def roundtrip_error(w: torch.Tensor, scheme: str) -> dict[str, float]:
    """How far the round trip moves ``w``: max and RMS absolute error, and RMS relative to RMS(w)."""
    err = (fake_quantize(w, scheme).float() - w.float())
    rms_w = w.float().pow(2).mean().sqrt().item()
    rms = err.pow(2).mean().sqrt().item()
    return {"max_abs": err.abs().max().item(), "rms": rms, "relative_rms": rms / rms_w if rms_w else 0.0}


# ====================================================================== the module

@functools.lru_cache(maxsize=32)
def _int4pack_source_index(n: int, k: int) -> torch.Tensor:
    """Where each nibble of ``_convert_weight_to_int4pack_for_cpu``'s output came from.

    The packed layout is the kernel's own (blocks of output rows, interleaved
    per CPU). Rather than copy it, pack the source index of every weight, four
    bits at a time, and read the indices back: entry ``j`` of the result is the
    flat ``[n, k]`` position of nibble ``j`` (low nibble first) of the packed bytes.
    """
    idx = torch.arange(n * k, dtype=torch.int64).view(n, k)
    source = torch.zeros(n * k, dtype=torch.int64)
    for shift in range(0, max(1, (n * k - 1).bit_length()), 4):
        plane = ((idx >> shift) & 15).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(plane, 1)
        source |= unpack_nibbles(packed).reshape(-1).long() << shift
    return source


@functools.lru_cache(maxsize=32)
def _int4pack_gather_index(n: int, k: int) -> torch.Tensor:
    """The inverse of :func:`_int4pack_source_index`: for each ``[n, k]`` weight, its nibble (int32)."""
    source = _int4pack_source_index(n, k)
    inverse = torch.empty_like(source)
    inverse[source] = torch.arange(source.numel())
    return inverse.to(torch.int32)


def _low_bit_matmul(kernel: str, x2: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                    group: int | None) -> torch.Tensor:
    """``x2 [rows, in] @ W^T`` through PyTorch's CPU kernel ``kernel`` ("int8pack" or "int4pack")."""
    x2 = x2.contiguous()
    if scales.dtype is not x2.dtype:
        scales = scales.to(x2.dtype)
    if kernel == "int8pack":
        return torch.ops.aten._weight_int8pack_mm(x2, codes, scales)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x2, codes, group, scales)


class QuantizedLinear(nn.Module):
    """A linear layer whose weight is stored packed in a low-bit format.

    Build it with :meth:`from_linear`. Buffers hold exactly what the format
    stores (codes and scales, in the layout its kernel wants); :attr:`nbytes`
    sums them. ``forward`` takes the path in :attr:`kernel`:

    * ``int8pack``: ``aten._weight_int8pack_mm(x, codes, scales)``, int8
      codes ``[out, in]``, one scale per output channel;
    * ``int4pack``: ``aten._weight_int4pack_mm_for_cpu``, codes shifted to
      0..15 and packed two per byte by ``aten._convert_weight_to_int4pack_for_cpu``,
      ``[in/group, out, 2]`` scales and zeros in bf16 (the zeros are 0: the
      format is symmetric, but the kernel's layout reserves them);
    * ``dequantize``: unpack, decode and scale to a full matrix, then ``F.linear``
      (MXFP4, NVFP4: no CPU kernel reads FP4).

    Activations run in their own dtype (fp32 or bf16); the kernels accept both,
    and bf16 is the fast path. The output has the input's dtype.
    """

    def __init__(self, in_features: int, out_features: int, scheme: str, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.format = get_format(scheme)
        self.scheme = self.format.name
        self.kernel = self.format.kernel
        self.register_buffer("bias", None)
        self._tensor_scale: float = 1.0

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: str) -> "QuantizedLinear":
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear expects an nn.Linear, got {type(linear).__name__}"
                            + ("; it is already quantized" if isinstance(linear, QuantizedLinear) else ""))
        _check_layer(linear.weight, get_format(scheme))
        q = quantize_weight(linear.weight, scheme)
        mod = cls(linear.in_features, linear.out_features, scheme, bias=linear.bias is not None)
        mod._store(q)
        if linear.bias is not None:
            mod.bias = linear.bias.detach().clone()
        return mod

    def _store(self, q: dict[str, Any]) -> None:
        if self.kernel == "int8pack":
            self.register_buffer("codes", q["codes"].contiguous())
            self.register_buffer("scales", q["scales"].contiguous())
        elif self.kernel == "int4pack":
            unsigned = (q["codes"].to(torch.int32) - INT4_MIN).contiguous()   # -8..7 -> 0..15
            self.register_buffer("codes", torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned, 1))
            sz = torch.stack([q["scales"], torch.zeros_like(q["scales"])], -1)   # [n, k/g, 2]
            self.register_buffer("scales", sz.transpose(0, 1).contiguous())       # [k/g, n, 2]
        else:
            self.register_buffer("codes", pack_nibbles(q["codes"]).contiguous())  # [n, k/2] uint8
            # E8M0 exponents (int8) or float8_e4m3fn: one byte per scale either way
            self.register_buffer("scales", q["scales"].contiguous())
            if "tensor_scale" in q:
                self.register_buffer("tensor_scale", q["tensor_scale"].float().reshape(1))

    # -- what it holds ----------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes really held: every buffer's storage (codes, scales, bias)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The full ``[out, in]`` matrix these codes stand for (the reference the kernels must match)."""
        n, k = self.out_features, self.in_features
        if self.kernel == "int8pack":
            return (self.codes.float() * self.scales.float()[:, None]).to(dtype)
        if self.kernel == "int4pack":
            g = self.format.group
            scale = self.scales[..., 0].transpose(0, 1)   # [n, k/g], bf16
            work = torch.float32 if dtype == torch.float32 else torch.bfloat16   # code x bf16 scale: exact in either
            codes = self._unpack_int4().view(n, k // g, g).to(work)
            return (codes * scale.to(work)[..., None]).view(n, k).to(dtype)
        q = {"scheme": self.scheme, "codes": unpack_nibbles(self.codes), "scales": self.scales}
        if self.scheme == "nvfp4":
            q["tensor_scale"] = self.tensor_scale[0]
        return dequantize_weight(q, dtype)

    def _unpack_int4(self) -> torch.Tensor:
        """Signed codes -8..7 ``[out, in]`` read back from the kernel's packed layout."""
        n, k = self.out_features, self.in_features
        nibbles = unpack_nibbles(self.codes).reshape(-1)
        return (nibbles.index_select(0, _int4pack_gather_index(n, k)).to(torch.int8) + INT4_MIN).view(n, k)

    # -- forward ----------------------------------------------------------
    def path(self, rows: int, dtype: torch.dtype) -> str:
        """Which path ``forward`` takes for ``rows`` activation rows of ``dtype``.

        The low-bit kernels are the fast path for a few rows of bf16
        activations (a decode step). With fp32 activations, or many rows at once
        (a prompt, a perplexity run) they are slower than a dense matmul on this
        CPU, so the layer dequantizes its matrix and calls one: the same numbers
        up to float rounding (tested), at the cost of reading a full matrix.
        """
        if self.kernel != "dequantize" and dtype == torch.bfloat16 and rows <= KERNEL_MAX_ROWS:
            return self.kernel
        return "dequantize"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None and self.path(x.numel() // self.in_features, x.dtype) != "dequantize":
            # the decode fast path, straight to the kernel (a step calls this per layer)
            y = _low_bit_matmul(self.kernel, x.reshape(-1, self.in_features), self.codes, self.scales,
                                self.format.group)
            return y.view(*x.shape[:-1], self.out_features)
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype not in (torch.float32, torch.bfloat16):
            x2 = x2.float()
        path = self.path(x2.shape[0], x2.dtype)
        if path == "dequantize":
            y = F.linear(x2, self.dequantized_weight(x2.dtype))
        else:
            y = _low_bit_matmul(path, x2, self.codes, self.scales, self.format.group)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme}, "
                f"kernel={self.kernel}, nbytes={self.nbytes:,}")


class FusedQuantizedLinears:
    """Several int8 :class:`QuantizedLinear` that read the same input, stored as one packed matrix.

    The quantized counterpart of :class:`servelab.model.FusedLinears`: Q, K and
    V (or gate and up) become one ``[sum of outputs, in]`` int8 matrix with its
    per-row scales, and a decode step calls the int8 kernel once per group
    instead of once per projection. Each projection's ``codes`` and ``scales``
    become views of their rows, so nothing is held twice and every layer still
    works on its own. The model calls it through the same hook as the
    full-precision fusion (``fused_qkv``, ``fused_gate_up``): it is used while
    :meth:`is_current` (the layers still hold views of it), else the model runs
    the projections one by one.
    """

    def __init__(self, linears):
        if not fusable_quantized(linears):
            raise TypeError("only int8 QuantizedLinear layers with the same input width and all or no "
                            f"biases fuse, got {[getattr(l, 'scheme', type(l).__name__) for l in linears]}")
        with torch.no_grad():
            self.codes = torch.cat([l.codes for l in linears])
            self.scales = torch.cat([l.scales for l in linears])
            has_bias = linears[0].bias is not None
            self.bias = torch.cat([l.bias for l in linears]) if has_bias else None
            self.sizes = [l.out_features for l in linears]
            row = 0
            for l, n in zip(linears, self.sizes):
                l.codes = self.codes[row:row + n]
                l.scales = self.scales[row:row + n]
                if has_bias:
                    l.bias = self.bias[row:row + n]
                row += n
        self._linears = tuple(linears)
        self._layer = linears[0]

    def is_current(self, linears) -> bool:
        """True while these very layers still hold views of this fused matrix's rows.

        Checked by addresses on every call (cheap), so after ``model.to(...)`` or a
        swapped buffer the group runs one by one instead of on stale numbers; a
        ``copy.deepcopy`` of the model keeps the views, and so the fusion.
        """
        if len(linears) != len(self._linears):
            return False
        row, k = 0, self.codes.shape[1]
        code0, scale0 = self.codes.data_ptr(), self.scales.data_ptr()
        size = self.scales.element_size()
        for l, ref in zip(linears, self._linears):
            if (l is not ref or l.codes.data_ptr() != code0 + row * k
                    or l.scales.data_ptr() != scale0 + row * size or l.scales.dtype != self.scales.dtype):
                return False
            if self.bias is not None and (l.bias is None or l.bias.data_ptr() != self.bias.data_ptr()
                                          + row * self.bias.element_size()):
                return False
            row += l.out_features
        return True

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        k = self.codes.shape[1]
        if self._linears[0].path(x.numel() // k, x.dtype) == "dequantize":  # each layer dequantizes alone
            return tuple(l(x) for l in self._linears)
        y = _low_bit_matmul("int8pack", x.reshape(-1, k), self.codes, self.scales, None)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], y.shape[-1]).split(self.sizes, dim=-1)


def fusable_quantized(linears) -> bool:
    """int8 :class:`QuantizedLinear` layers of one input width, biases all present or all absent."""
    return (len(linears) > 0 and all(isinstance(l, QuantizedLinear) and l.kernel == "int8pack" for l in linears)
            and len({l.in_features for l in linears}) == 1 and len({l.bias is None for l in linears}) == 1)


# ====================================================================== whole models

#: The projections :func:`quantize_model` replaces in every decoder layer.
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def is_quantized(model: nn.Module) -> bool:
    """True when any module of ``model`` is a :class:`QuantizedLinear`."""
    return any(isinstance(m, QuantizedLinear) for m in model.modules())


def quantize_model(model: nn.Module, scheme: str, lm_head: bool = False, fuse: bool = True) -> nn.Module:
    """Replace every decoder layer's projections with :class:`QuantizedLinear`, in place; returns ``model``.

    ``scheme`` is one of :data:`SCHEMES` ("int8", "int4" = "int4-g128",
    "int4-g32", "mxfp4", "nvfp4"). The embedding and norms stay as they are;
    the output head too unless ``lm_head=True`` (a tied head is then quantized
    as a separate copy and the embedding table keeps its full-precision rows).
    Full-precision fused groups are dropped; with ``fuse=True`` (default) int8
    Q/K/V and gate/up are fused again as int8 (:class:`FusedQuantizedLinears`:
    one kernel call per group, the same numbers). Other formats multiply one
    matrix at a time (the int4 kernel's packed layout cannot be sliced into views).
    """
    fmt = get_format(scheme)
    if not hasattr(model, "layers"):
        raise TypeError(f"quantize_model expects a servelab.model.LlamaModel, got {type(model).__name__}")
    if is_quantized(model):
        raise ValueError("this model is already quantized; load a fresh full-precision copy "
                         "(e.g. servelab.model.load_course_model()) and quantize that once")
    linears = []
    for layer in model.layers:
        for path in PROJECTIONS:
            parent_name, name = path.split(".")
            parent = getattr(layer, parent_name)
            linears.append((parent, name, getattr(parent, name)))
    if lm_head:
        linears.append((model, "lm_head", model.lm_head))
    for _, name, lin in linears:   # check every width first, so a failure leaves the model untouched
        _check_layer(lin.weight, fmt)
    with torch.no_grad():
        for parent, name, lin in linears:
            setattr(parent, name, QuantizedLinear.from_linear(lin, fmt.name))
    for layer in model.layers:
        # full-precision fused matrices hold the old weights: int8 groups get a fused int8
        # matrix (one kernel call per group), other formats run each projection on its own
        for mod, attr, names in ((layer.self_attn, "fused_qkv", ("q_proj", "k_proj", "v_proj")),
                                 (layer.mlp, "fused_gate_up", ("gate_proj", "up_proj"))):
            group = [getattr(mod, n) for n in names]
            setattr(mod, attr, FusedQuantizedLinears(group) if fuse and fusable_quantized(group) else None)
    model.quantization = fmt.name
    return model


def linear_weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes held by the decoder layers' projections and by everything else (embedding, norms, head).

    Quantized projections count their buffers (:attr:`QuantizedLinear.nbytes`);
    full-precision ones their parameters. A tied head is counted once.
    """
    proj, seen = 0, set()
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            proj += m.nbytes
    for layer in model.layers:
        for path in PROJECTIONS:
            parent_name, name = path.split(".")
            lin = getattr(getattr(layer, parent_name), name)
            if isinstance(lin, nn.Linear):
                proj += lin.weight.numel() * lin.weight.element_size()
                seen.add(id(lin.weight))
                if lin.bias is not None:
                    proj += lin.bias.numel() * lin.bias.element_size()
                    seen.add(id(lin.bias))
    qhead = model.lm_head.nbytes if isinstance(model.lm_head, QuantizedLinear) else 0
    other = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in seen)
    other += qhead
    return {"projections": proj - qhead, "other": other, "total": proj + other - qhead}


# ====================================================================== quality

def validation_tokens(max_tokens: int | None = None) -> torch.Tensor:
    """The corpus's validation split as token ids (course tokenizer), first ``max_tokens`` of them."""
    from servelab.train import encode_corpus

    tokens = encode_corpus("val")
    return tokens if max_tokens is None else tokens[:max_tokens]


@torch.no_grad()
def perplexity(model: nn.Module, tokens: torch.Tensor, seq_len: int = 256, batch_size: int = 8,
               return_logits: bool = False):
    """exp(mean next-token loss) over consecutive non-overlapping windows of ``tokens``.

    With ``return_logits=True`` also returns the logits of every window
    (``[windows, seq_len, vocab]``, fp32) for comparing two models position by position.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    n = (len(tokens) - 1) // seq_len
    if n < 1:
        raise ValueError(f"need more than seq_len={seq_len} tokens, got {len(tokens)}")
    model.eval()
    total, count, logits_all = 0.0, 0, []
    for start in range(0, n, batch_size):
        idx = range(start, min(n, start + batch_size))
        rows = torch.stack([tokens[i * seq_len:i * seq_len + seq_len + 1] for i in idx]).long()
        logits = model(rows[:, :-1]).float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += rows[:, 1:].numel()
        if return_logits:
            logits_all.append(logits)
    ppl = math.exp(total / count)
    return (ppl, torch.cat(logits_all)) if return_logits else ppl


QUALITY_VARIANTS = ("fp32", "bf16", "int8", "int4-g128", "int4-g32", "mxfp4", "nvfp4")


def quality_table(variants: Sequence[str] = QUALITY_VARIANTS, max_tokens: int = 16_384, seq_len: int = 256,
                  model_name: str = "main") -> list[dict[str, Any]]:
    """Perplexity, top-1 agreement and KL divergence against fp32, for each variant of the course model.

    "fp32" and "bf16" are the whole model in that dtype; a scheme name is the
    fp32 model with its projections quantized (activations stay fp32, so the
    difference is the weights' rounding alone). Scored on the first
    ``max_tokens`` tokens of the validation split, in windows of ``seq_len``.
    """
    from servelab.kvquant import logit_agreement
    from servelab.model import load_course_model

    tokens = validation_tokens(max_tokens)
    ref_ppl, ref_logits = None, None
    rows = []
    for variant in variants:
        if variant in ("fp32", "bf16"):
            model = load_course_model(model_name, dtype=torch.float32 if variant == "fp32" else torch.bfloat16)
            bits = 32 if variant == "fp32" else 16
            weight_bytes = linear_weight_bytes(model)["projections"]
        else:
            model = quantize_model(load_course_model(model_name, dtype=torch.float32), variant)
            bits = bits_per_weight(variant, in_features=model.config.hidden_size)
            weight_bytes = linear_weight_bytes(model)["projections"]
        proj_params = sum(_projection_sizes(model))
        ppl, logits = perplexity(model, tokens, seq_len, return_logits=True)
        if ref_logits is None:
            ref_ppl, ref_logits = ppl, logits
        agree = logit_agreement(ref_logits, logits)
        rows.append({"variant": variant, "bits_per_weight": round(bits, 3), "projection_bytes": weight_bytes,
                     "held_bits_per_weight": round(weight_bytes * 8 / proj_params, 3),
                     "perplexity": ppl, "perplexity_change": ppl / ref_ppl - 1,
                     "top1_agreement": agree["top1_agreement"], "mean_kl": agree["mean_kl"],
                     "tokens": int((len(tokens) - 1) // seq_len * seq_len)})
    return rows


def _projection_sizes(model: nn.Module) -> list[int]:
    sizes = []
    for layer in model.layers:
        for path in PROJECTIONS:
            parent_name, name = path.split(".")
            lin = getattr(getattr(layer, parent_name), name)
            sizes.append(lin.in_features * lin.out_features)
    return sizes


def outlier_demo(out_features: int = 256, in_features: int = 512, factor: float = 40.0, seed: int = 0,
                 tokens: int = 64) -> dict[str, Any]:
    """One large input channel and what it does to int8: relative output error per method.

    A random weight matrix gets one input column ``factor`` times larger than
    the rest (LLM weights and activations have such channels). Each method's
    error is ``|x W^T - x W_hat^T| / |x W^T|`` on random inputs:

    * per-tensor int8: one scale for the whole matrix, set by the outlier:
      every ordinary weight is left with a few levels;
    * per-channel int8 (one scale per output row): every row holds the large
      column, so it does not help here (it does for a large *output* row);
    * int8 with groups of 128 along the row: only the group holding the column suffers;
    * rescaled (SmoothQuant/AWQ-style): divide the column by ``s`` and multiply
      that input channel by ``s`` (folded into the previous norm's weight), then
      per-channel int8: ``x W^T`` is unchanged, the column is ordinary;
    * column kept in high precision (LLM.int8()-style mixed precision), rest per-channel int8;
    * rotated (QuaRot-style): multiply ``W`` by an orthogonal matrix ``R`` (a
      Hadamard matrix with random signs when ``in_features`` is a power of two,
      else a random orthogonal one) and the inputs by the same ``R``:
      ``(x R)(W R)^T = x W^T``, and the large column is spread over every column
      before per-channel int8.
    """
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen) * 0.02
    col = int(torch.randint(0, in_features, (1,), generator=gen))
    w[:, col] *= factor
    x = torch.randn(tokens, in_features, generator=gen)
    y = x @ w.T

    def err(w_hat, x_used=x):
        return ((x_used @ w_hat.T - y).norm() / y.norm()).item()

    def int8_rows(m):
        return fake_quantize(m, "int8")

    s_tensor = (w.abs().max() / INT8_MAX)
    per_tensor = torch.round(w / s_tensor).clamp(-INT8_MAX, INT8_MAX) * s_tensor
    g = 128 if in_features % 128 == 0 else in_features
    s_group = (w.view(out_features, -1, g).abs().amax(-1, keepdim=True) / INT8_MAX)
    grouped = (torch.round(w.view(out_features, -1, g) / s_group) * s_group).view_as(w)
    smooth = torch.ones(in_features)
    smooth[col] = factor
    rescaled = int8_rows(w / smooth) * smooth          # == quantize(W / s), activations x * s
    rest = w.clone()
    rest[:, col] = 0
    kept = int8_rows(rest)
    kept[:, col] = w[:, col]
    rot = _random_rotation(in_features, gen)
    rotated = int8_rows(w @ rot) @ rot.T                # == quantize(W R), activations x R
    methods = {"per-tensor int8": err(per_tensor), "per-channel int8": err(int8_rows(w)),
               f"int8, groups of {g}": err(grouped), "rescaled channel, per-channel int8": err(rescaled),
               "channel kept in high precision": err(kept),
               "rotated (Hadamard), per-channel int8": err(rotated)}
    clean = w.clone()
    clean[:, col] /= factor
    s_clean = clean.abs().max() / INT8_MAX
    clean_err = ((x @ (torch.round(clean / s_clean) * s_clean - clean).T).norm() / (x @ clean.T).norm()).item()
    return {"column": col, "factor": factor, "group": g, "errors": methods,
            "per_tensor_without_outlier": clean_err}


def _random_rotation(n: int, gen: torch.Generator) -> torch.Tensor:
    """An ``n x n`` orthogonal matrix: Hadamard with random column signs (n a power of two), else QR of a Gaussian."""
    if n > 0 and n & (n - 1) == 0:
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        signs = torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1
        return h * signs / math.sqrt(n)
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen))
    return q * torch.sign(torch.diagonal(r))


# ====================================================================== fp8 as a format

#: The two FP8 formats (Micikevicius et al., 2022): E4M3 keeps more mantissa
#: (largest 448), E5M2 more range (largest 57,344).
FP8_FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def scaled_roundtrip_error(x: torch.Tensor, element: str = "e4m3", granularity: str = "tensor") -> float:
    """Relative RMS error of ``x`` (2-D) after rounding to ``element`` with one scale per tensor or per row.

    ``element`` is ``"e4m3"`` or ``"e5m2"`` (fp8, cast by PyTorch: round to
    nearest even) or ``"int8"`` (symmetric, codes -127..127). The scale maps
    the tensor's (or the row's) largest magnitude onto the format's largest
    value. ``granularity="row"`` is per output channel for a weight matrix and
    per token for activations (rows are tokens).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("x must be a 2-D tensor (rows x columns); reshape it first")
    if granularity not in ("tensor", "row"):
        raise ValueError(f"granularity must be 'tensor' or 'row', not {granularity!r}")
    if element not in FP8_FORMATS and element != "int8":
        raise ValueError(f"element must be one of {sorted(FP8_FORMATS) + ['int8']}, not {element!r}")
    x = x.float()
    amax = x.abs().amax() if granularity == "tensor" else x.abs().amax(dim=1, keepdim=True)
    amax = amax.clamp(min=torch.finfo(torch.float32).tiny)
    if element == "int8":
        scale = amax / INT8_MAX
        back = torch.round(x / scale).clamp(-INT8_MAX, INT8_MAX) * scale
    else:
        dtype = FP8_FORMATS[element]
        scale = amax / torch.finfo(dtype).max
        back = (x / scale).to(dtype).float() * scale
    rms_x = x.pow(2).mean().sqrt().item()
    return (back - x).pow(2).mean().sqrt().item() / rms_x if rms_x else 0.0


def outlier_activations(tokens: int = 64, features: int = 512, factor: float = 100.0,
                        seed: int = 0) -> torch.Tensor:
    """Random activations ``[tokens, features]`` whose one channel is ``factor`` times the rest.

    Trained LLMs' activations have such channels in every token (LLM.int8()
    found features up to 20x larger; some reach hundreds). A per-token scale
    cannot avoid them: every row holds the large channel.
    """
    if tokens < 1 or features < 2:
        raise ValueError("need at least 1 token and 2 features")
    if not factor > 0:
        raise ValueError(f"factor must be positive, not {factor!r}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, features, generator=gen)
    col = int(torch.randint(0, features, (1,), generator=gen))
    x[:, col] *= factor
    return x


def activation_outlier_errors(factor: float = 100.0, tokens: int = 64, features: int = 512,
                              seed: int = 0) -> dict[str, dict[str, float]]:
    """Relative RMS error of the *ordinary* channels of :func:`outlier_activations`, int8 against E4M3.

    ``{"int8": {"tensor": e, "row": e}, "e4m3": {...}}``: each element rounds
    the whole tensor with one scale per tensor or per token (row); the error
    is measured on every channel but the large one, the values the outlier
    squeezes. int8's levels are evenly spaced, so a scale set by the outlier
    leaves ordinary values a few codes; E4M3's steps shrink with the value,
    so they keep about two significant bits of precision (3 mantissa bits).
    """
    x = outlier_activations(tokens, features, factor, seed)
    col = int(x.abs().amax(0).argmax())
    keep = torch.ones(features, dtype=torch.bool)
    keep[col] = False
    out: dict[str, dict[str, float]] = {}
    for element in ("int8", "e4m3"):
        out[element] = {}
        for g in ("tensor", "row"):
            amax = x.abs().amax() if g == "tensor" else x.abs().amax(dim=1, keepdim=True)
            if element == "int8":
                scale = amax / INT8_MAX
                back = torch.round(x / scale).clamp(-INT8_MAX, INT8_MAX) * scale
            else:
                scale = amax / torch.finfo(FP8_FORMATS["e4m3"]).max
                back = (x / scale).to(FP8_FORMATS["e4m3"]).float() * scale
            d, ref = (back - x)[:, keep], x[:, keep]
            out[element][g] = (d.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    return out


# ====================================================================== live timing

def time_projection(in_features: int = 1024, out_features: int = 2816,
                    schemes: Sequence[str] = ("int8", "int4-g128", "int4-g32", "mxfp4"),
                    repeats: int = 30, seed: int = 0) -> dict[str, float]:
    """Milliseconds for one projection at batch 1: fp32, bf16 and each scheme (bf16 activations).

    A scheme whose layer dequantizes (no kernel reads it) also gets
    ``"<scheme> rebuild"``: the matrix's rebuild alone, without the matmul.

    Each is called once to warm up, then ``repeats`` times; the fastest call
    counts (the least disturbed by other work). A measurement of this machine:
    the numbers vary from run to run and between CPUs.
    """
    import time

    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out_features, in_features, generator=gen) * 0.02)
    x32 = torch.randn(1, in_features, generator=gen)
    x16 = x32.bfloat16()
    lin16 = nn.Linear(in_features, out_features, bias=False).bfloat16()
    with torch.no_grad():
        lin16.weight.copy_(lin.weight)
    calls = {"fp32": lambda: lin(x32), "bf16": lambda: lin16(x16)}
    for scheme in schemes:
        layer = QuantizedLinear.from_linear(lin, scheme)
        calls[scheme] = functools.partial(layer, x16)
        if layer.path(1, torch.bfloat16) == "dequantize":
            # the rebuild alone, without the matmul that follows it
            calls[f"{scheme} rebuild"] = functools.partial(layer.dequantized_weight, torch.bfloat16)

    def fastest_ms(fn):
        fn()
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best * 1e3

    with torch.no_grad():
        return {name: fastest_ms(fn) for name, fn in calls.items()}
