"""Quantized linear layers: packed low-bit storage and PyTorch's CPU weight-only kernels.

* :class:`QuantizedLinear`: an ``nn.Linear`` replacement that *stores* the
  packed codes (int8 one per byte, 4-bit codes two per byte) and its scales;
  int8 and int4 run ``aten._weight_int8pack_mm`` and
  ``aten._weight_int4pack_mm_for_cpu``, MXFP4 and NVFP4 dequantize and call an
  ordinary matmul;
* :class:`FusedQuantizedLinears`: int8 Q/K/V (or gate/up) as one packed matrix;
* :func:`quantize_model` swaps a :class:`servelab.model.LlamaModel`'s
  projections in place; :func:`linear_weight_bytes` counts what they hold.

Also importable from :mod:`servelab.quant`.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from servelab.quant_codecs import _check_weight, dequantize_weight, pack_nibbles, quantize_weight, unpack_nibbles
from servelab.quant_formats import INT4_MIN, KERNEL_MAX_ROWS, Format, get_format

__all__ = ["QuantizedLinear", "FusedQuantizedLinears", "fusable_quantized", "quantize_model", "is_quantized",
           "linear_weight_bytes", "PROJECTIONS"]


#: PyTorch's CPU int4 packing needs the output width to be a multiple of this.
INT4PACK_OUT_MULTIPLE = 16


def _check_layer(w: torch.Tensor, fmt: Format) -> None:
    """:func:`_check_weight` plus what the format's CPU kernel needs of the layer's shape."""
    _check_weight(w, fmt)
    if fmt.kernel == "int4pack" and w.shape[0] % INT4PACK_OUT_MULTIPLE:
        raise ValueError(f"{fmt.name} runs PyTorch's CPU int4 kernel, which needs out_features to be a "
                         f"multiple of {INT4PACK_OUT_MULTIPLE}, got {w.shape[0]}; use 'int8' for this "
                         "layer or pad its rows")


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
