"""Plot helpers shared by chapters and labs (matplotlib is imported on first use)."""
from __future__ import annotations

from servelab.kvcache import KVReadout

LEDGER_COLOURS = {"weights": "#4c72b0", "KV cache in use": "#dd8452",
                  "free KV room": "#55a868", "safety margin": "#c7c7c7"}


def plot_memory_ledger(readout: KVReadout, ax=None):
    """One horizontal bar: the cards' memory split into weights, cache, free room, margin."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.3))
    left = 0.0
    for label, size in readout.ledger():
        gb = size / 1e9
        ax.barh(0, gb, left=left, color=LEDGER_COLOURS[label], edgecolor="white",
                label=f"{label} ({gb:.1f} GB)")
        left += gb
    ax.set_xlim(0, readout.memory_bytes / 1e9)
    ax.set_yticks([])
    ax.set_xlabel(f"GB on {readout.num_chips} card{'s' * (readout.num_chips > 1)}")
    ax.set_title(f"{readout.tier}: {readout.seats_granted} of {readout.requested} seats granted "
                 f"at {readout.seq_len:,} tokens ({readout.cache_dtype} cache)", fontsize=10)
    # The legend sits in its own strip under the axis label, so the two never overlap.
    fig = ax.figure
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return ax
