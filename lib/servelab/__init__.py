"""servelab: LLM serving internals you can run, measure and test.

Submodules load on first use (``servelab.kvcache``, ``servelab.bpe`` ...), so
``import servelab`` stays cheap and the calculators never pull in torch.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = {
    "specs", "arith", "kvcache", "roofline", "cost", "pool", "bpe", "model",
    "attention", "sampling", "paged", "prefix_cache", "engine", "server",
    "speculative", "quant", "parallel", "moe", "sim", "fleet", "widgets",
    "grading", "generation", "train", "machine", "corpus",
}

# Names re-exported at the top level, loaded lazily: name -> (module, attribute).
_EXPORTS = {
    "LLM": ("engine", "LLM"),
    "LLMEngine": ("engine", "LLMEngine"),
    "SamplingParams": ("sampling", "SamplingParams"),
    "generate": ("generation", "generate"),
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"servelab.{name}")
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(f"servelab.{module}"), attr)
    raise AttributeError(f"module 'servelab' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES) + list(_EXPORTS))
