"""Store the KV cache in fewer bits: quantize keys and values, read them back, measure the damage.

Halving the bytes of every cached number doubles the seats a card grants
(chapter 11) and halves the cache a decode step reads (chapter 10). The price is
rounding error in every key and value, which shows up as slightly different
attention weights and logits. This module makes both sides concrete:

* :func:`quantize_kv` / :func:`dequantize_kv`: symmetric quantization of a
  ``[..., kv_heads, tokens, head_dim]`` tensor to int8, int4 or fp8 (e4m3), with
  one scale per token and head (``"token"``), per head (``"head"``) or for the
  whole tensor (``"tensor"``). A scale is ``max |x| / largest code``.
* :class:`QuantizedKVCache`: a drop-in cache for :class:`servelab.model.LlamaModel`
  that stores int8/int4/fp8 codes plus their scales and hands attention the
  dequantized values. Per-token scales (the default) suit a cache: each new
  token gets its own scale when it is written and nothing stored is ever
  re-quantized. Static scales, one per layer (``"tensor"``) or per layer and KV
  head (``"head"``), are what production fp8 caches load (vLLM's per-tensor
  ``k_scale``/``v_scale``, its default, or per-head scales); fit them on a
  calibration run with :func:`calibrate_kv_scales`. A number beyond a static
  scale's range saturates at the largest code, as the kernels do, and the cache
  counts it (:attr:`QuantizedKVCache.saturated`).
* :func:`logit_agreement`: how far two runs' logits are apart (max absolute
  difference, mean KL divergence, greedy-token agreement).

int4 codes are kept one per int8 here for simplicity; :attr:`QuantizedKVCache.nbytes`
counts them as packed (two per byte), which is what a real kernel stores.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.model import KVCache

__all__ = ["FORMATS", "GRANULARITIES", "QuantizedKV", "quantize_kv", "dequantize_kv",
           "roundtrip_error", "calibrate_kv_scales", "QuantizedKVCache", "logit_agreement"]

#: Largest code of each storage format and the bytes one code takes.
#: int8: codes -127..127; int4: -7..7; fp8 e4m3 (OCP 8-bit floating point spec,
#: also torch.float8_e4m3fn): largest finite value 448.
FORMATS: dict[str, tuple[float, float]] = {"int8": (127.0, 1.0), "int4": (7.0, 0.5), "fp8": (448.0, 1.0)}

#: Which axes share one scale, for a tensor laid out ``[..., kv_heads, tokens, head_dim]``.
GRANULARITIES = ("token", "head", "tensor")


@dataclass
class QuantizedKV:
    """Codes plus the scales that turn them back into numbers: ``x ~= codes x scale``."""

    codes: torch.Tensor   # int8 (int8/int4) or float8_e4m3fn (fp8)
    scale: torch.Tensor   # float32, broadcastable against codes
    fmt: str
    granularity: str

    @property
    def nbytes(self) -> float:
        """Bytes a real cache would hold: packed codes plus float32 scales."""
        return self.codes.numel() * FORMATS[self.fmt][1] + self.scale.numel() * self.scale.element_size()


def _check_format(fmt: str, granularity: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown KV format {fmt!r}; use one of {sorted(FORMATS)}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; use one of {list(GRANULARITIES)}")


def _check_tensor(x: torch.Tensor, granularity: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor of keys or values, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"expected a floating-point tensor, got dtype {x.dtype}; quantize real-valued K/V")
    need = {"token": 1, "head": 2, "tensor": 0}[granularity]
    if x.dim() < max(need, 1):
        raise ValueError(f"granularity {granularity!r} needs a tensor with at least {max(need, 1)} dims "
                         f"([..., kv_heads, tokens, head_dim]), got shape {tuple(x.shape)}")
    if x.numel() and not torch.isfinite(x).all():
        raise ValueError("keys/values contain inf or nan; they cannot be given a finite scale")


def _scale(x: torch.Tensor, granularity: str, fmt: str) -> torch.Tensor:
    a = x.detach().abs().float()
    if granularity == "token":
        amax = a.amax(dim=-1, keepdim=True)
    elif granularity == "head":
        amax = a.amax(dim=(-2, -1), keepdim=True)
    else:
        amax = a.amax().reshape([1] * x.dim()) if x.numel() else torch.zeros([1] * x.dim())
    scale = amax / FORMATS[fmt][0]
    return torch.where(scale > 0, scale, torch.ones_like(scale))  # all-zero rows: any scale works


def quantize_kv(x: torch.Tensor, fmt: str = "int8", granularity: str = "token") -> QuantizedKV:
    """Symmetric quantization of keys or values laid out ``[..., kv_heads, tokens, head_dim]``.

    ``scale = max|x| / largest code`` over the numbers that share it, codes =
    ``round(x / scale)`` (int formats) or ``x / scale`` cast to fp8 e4m3. The
    largest magnitude in each group is represented exactly; the rest round to
    the nearest code, an error of at most half a step (int) or about 6% relative (fp8).
    """
    _check_format(fmt, granularity)
    _check_tensor(x, granularity)
    scale = _scale(x, granularity, fmt)
    return QuantizedKV(codes=_encode(x.float() / scale, fmt), scale=scale, fmt=fmt, granularity=granularity)


def _encode(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """Numbers already divided by their scale -> codes, saturating at the largest code."""
    qmax = FORMATS[fmt][0]
    if fmt == "fp8":
        return y.clamp(-qmax, qmax).to(torch.float8_e4m3fn)
    return torch.round(y).clamp(-qmax, qmax).to(torch.int8)


def dequantize_kv(q: QuantizedKV, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Codes back to numbers: ``codes x scale`` in ``dtype``."""
    if not isinstance(q, QuantizedKV):
        raise TypeError(f"expected a QuantizedKV from quantize_kv, got {type(q).__name__}")
    return (q.codes.float() * q.scale).to(dtype)


