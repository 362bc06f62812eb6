"""The KV cache calculator lab of chapter 11.

Every number and sentence comes from :mod:`servelab.kvcache` (readouts, the
binding constraint, the ledger's lines, deltas against the defaults, which
changes mattered) and :func:`servelab.cost.prefix_readout` (the first token
with the preamble cached or edited); the widget only lays them out.
"""
from __future__ import annotations

from html import escape

from servelab import cost, kvcache
from servelab.kvcache import KVReadout
from servelab.widgets.common import tiles_html

DEFAULT_PREAMBLE = 2000


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


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    head = "".join(f"<th style='text-align:left;padding:2px 10px'>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='padding:2px 10px'>{escape(str(c))}</td>" for c in row)
                   + "</tr>" for row in rows)
    return f"<table style='font-size:12px;border-collapse:collapse'><tr>{head}</tr>{body}</table>"


def analysis_html(settings: dict, preamble_tokens: int = DEFAULT_PREAMBLE) -> str:
    """Everything below the tiles for one setting: sentence, deltas, ledger, first token, what mattered."""
    r = kvcache.kv_calculator(**settings)
    base = kvcache.kv_calculator(**kvcache.LAB_DEFAULTS)
    parts = [f"<p><b>{escape(kvcache.binding_constraint(r))}</b></p>",
             _table(kvcache.readout_deltas(r, base), ("readout", "now", "vs defaults")),
             "<p style='margin:6px 0 2px'><b>The ledger</b></p><ul style='margin:0'>"
             + "".join(f"<li>{escape(line)}</li>" for line in kvcache.ledger_lines(r)) + "</ul>"]
    p = cost.prefix_readout(settings["tier"], preamble_tokens, 50, settings["cache_dtype"],
                            num_chips=settings.get("num_chips"))
    parts.append(f"<p>A {p.preamble_tokens:,}-token shared preamble and a {p.question_tokens}-token question: "
                 f"first token in {p.cached_ttft_s * 1e3:,.1f} ms with the preamble cached, "
                 f"{p.edited_ttft_s * 1e3:,.0f} ms after one edited token at its start ({p.speedup:.0f}x); "
                 f"keeping it costs {p.preamble_kv_bytes / 1e9:.2f} GB, {p.preamble_share_of_room:.1%} of "
                 f"the room.</p>")
    mattered = kvcache.what_mattered(settings)
    if mattered:
        rows = [(knob, was, now, f"{alone} seats", verdict) for knob, was, now, alone, verdict in mattered]
        parts.append("<p style='margin:6px 0 2px'><b>What mattered vs noise</b> (each change alone, "
                     f"from the defaults' {base.seats_granted} seats)</p>"
                     + _table(rows, ("knob", "default", "now", "alone", "verdict")))
    return "".join(parts)


def kv_calculator_lab(tier: str = "small", cache_dtype: str = "bf16", seq_len: int = 4000,
                      concurrent: int = 16, num_chips: int | None = None,
                      preamble_tokens: int = DEFAULT_PREAMBLE):
    """Knobs (model tier, cache dtype, length, requests, cards, preamble) and presets -> readouts + ledger."""
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
        "num_chips": w.Dropdown(options=[("the tier's own", None), ("1", 1), ("2", 2), ("4", 4), ("8", 8)],
                                value=num_chips, description="Cards", style=style, layout=layout),
    }
    preamble = w.IntSlider(value=preamble_tokens, min=100, max=32_000, step=100,
                           description="Shared preamble (tokens)", style=style, layout=layout,
                           continuous_update=False)
    presets = w.Dropdown(options=list(kvcache.KV_PRESETS), description="Preset", style=style, layout=layout)
    load = w.Button(description="Load")
    tiles = w.HTML()
    analysis = w.HTML()
    chart = w.Output()

    state = {"loading": False}

    def refresh(_=None):
        if state["loading"]:
            return
        settings = {name: knob.value for name, knob in knobs.items()}
        try:
            r = kvcache.kv_calculator(**settings)
        except ValueError as exc:
            tiles.value = f"<p style='color:#a00'>{escape(str(exc))}</p>"
            analysis.value = ""
            return
        tiles.value = readout_html(r)
        analysis.value = analysis_html(settings, preamble.value)
        with chart:
            chart.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(8, 2.3))
            plot_memory_ledger(r, ax)
            display(fig)
            plt.close(fig)

    def load_preset(_=None):
        settings = kvcache.preset(presets.value)
        state["loading"] = True
        try:
            for name, knob in knobs.items():
                knob.value = settings[name]
        finally:
            state["loading"] = False
        refresh()

    for knob in (*knobs.values(), preamble):
        knob.observe(refresh, names="value")
    load.on_click(load_preset)
    refresh()
    return w.VBox([w.HTML("<b>The KV cache calculator</b>"), w.HBox([presets, load]), *knobs.values(), preamble,
                   tiles, analysis, chart])
