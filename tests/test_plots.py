"""Shared plots: what a reader sees is legible (no label printed over another)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from servelab import kvcache  # noqa: E402
from servelab.plots import plot_memory_ledger  # noqa: E402


def test_memory_ledger_legend_clears_the_axis_label():
    for fig_ax in (None, plt.subplots(figsize=(8, 2.3))[1]):  # the chapter's call and the lab's
        ax = plot_memory_ledger(kvcache.kv_calculator(), fig_ax)
        fig = ax.figure
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legend = fig.legends[0].get_window_extent(renderer)
        label = ax.xaxis.label.get_window_extent(renderer)
        ticks = ax.xaxis.get_tightbbox(renderer)
        assert not legend.overlaps(label) and legend.y1 <= ticks.y0
        assert len(fig.legends[0].get_texts()) == 4  # weights, cache in use, free room, margin
        plt.close(fig)