def roundtrip_error(x: torch.Tensor, fmt: str = "int8", granularity: str = "token") -> dict[str, float]:
    """Quantize then dequantize ``x``: max absolute error and error relative to the data's RMS."""
    back = dequantize_kv(quantize_kv(x, fmt, granularity), torch.float32)
    err = (back - x.float()).abs()
    rms = x.float().pow(2).mean().sqrt().item() if x.numel() else 0.0
    return {"max_abs": err.max().item() if x.numel() else 0.0,
            "rel_rms": (err.pow(2).mean().sqrt().item() / rms) if rms > 0 else 0.0}


def calibrate_kv_scales(cache: KVCache, fmt: str = "fp8",
                        granularity: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """Static scales for a :class:`QuantizedKVCache`, fitted on a calibration run.

    ``cache`` is a full-precision :class:`servelab.model.KVCache` that a model
    filled with calibration text. Each scale is ``max |x| / largest code`` over
    that text: one per layer for keys and one for values (``"tensor"``, what
    vLLM loads as ``k_scale``/``v_scale`` by default) or one per layer and KV
    head (``"head"``). Returns ``(k_scale, v_scale)``, each shaped
    ``[layers, 1, kv_heads or 1, 1, 1]``. Text louder than the calibration text
    saturates later, at the largest code.
    """
    _check_format(fmt, granularity)
    if granularity == "token":
        raise ValueError("per-token scales are computed as each token is written; "
                         "calibrate 'tensor' or 'head' scales instead")
    if not isinstance(cache, KVCache) or isinstance(cache, QuantizedKVCache):
        raise TypeError(f"expected a full-precision servelab.model.KVCache, got {type(cache).__name__}")
    if cache.length == 0:
        raise ValueError("the calibration cache is empty; run the model over calibration text first")
    dims = (1, 2, 3, 4) if granularity == "tensor" else (1, 3, 4)
    scales = []
    for store in (cache.k, cache.v):
        amax = store[:, :, :, :cache.length].detach().abs().float().amax(dim=dims, keepdim=True)
        scale = amax / FORMATS[fmt][0]
        scales.append(torch.where(scale > 0, scale, torch.ones_like(scale)))
    return scales[0], scales[1]


class QuantizedKVCache(KVCache):
    """A contiguous KV cache whose entries are stored as int8/int4/fp8 codes with their scales.

    A :class:`servelab.model.KVCache` with quantized storage (it inherits
    ``advance(n)`` and ``crop(n)``; ``update(layer_idx, k, v)`` differs):
    new keys and values are quantized as they are written, and attention gets
    the dequantized history, exactly what a quantized-KV kernel computes.

    ``granularity="token"`` (the default) gives each token and KV head its own
    scale as it is written. ``"tensor"`` or ``"head"`` use static scales
    ``(k_scale, v_scale)`` from :func:`calibrate_kv_scales`; numbers beyond
    their range saturate at the largest code and are counted in :attr:`saturated`.
    """

    def __init__(self, config, batch_size: int = 1, max_len: int | None = None, fmt: str = "int8",
                 granularity: str = "token", scales: tuple[torch.Tensor, torch.Tensor] | None = None):
        _check_format(fmt, granularity)
        max_len = config.max_position_embeddings if max_len is None else max_len
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0:
            raise ValueError(f"max_len must be a positive number of tokens, got {max_len!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        shape = (config.num_hidden_layers, batch_size, config.num_key_value_heads, max_len, config.head_dim)
        code_dtype = torch.float8_e4m3fn if fmt == "fp8" else torch.int8
        self.fmt = fmt
        self.granularity = granularity
        self.k = torch.zeros(shape, dtype=code_dtype)
        self.v = torch.zeros(shape, dtype=code_dtype)
        if granularity == "token":
            if scales is not None:
                raise ValueError("per-token scales are computed as tokens are written; pass scales only "
                                 "with granularity='tensor' or 'head'")
            self.k_scale = torch.ones(shape[:-1] + (1,))
            self.v_scale = torch.ones(shape[:-1] + (1,))
        else:
            self.k_scale, self.v_scale = self._check_scales(scales, config, granularity)
        #: Numbers that fell beyond a static scale's range and were stored as the largest code.
        self.saturated = 0
        self.max_len = max_len
        self.length = 0

    @staticmethod
    def _check_scales(scales, config, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
        heads = config.num_key_value_heads if granularity == "head" else 1
        want = (config.num_hidden_layers, 1, heads, 1, 1)
        if scales is None:
            raise ValueError(f"granularity {granularity!r} needs static scales (k_scale, v_scale); "
                             "fit them with kvquant.calibrate_kv_scales on a calibration run")
        if not isinstance(scales, (tuple, list)) or len(scales) != 2 or \
                not all(isinstance(t, torch.Tensor) for t in scales):
            raise TypeError("scales must be a pair of tensors (k_scale, v_scale) from calibrate_kv_scales")
        out = []
        for t in scales:
            if tuple(t.shape) != want:
                raise ValueError(f"{granularity} scales must have shape {want} for this config, "
                                 f"got {tuple(t.shape)}")
            if not (torch.isfinite(t).all() and (t > 0).all()):
                raise ValueError("scales must be positive and finite")
            out.append(t.detach().float().clone())
        return out[0], out[1]

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor):
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {end} tokens would exceed max_len={self.max_len}")
        for store, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            if self.granularity == "token":
                q = quantize_kv(x, self.fmt, "token")
                store[layer_idx, :, :, self.length:end] = q.codes
                scales[layer_idx, :, :, self.length:end] = q.scale
            else:
                y = x.float() / scales[layer_idx]
                self.saturated += int((y.abs() > FORMATS[self.fmt][0]).sum())
                store[layer_idx, :, :, self.length:end] = _encode(y, self.fmt)
        k_all = self.k[layer_idx, :, :, :end].float() * self._layer_scale(self.k_scale, layer_idx, end)
        v_all = self.v[layer_idx, :, :, :end].float() * self._layer_scale(self.v_scale, layer_idx, end)
        return k_all.to(k.dtype), v_all.to(v.dtype)

    def _layer_scale(self, scales: torch.Tensor, layer_idx: int, end: int) -> torch.Tensor:
        return scales[layer_idx, :, :, :end] if self.granularity == "token" else scales[layer_idx]

    @property
    def nbytes(self) -> float:
        """Bytes reserved, counting int4 codes packed two per byte, plus the float32 scales."""
        codes = 2 * self.k.numel() * FORMATS[self.fmt][1]
        return codes + 2 * self.k_scale.numel() * self.k_scale.element_size()


def logit_agreement(reference: torch.Tensor, other: torch.Tensor) -> dict[str, float]:
    """Compare two runs' logits ``[..., vocab]`` position by position.

    Returns the largest absolute logit difference, the mean KL divergence
    KL(reference || other) of the next-token distributions (nats), and the
    fraction of positions where both pick the same greedy token.
    """
    if not isinstance(reference, torch.Tensor) or not isinstance(other, torch.Tensor):
        raise TypeError("logit_agreement expects two torch.Tensors of logits")
    if reference.shape != other.shape:
        raise ValueError(f"logits must have the same shape, got {tuple(reference.shape)} and {tuple(other.shape)}")
    if reference.dim() < 1 or reference.numel() == 0:
        raise ValueError("logits are empty; compare at least one position")
    ref, oth = reference.float().reshape(-1, reference.shape[-1]), other.float().reshape(-1, other.shape[-1])
    lp_ref, lp_oth = torch.log_softmax(ref, -1), torch.log_softmax(oth, -1)
    kl = (lp_ref.exp() * (lp_ref - lp_oth)).sum(-1)
    return {"max_abs_diff": (ref - oth).abs().max().item(),
            "mean_kl": kl.mean().item(),
            "top1_agreement": (ref.argmax(-1) == oth.argmax(-1)).float().mean().item()}
