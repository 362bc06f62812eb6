"""Fused projections: several ``nn.Linear`` that read one input, multiplied as one matrix.

:class:`FusedLinears` stores Q, K and V (or the MLP's gate and up) as one
matrix whose rows the original linears keep as views, and the helpers below
use a fusion only while it is current (rebuilt after ``.to(dtype)`` or a
weight swap). :mod:`servelab.model` calls them; ``from servelab.model import
FusedLinears`` keeps working.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FusedLinears", "fusable", "store_column_major", "is_column_major"]


class FusedLinears:
    """Several ``nn.Linear`` that read the same input, stored as one matrix.

    Serving engines multiply Q, K and V (and the MLP's gate and up) in one
    matmul: the input is read once, one kernel runs instead of three, and one
    long matrix streams from memory. The fused matrix *is* the storage: each
    original ``weight`` becomes a view of its rows, so nothing is copied,
    ``state_dict`` names and values stay Hugging Face's, and an optimizer step
    or ``load_state_dict`` (which copies into the parameters) updates both at once.

    It can never go stale: :func:`_apply_linears` checks before every use that
    the linears still hold views of it (:meth:`is_current`). After
    ``model.to(dtype)`` or a weight swap (``q_proj.weight = ...``) the
    parameters are new tensors, and the fusion is rebuilt from them. Only plain
    ``nn.Linear`` are fused: if one projection of the group is anything else (a
    quantized linear, a tensor-parallel wrapper), the group runs one by one.

    ``column_major=True`` stores the fused matrix transposed in memory (same
    shape and values, strides ``(1, out)``): see :func:`column_major`.
    """

    def __init__(self, linears, column_major: bool = False):
        if not fusable(linears):
            raise TypeError(f"only plain nn.Linear can be fused, got {[type(l).__name__ for l in linears]}")
        self.column_major = bool(column_major)
        with torch.no_grad():
            self.weight = torch.cat([l.weight for l in linears])
            if self.column_major:
                self.weight = _to_column_major(self.weight)
            has_bias = linears[0].bias is not None
            self.bias = torch.cat([l.bias for l in linears]) if has_bias else None
            self.sizes = [l.out_features for l in linears]
            row = 0
            for l, n in zip(linears, self.sizes):
                l.weight = nn.Parameter(self.weight[row:row + n], requires_grad=l.weight.requires_grad)
                if has_bias:
                    l.bias = nn.Parameter(self.bias[row:row + n], requires_grad=l.bias.requires_grad)
                row += n
        self._linears = tuple(linears)
        self._pointers = [self._pointer(l) for l in linears]

    @staticmethod
    def _pointer(linear):
        # a new dtype or device, load_state_dict(assign=True) or a swapped Parameter
        # all mean new storage: the data pointers say it all
        return linear.weight.data_ptr(), None if linear.bias is None else linear.bias.data_ptr()

    def is_current(self, linears) -> bool:
        """True while these very linears still hold views of this fused matrix.

        Checked before every use, so it must be cheap (a batch-1 step calls it
        twice per layer): the parameters are read from ``_parameters`` directly,
        skipping ``nn.Module.__getattr__``'s slower lookup.
        """
        if len(linears) != len(self._linears):
            return False
        for l, ref, (weight_ptr, bias_ptr) in zip(linears, self._linears, self._pointers):
            if l is not ref:
                return False
            params = l._parameters
            bias = params.get("bias")
            if (params["weight"].data_ptr() != weight_ptr
                    or (None if bias is None else bias.data_ptr()) != bias_ptr):
                return False
        return True

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)


def _to_column_major(w: torch.Tensor) -> torch.Tensor:
    """The same ``[out, in]`` matrix stored transposed: ``w.t().contiguous().t()``."""
    return w.t().contiguous().t()


def is_column_major(w: torch.Tensor) -> bool:
    """True for a 2-D matrix stored transposed (each column contiguous)."""
    return w.dim() == 2 and w.stride(0) == 1 and w.stride(1) == w.shape[0] and w.shape[0] > 1


def store_column_major(linear: nn.Linear) -> nn.Linear:
    """Store ``linear.weight`` transposed in memory (same shape, values and gradients).

    ``F.linear`` multiplies by ``weight.t()``; stored column-major, that is a
    plain row-major ``[in, out]`` matrix and a batch-1 step's mat-vec streams it
    as long rows of ``out`` numbers. Stored the usual way, the mat-vec takes a
    dot product per output over rows of only ``in`` numbers, and on the CPUs
    this course measured that kernel read small models' matrices far below the
    memory bandwidth (``benchmarks/results/engine.md``). Returns the linear.
    """
    if not is_column_major(linear.weight):
        with torch.no_grad():
            linear.weight = nn.Parameter(_to_column_major(linear.weight.detach()),
                                         requires_grad=linear.weight.requires_grad)
    return linear


def fusable(linears) -> bool:
    """Plain ``nn.Linear`` with biases all present or all absent (nothing else is fused)."""
    return (all(type(l) is nn.Linear for l in linears)
            and len({l.bias is None for l in linears}) == 1)


def _refused(current, linears, column_major: bool):
    """The fusion a ``fuse()`` call leaves: a new :class:`FusedLinears` for plain
    linears; for other modules (quantized ones), the group's existing fusion if it
    still holds these very modules (a quantized fusion made by ``servelab.quant``),
    else none."""
    if fusable(linears):
        return FusedLinears(linears, column_major)
    keep = current is not None and not isinstance(current, FusedLinears)
    return current if keep and current.is_current(linears) else None


def _current_fusion(owner: nn.Module, attr: str, linears):
    """The group's fusion (``owner.<attr>``), rebuilt first if it went stale (after
    ``.to(dtype)`` or a weight swap), or None once the group is no longer all plain
    ``nn.Linear``: so a fusion can never be used with old weights."""
    fused = getattr(owner, attr)
    if fused is None or fused.is_current(linears):
        return fused
    fresh = None
    if fusable(linears):
        with torch.inference_mode(False), torch.no_grad():
            fresh = FusedLinears(linears, column_major=getattr(fused, "column_major", False))
    setattr(owner, attr, fresh)
    return fresh


def _fused_output(owner: nn.Module, attr: str, linears, x):
    """The fused group's whole output ``[..., sum(out)]`` in one matmul, or None when
    the group is not a :class:`FusedLinears` (or training): then call :func:`_apply_linears`."""
    fused = getattr(owner, attr)
    if not isinstance(fused, FusedLinears) or torch.is_grad_enabled():
        return None  # unfused, or another kind of fusion (a quantized one): its own __call__
    if not torch.compiler.is_compiling():  # a compiled step's runner called refresh_fusions()
        fused = _current_fusion(owner, attr, linears)
        if fused is None:
            return None
    return F.linear(x, fused.weight, fused.bias)


def _apply_linears(owner: nn.Module, attr: str, linears, x):
    """Each linear applied to ``x``: in one fused matmul when the group is fused, else one by one.

    A stale fusion is rebuilt first (:func:`_current_fusion`); a group that is no
    longer all plain ``nn.Linear`` runs one by one. Training always takes the
    separate linears, so each weight gets its own gradient.
    """
    fused = None if torch.is_grad_enabled() else _current_fusion(owner, attr, linears)
    return [l(x) for l in linears] if fused is None else fused(x)
