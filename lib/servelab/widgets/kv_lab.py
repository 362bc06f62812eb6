"""The KV cache calculator lab of chapter 11."""
from __future__ import annotations

from servelab import kvcache
from servelab.kvcache import KVReadout
from servelab.widgets.common import tiles_html


def readout_html(r: KVReadout) -> str:
    """The lab's readout tiles as HTML."""
    tiles = [
        ("one cached token", f"{r.bytes_per_token:,.0f} bytes"),
        ("one seat's cache", f"{r.seat_bytes / 1e9:.2f} GB"),
        (f"seats granted (room for {r.seats_fit:,})", f"{r.seats_granted} of {r.requested}"),
        ("cache share of the weights", f"{r.cache_share_of_weights:.0%}"),
        ("longest sequence the room holds", f"{r.max_sequence_tokens / 1e3:,.0f}k tokens"),
        ("one sequence outweighs the model at", f"{r.outweigh_tokens / 1e3:,.0f}k tokens"),
    ]
    verdict = (f"Memory grants all {r.requested} requested seats: {r.cache_in_use_bytes / 1e9:.1f} GB of cache "
               f"against {r.room_bytes / 1e9:.1f} GB of room." if r.waiting == 0 else
               f"Memory grants only {r.seats_granted} of {r.requested} seats; {r.waiting} wait in the queue, "
               f"with no error anywhere.")
    return tiles_html(tiles) + f"<p style='margin-top:8px'>{verdict}</p>"


def kv_calculator_lab(tier: str = "small", cache_dtype: str = "bf16", seq_len: int = 4000,
                      concurrent: int = 16):
    """Four knobs (model tier, cache dtype, sequence length, concurrent requests) -> readouts + ledger."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    from servelab.plots import plot_memory_ledger

    style = {"description_width": "170px"}
    layout = w.Layout(width="480px")
    knobs = {
        "tier": w.Dropdown(options=[(t.label, key) for key, t in kvcache.TIERS.items()], value=tier,
                           description="Model tier", style=style, layout=layout),
        "cache_dtype": w.ToggleButtons(options=["bf16", "fp8"], value=cache_dtype, description="Cache storage",
                                       style=style),
        "seq_len": w.IntSlider(value=seq_len, min=500, max=128_000, step=500, description="Sequence length",
                               style=style, layout=layout, continuous_update=False),
        "concurrent": w.IntSlider(value=concurrent, min=1, max=256, description="Concurrent requests",
                                  style=style, layout=layout, continuous_update=False),
    }
    tiles = w.HTML()
    chart = w.Output()

    def refresh(_=None):
        r = kvcache.kv_calculator(**{name: knob.value for name, knob in knobs.items()})
        tiles.value = readout_html(r)
        with chart:
            chart.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(8, 2.3))
            plot_memory_ledger(r, ax)
            display(fig)
            plt.close(fig)

    for knob in knobs.values():
        knob.observe(refresh, names="value")
    refresh()
    return w.VBox([w.HTML("<b>The KV cache calculator</b>"), *knobs.values(), tiles, chart])
