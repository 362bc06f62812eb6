"""The labs build, show the library's numbers, and react to their knobs."""
import pytest

pytest.importorskip("ipywidgets")

from servelab import kvcache, pool  # noqa: E402
from servelab.widgets import kv_calculator_lab  # noqa: E402
from servelab.widgets.pool_lab import pool_lab  # noqa: E402


def _html(widget):
    out = []
    for child in getattr(widget, "children", ()):
        out.append(getattr(child, "value", "") if isinstance(getattr(child, "value", None), str) else "")
        out.append(_html(child))
    return " ".join(out)


def test_kv_lab_shows_the_calculator_and_follows_its_knobs():
    lab = kv_calculator_lab()
    assert "131,072 bytes" in _html(lab) and "16 of 16" in _html(lab)
    knobs = {getattr(c, "description", ""): c for c in lab.children}
    knobs["Cache storage"].value = "fp8"
    assert "65,536 bytes" in _html(lab)
    knobs["Model tier"].value = "large"
    knobs["Sequence length"].value = 32_000
    granted = kvcache.kv_calculator("large", "fp8", 32_000, 16).seats_granted
    assert f"{granted} of 16" in _html(lab)


def test_pool_lab_defaults_failures_and_fixes():
    lab = pool_lab()
    text = _html(lab)
    assert "1,698 tok/s" in text and "$2,913" in text and "27 ms" in text
    failures, fix = next(c for c in lab.children if c.__class__.__name__ == "HBox").children
    failures.value = "long prompts"
    assert "capacity FAIL" in _html(lab)
    fix.click()
    broken, fixed = pool.famous_failure("long prompts")
    assert "capacity pass" in _html(lab) and f"${fixed.monthly_usd:,.0f}" in _html(lab)
