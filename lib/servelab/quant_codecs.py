"""Weight codecs: round, pack, quantize and dequantize, in every format of :mod:`servelab.quant_formats`.

* :func:`round_to_fp4` (E2M1, ties to even), :func:`pack_nibbles` and
  :func:`unpack_nibbles` (two 4-bit codes a byte);
* :func:`quantize_weight` returns a matrix's codes and scales,
  :func:`dequantize_weight` turns them back, :func:`fake_quantize` does both,
  :func:`roundtrip_error` says how far the round trip moves the weights;
* FP8 as a format: :func:`scaled_round_trip` and :func:`scaled_roundtrip_error`
  round a tensor to E4M3, E5M2 or int8 with one scale per tensor or per row.

Also importable from :mod:`servelab.quant`.
"""
from __future__ import annotations

from typing import Any

import torch

from servelab.quant_formats import (
    E4M3_MAX, FP4_E2M1_VALUES, FP4_EMAX, FP4_MAX, INT4_MAX, INT4_MIN, INT8_MAX, Format, get_format,
)

__all__ = ["round_to_fp4", "pack_nibbles", "unpack_nibbles", "quantize_weight", "dequantize_weight",
           "fake_quantize", "roundtrip_error", "FP8_FORMATS", "scaled_round_trip", "scaled_roundtrip_error"]


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


# ====================================================================== fp8 as a format

#: The two FP8 formats (Micikevicius et al., 2022): E4M3 keeps more mantissa
#: (largest 448), E5M2 more range (largest 57,344).
FP8_FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def scaled_round_trip(x: torch.Tensor, element: str = "e4m3", granularity: str = "tensor") -> torch.Tensor:
    """``x`` (2-D, as fp32) after rounding to ``element`` with one scale per tensor or per row, and back.

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
        return torch.round(x / scale).clamp(-INT8_MAX, INT8_MAX) * scale
    dtype = FP8_FORMATS[element]
    scale = amax / torch.finfo(dtype).max
    return (x / scale).to(dtype).float() * scale


def scaled_roundtrip_error(x: torch.Tensor, element: str = "e4m3", granularity: str = "tensor") -> float:
    """Relative RMS error of ``x`` (2-D) after :func:`scaled_round_trip`: RMS(error) / RMS(x)."""
    back = scaled_round_trip(x, element, granularity)
    x = x.float()
    rms_x = x.pow(2).mean().sqrt().item()
    return (back - x).pow(2).mean().sqrt().item() / rms_x if rms_x else 0.0
