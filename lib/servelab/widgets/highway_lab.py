"""The request-highway lab of chapter 22: edge cache, guardrails, rate limiter, pool.

A surge dial multiplies the traffic and an outage switch takes a replica down;
the readouts (admitted, rejected, queued, p95 TTFT) and the per-minute plot come
from :func:`servelab.fleet.highway`.
"""
from __future__ import annotations

import numpy as np

from servelab import fleet
from servelab.widgets.common import tiles_html


def highway_html(r: fleet.HighwayReadout) -> str:
    tiles = tiles_html([
        ("offered", f"{r.offered:,}"),
        ("edge cache", f"{r.edge_hits:,}"),
        ("guardrails blocked", f"{r.blocked:,}"),
        ("rate-limited (429)", f"{r.rejected:,}"),
        ("admitted to the pool", f"{r.admitted:,}"),
        ("longest queue", f"{r.max_queue:,}"),
        ("TTFT p95", f"{r.ttft_p95_s * 1e3:,.0f} ms" if r.ttft_p95_s < 10 else f"{r.ttft_p95_s:,.0f} s"),
    ], min_width=120)
    return f"{tiles}<p>{r.replicas_up} replica(s) up.</p>"


def highway_figure(r: fleet.HighwayReadout, slo_s: float = 1.2):
    import matplotlib.pyplot as plt
    minutes = np.arange(len(r.minute_admitted))
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    ax.bar(minutes, r.minute_admitted, color="#9bc", label="admitted per minute")
    ax.set(xlabel="minute", ylabel="requests")
    ax2 = ax.twinx()
    ax2.plot(minutes, r.minute_p95_s * 1e3, "-o", color="#c33", label="TTFT p95")
    ax2.axhline(slo_s * 1e3, color="#c33", ls="--", lw=1)
    ax2.set(yscale="log", ylabel="TTFT p95 (ms)")
    fig.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def highway_lab(**kwargs):
    """Surge dial and outage switch over :func:`servelab.fleet.highway` (keyword args pass through)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    style = {"description_width": "120px"}
    surge = w.FloatSlider(value=1.0, min=0.5, max=3.0, step=0.25, description="Surge (x traffic)",
                          style=style, continuous_update=False)
    outage = w.Checkbox(value=False, description="Outage: one replica down")
    readout = w.HTML()
    plot = w.Output()

    def refresh(_=None):
        r = fleet.highway(surge.value, outage.value, **kwargs)
        readout.value = highway_html(r)
        plot.clear_output(wait=True)
        with plot:
            fig = highway_figure(r)
            plt.show()
            plt.close(fig)

    surge.observe(refresh, names="value")
    outage.observe(refresh, names="value")
    refresh()
    return w.VBox([w.HTML("<b>The request highway</b>: edge cache &rarr; guardrails &rarr; rate limiter "
                          "&rarr; pool"), w.HBox([surge, outage]), readout, plot])
