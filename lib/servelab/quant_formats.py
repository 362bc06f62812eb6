"""Weight formats and their bit arithmetic, without torch.

:data:`FORMATS` (int8 per channel, int4 in groups of 32 or 128, MXFP4, NVFP4),
:func:`get_format`, :func:`bits_per_weight` (scales included) and
:func:`memory_bound_step_seconds`. Importing it loads no torch, so calculators
and chapters can count bits before any tensor exists. Also importable from
:mod:`servelab.quant`.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Format", "FORMATS", "SCHEMES", "ALIASES", "get_format", "bits_per_weight", "FP4_E2M1_VALUES",
           "memory_bound_step_seconds", "KERNEL_MAX_ROWS"]


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
