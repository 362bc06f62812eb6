"""Labs for chapters 9 and 24: the step-time model and the cost of a chat.

Thin faces over :class:`servelab.roofline.Replica` and
:func:`servelab.cost.chat_cost`: every number shown comes from those functions.
"""
from __future__ import annotations

from servelab import cost, roofline
from servelab.widgets.common import tiles_html


def _tiles(pairs: list[tuple[str, str]]) -> str:
    return tiles_html(pairs, min_width=140)


def step_readout_html(replica: roofline.Replica, batch: int, context_tokens: int) -> str:
    """The step lab's tiles for one setting."""
    step = replica.step_seconds(batch, context_tokens)
    memory = replica.memory_seconds(batch, context_tokens)
    compute = replica.compute_seconds(batch)
    fits = replica.people(context_tokens)
    bound = "memory" if memory >= compute else "arithmetic"
    tiles = _tiles([
        ("step time", f"{step * 1e3:.1f} ms"),
        ("tokens/s per person", f"{1 / step:,.0f}"),
        ("tokens/s for the replica", f"{batch / step:,.0f}"),
        ("people whose caches fit", f"{fits:,}"),
        ("cache share of bytes read", f"{1 - replica.weights_bytes / (replica.weights_bytes + batch * context_tokens * replica.kv_bytes_per_token):.0%}"),
        ("the step waits on", bound),
    ])
    note = ("" if batch <= fits else
            f"<p style='color:#a00'>Only {fits:,} caches of {context_tokens:,} tokens fit: the other "
            f"{batch - fits:,} people wait in the queue.</p>")
    return tiles + note


def step_time_lab(batch: int = 128, context_tokens: int = 8000, bandwidth_efficiency: float = 0.6,
                  overhead_ms: float = 2.0, replica: roofline.Replica = roofline.EXAMPLE_REPLICA):
    """Sliders for the step-time model: people, conversation length, efficiency, overhead."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    import numpy as np
    from IPython.display import display

    style = {"description_width": "190px"}
    layout = w.Layout(width="500px")
    knobs = {
        "batch": w.IntSlider(value=batch, min=1, max=1024, description="People in the step", style=style,
                             layout=layout, continuous_update=False),
        "context_tokens": w.IntSlider(value=context_tokens, min=0, max=200_000, step=1000,
                                      description="Tokens per conversation", style=style, layout=layout,
                                      continuous_update=False),
        "bandwidth_efficiency": w.FloatSlider(value=bandwidth_efficiency, min=0.1, max=1.0, step=0.05,
                                              description="Share of peak bandwidth", style=style, layout=layout,
                                              continuous_update=False),
        "overhead_ms": w.FloatSlider(value=overhead_ms, min=0.0, max=10.0, step=0.5,
                                     description="Overhead per step (ms)", style=style, layout=layout,
                                     continuous_update=False),
    }
    tiles = w.HTML()
    chart = w.Output()

    def refresh(_=None):
        r = replica.with_(bandwidth_efficiency=knobs["bandwidth_efficiency"].value,
                          overhead_s=knobs["overhead_ms"].value / 1e3)
        b, ctx = knobs["batch"].value, knobs["context_tokens"].value
        tiles.value = step_readout_html(r, b, ctx)
        with chart:
            chart.clear_output(wait=True)
            batches = np.unique(np.geomspace(1, 1024, 40).astype(int))
            fig, ax = plt.subplots(figsize=(7, 2.8))
            ax.plot(batches, [r.step_seconds(int(x), ctx) * 1e3 for x in batches], label="step (ms)")
            ax2 = ax.twinx()
            ax2.plot(batches, [r.replica_tokens_per_s(int(x), ctx) for x in batches], color="tab:orange",
                     label="replica tokens/s")
            ax.axvline(b, color="gray", ls=":")
            ax.set(xscale="log", xlabel="people in the step", ylabel="step (ms)")
            ax2.set_ylabel("replica tokens/s", color="tab:orange")
            display(fig)
            plt.close(fig)

    for knob in knobs.values():
        knob.observe(refresh, names="value")
    refresh()
    return w.VBox([w.HTML(f"<b>The step-time model</b> ({replica.num_chips} x {replica.chip.name}, "
                          f"{replica.weights_bytes / 1e9:.0f} GB of weights)"), *knobs.values(), tiles, chart])


def cost_readout_html(c: cost.ChatCost) -> str:
    return _tiles([
        ("chip-seconds per chat", f"{c.chip_s:.2f}"),
        ("cost per chat", f"${c.usd_per_chat:.4f}"),
        ("per million fresh input tokens", f"${c.input_usd_per_million:.2f}"),
        ("per million output tokens", f"${c.output_usd_per_million:.2f}"),
        ("people sharing each step", f"{c.batch}"),
    ])


def chat_cost_lab(conversation_tokens: int = 8000, reply_tokens: int = 500, cached_share: float = 0.5,
                  price_per_chip_hour: float | None = None):
    """Four knobs of chapter 24 -> chip time and dollars per chat."""
    import ipywidgets as w

    price = price_per_chip_hour or cost.CHIP_HOURLY_USD[roofline.EXAMPLE_REPLICA.chip.name]
    style = {"description_width": "190px"}
    layout = w.Layout(width="500px")
    knobs = {
        "conversation_tokens": w.IntSlider(value=conversation_tokens, min=500, max=200_000, step=500,
                                           description="Conversation (tokens sent)", style=style, layout=layout,
                                           continuous_update=False),
        "reply_tokens": w.IntSlider(value=reply_tokens, min=10, max=8000, step=10, description="Reply (tokens)",
                                    style=style, layout=layout, continuous_update=False),
        "cached_share": w.FloatSlider(value=cached_share, min=0.0, max=1.0, step=0.05,
                                      description="Cached share of the prompt", style=style, layout=layout,
                                      continuous_update=False),
        "price_per_chip_hour": w.FloatSlider(value=price, min=0.5, max=15.0, step=0.25,
                                             description="Chip rental ($/hour)", style=style, layout=layout,
                                             continuous_update=False),
    }
    tiles = w.HTML()

    def refresh(_=None):
        tiles.value = cost_readout_html(cost.chat_cost(**{k: v.value for k, v in knobs.items()}))

    for knob in knobs.values():
        knob.observe(refresh, names="value")
    refresh()
    return w.VBox([w.HTML("<b>What a chat costs in chip time</b>"), *knobs.values(), tiles])
