"""The prefix lab of chapter 13: a shared preamble, cached or edited, priced at H100 scale.

Every number comes from :func:`servelab.cost.prefix_readout` (the KV calculator's
replica: its model tier, cards and cache format); the widget only lays it out.
"""
from __future__ import annotations

from servelab import cost, kvcache
from servelab.widgets.common import tiles_with_deltas_html

PREFIX_DEFAULTS = {"tier": "small", "preamble_tokens": 1200, "question_tokens": 24, "cache_dtype": "bf16"}


def prefix_readout_html(p: cost.PrefixReadout, base: cost.PrefixReadout) -> str:
    """Tiles for one setting, each with its change against the defaults, and one sentence."""
    tiles = tiles_with_deltas_html([
        ("first token, preamble cached", f"{p.cached_ttft_s * 1e3:,.1f} ms", p.cached_ttft_s, base.cached_ttft_s),
        ("first token, preamble edited", f"{p.edited_ttft_s * 1e3:,.0f} ms", p.edited_ttft_s, base.edited_ttft_s),
        ("chip-seconds a hit saves", f"{p.chip_s_saved:.3f}", p.chip_s_saved, base.chip_s_saved),
        ("$ saved per million requests", f"${p.usd_saved_per_million_requests:,.0f}",
         p.usd_saved_per_million_requests, base.usd_saved_per_million_requests),
        ("KV memory the preamble holds", f"{p.preamble_kv_bytes / 1e9:.2f} GB", p.preamble_kv_bytes,
         base.preamble_kv_bytes),
    ], min_width=170)
    sentence = (f"On the {p.tier} ({p.num_chips} card{'s' * (p.num_chips > 1)}), a hit skips "
                f"{p.preamble_tokens:,} tokens of prefill: the first token comes {p.speedup:.0f}x sooner, and "
                f"the preamble's cache costs {p.preamble_share_of_room:.1%} of the KV room while it is kept. "
                f"One edited token at its start misses every block.")
    return tiles + f"<p style='margin-top:8px'>{sentence}</p>"


def prefix_lab(tier: str = "small", preamble_tokens: int = 1200, question_tokens: int = 24,
               cache_dtype: str = "bf16"):
    """Knobs: model tier, preamble and question length, cache format -> first token and price, hit vs edit."""
    import ipywidgets as w

    style = {"description_width": "190px"}
    layout = w.Layout(width="500px")
    knobs = {
        "tier": w.Dropdown(options=[(t.label, key) for key, t in kvcache.TIERS.items()], value=tier,
                           description="Model tier", style=style, layout=layout),
        "preamble_tokens": w.IntSlider(value=preamble_tokens, min=100, max=32_000, step=100,
                                       description="Shared preamble (tokens)", style=style, layout=layout,
                                       continuous_update=False),
        "question_tokens": w.IntSlider(value=question_tokens, min=1, max=2000, description="Question (tokens)",
                                       style=style, layout=layout, continuous_update=False),
        "cache_dtype": w.ToggleButtons(options=["bf16", "fp8"], value=cache_dtype, description="Cache storage",
                                       style=style),
    }
    base = cost.prefix_readout(**PREFIX_DEFAULTS)
    out = w.HTML()

    def refresh(_=None):
        out.value = prefix_readout_html(cost.prefix_readout(**{k: v.value for k, v in knobs.items()}), base)

    for knob in knobs.values():
        knob.observe(refresh, names="value")
    refresh()
    return w.VBox([w.HTML("<b>The prefix lab at H100 scale</b> (the KV calculator's replica, prefill at "
                          "the running example's efficiency)"), *knobs.values(), out])
