"""Small pieces every lab shares."""
from __future__ import annotations


def tiles_html(pairs: list[tuple[str, str]], min_width: int = 150) -> str:
    """Readout tiles (label above a large value) as one flex row of HTML."""
    cells = "".join(
        f"<div style='border:1px solid #ccc;border-radius:6px;padding:6px 10px;min-width:{min_width}px'>"
        f"<div style='font-size:11px;color:#555'>{label}</div>"
        f"<div style='font-size:18px;font-weight:600'>{value}</div></div>" for label, value in pairs)
    return f"<div style='display:flex;flex-wrap:wrap;gap:8px'>{cells}</div>"


def delta_text(value: float, base: float) -> str:
    """How ``value`` compares with the default ``base``: "same", "1.25x" or "new"."""
    if value == base:
        return "same"
    if base == 0:
        return "new"
    return f"{value / base:.2f}x"


def tiles_with_deltas_html(rows: list[tuple[str, str, float, float]], min_width: int = 150) -> str:
    """Tiles whose label carries the change against the defaults: (label, shown, value, default)."""
    return tiles_html([(f"{label} ({delta_text(value, base)} vs defaults)", shown)
                       for label, shown, value, base in rows], min_width)
