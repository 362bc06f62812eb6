"""Names a module re-exports from other modules, imported only when first asked for.

``__getattr__, __dir__ = lazy_exports(__name__, {"name": "servelab.where", ...})``
at a module's end makes ``module.name`` (and ``from module import name``) import
``servelab.where`` on first use: how :mod:`servelab.quant` and
:mod:`servelab.kernels` stay torch-free until a torch name is asked for.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(module: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """A module-level ``__getattr__`` and ``__dir__`` for ``module`` serving ``exports`` (name -> module path)."""
    exports = dict(exports)

    def __getattr__(name: str):
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where), name)

    def __dir__() -> list:
        return sorted(set(vars(sys.modules[module])) | set(exports))

    return __getattr__, __dir__
