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


def test_kv_lab_presets_load_a_failure_and_its_fixes():
    lab = kv_calculator_lab()
    text = _html(lab)
    assert "Memory does not bind" in text and "vs defaults" in text and "Weights: 16.0 GB" in text
    presets, load = next(c for c in lab.children if c.__class__.__name__ == "HBox").children
    presets.value = "failure: 70B class at 32,000 tokens"
    load.click()
    text = _html(lab)
    assert "1 of 16" in text and "Memory binds" in text and "15 of 16 requests wait" in text
    assert "mattered" in text                      # what mattered vs noise is listed
    presets.value = "fix 2: the same on four cards"
    load.click()
    assert "16 of 16" in _html(lab)
    knobs = {getattr(c, "description", ""): c for c in lab.children}
    knobs["Cards"].value = 1                       # the 70B class cannot fit on one card
    assert "do not fit in 80.0 GB" in _html(lab)


def test_kv_lab_shows_the_edited_preamble_first_token():
    from servelab import cost
    lab = kv_calculator_lab(preamble_tokens=4000)
    p = cost.prefix_readout("small", 4000, 50, "bf16")
    assert f"{p.cached_ttft_s * 1e3:,.1f} ms with the preamble cached" in _html(lab)


def test_prefix_lab_prices_a_hit_and_follows_its_knobs():
    from servelab import cost
    from servelab.widgets.prefix_lab import prefix_lab
    lab = prefix_lab()
    p = cost.prefix_readout("small", 1200, 24)
    text = _html(lab)
    assert f"{p.cached_ttft_s * 1e3:,.1f} ms" in text and "same vs defaults" in text
    knobs = {getattr(c, "description", ""): c for c in lab.children}
    knobs["Model tier"].value = "large"
    big = cost.prefix_readout("large", 1200, 24)
    assert f"{big.edited_ttft_s * 1e3:,.0f} ms" in _html(lab) and "2 cards" in _html(lab)


def test_step_lab_defaults_presets_and_deltas():
    from servelab import roofline
    from servelab.widgets import roofline_labs as L
    assert L.step_readout(L.step_settings())["step_ms"] == roofline.EXAMPLE_REPLICA.step_seconds(128, 8000) * 1e3
    lab = L.step_time_lab()
    assert "11.6 ms" in _html(lab) and "same vs defaults" in _html(lab)
    presets, load = next(c for c in lab.children if c.__class__.__name__ == "HBox").children
    presets.value = "the same on 8 H100s"
    load.click()
    h100 = L.step_readout(L.step_settings(chip="H100 SXM"))
    assert f"{h100['step_ms']:.1f} ms" in _html(lab) and "x vs defaults" in _html(lab)
    presets.value = "128 people at 128,000 tokens (memory binds)"
    load.click()
    assert "wait in the queue" in _html(lab)
    knobs = {getattr(c, "description", ""): c for c in lab.children}
    knobs["Weight format"].value = "fp4"          # H100 has no fp4 units: computes in fp8
    assert L.step_replica(L.step_settings(chip="H100 SXM", weight_dtype="fp4")).dtype == "fp8"
