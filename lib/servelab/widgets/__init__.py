"""ipywidgets labs: thin faces over the pure calculators.

Each lab is a function returning a widget; its numbers come from the library
(:mod:`servelab.kvcache` and friends), never from the widget code itself.
"""
from servelab.widgets.kv_lab import kv_calculator_lab

__all__ = ["kv_calculator_lab"]
