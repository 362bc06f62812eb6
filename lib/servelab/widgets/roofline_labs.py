"""Labs for chapters 9 and 24: the step-time model and the cost of a chat.

Thin faces over :class:`servelab.roofline.Replica` and
:func:`servelab.cost.chat_cost`: every number shown comes from those functions.
"""
from __future__ import annotations

from servelab import cost, roofline
from servelab.widgets.common import tiles_html, tiles_with_deltas_html


def _tiles(pairs: list[tuple[str, str]]) -> str:
    return tiles_html(pairs, min_width=140)


#: The step lab's starting knobs: the 200B running example.
STEP_DEFAULTS: dict[str, object] = {
    "chip": roofline.EXAMPLE_REPLICA.chip.name, "num_chips": roofline.EXAMPLE_REPLICA.num_chips,
    "weight_dtype": "fp8", "batch": 128, "context_tokens": 8000,
    "bandwidth_efficiency": roofline.EXAMPLE_REPLICA.bandwidth_efficiency,
    "compute_efficiency": roofline.EXAMPLE_REPLICA.compute_efficiency,
    "overhead_ms": roofline.EXAMPLE_REPLICA.overhead_s * 1e3,
}

#: Presets: changes from the defaults, each a question the model answers.
STEP_PRESETS: dict[str, dict[str, object]] = {
    "the 200B running example (8 B200s, fp8)": {},
    "the same on 8 H100s": {"chip": "H100 SXM"},
    "bf16 weights: twice the bytes per step": {"weight_dtype": "bf16"},
    "fp4 weights on B200": {"weight_dtype": "fp4"},
    "one person alone": {"batch": 1},
    "128 people at 128,000 tokens (memory binds)": {"context_tokens": 128_000},
    "a poorly tuned engine (30% bandwidth, 5 ms overhead)": {"bandwidth_efficiency": 0.3, "overhead_ms": 5.0},
}

STEP_CHIPS = ("B200", "H200", "H100 SXM", "MI300X")
WEIGHT_DTYPES = ("fp4", "fp8", "bf16")


def step_settings(**changes: object) -> dict[str, object]:
    unknown = set(changes) - set(STEP_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown knob(s) {sorted(unknown)}; the knobs are {sorted(STEP_DEFAULTS)}")
    return {**STEP_DEFAULTS, **changes}


def step_replica(settings: dict[str, object], base: roofline.Replica = roofline.EXAMPLE_REPLICA) -> roofline.Replica:
    """The running example's model on the chosen chips, weight format and efficiencies.

    The arithmetic runs in the weight format when the chip lists a dense rate for
    it, else in the narrowest listed format above it (fp4 weights on a chip
    without fp4 units compute in fp8).
    """
    from servelab.arith import bytes_per_param
    from servelab.specs import get_chip

    chip = get_chip(str(settings["chip"]))
    fmt = str(settings["weight_dtype"])
    compute = next((f for f in (fmt, "fp8", "bf16") if f in chip.flops), "bf16")
    return base.with_(chip=chip, num_chips=int(settings["num_chips"]),
                      weights_bytes=base.num_params * bytes_per_param(fmt), dtype=compute,
                      bandwidth_efficiency=float(settings["bandwidth_efficiency"]),
                      compute_efficiency=float(settings["compute_efficiency"]),
                      overhead_s=float(settings["overhead_ms"]) / 1e3)


def step_readout(settings: dict[str, object]) -> dict[str, float | str]:
    """The step lab's readouts for one setting (numbers from :class:`servelab.roofline.Replica`)."""
    replica = step_replica(settings)
    batch, ctx = int(settings["batch"]), int(settings["context_tokens"])
    step = replica.step_seconds(batch, ctx)
    memory, compute = replica.memory_seconds(batch, ctx), replica.compute_seconds(batch)
    try:
        fits = replica.people(ctx) if ctx else float("inf")
    except ValueError:                  # the weights alone overflow the chips
        fits = 0
    kv = batch * ctx * replica.kv_bytes_per_token
    return {"step_ms": step * 1e3, "per_person": 1 / step, "replica": batch / step, "fits": fits,
            "cache_share": kv / (replica.weights_bytes + kv), "lone": replica.lone_request_tokens_per_s(),
            "bound": "memory" if memory >= compute else "arithmetic", "batch": batch, "context": ctx}


def step_readout_html(settings: dict[str, object], base: dict[str, object] | None = None) -> str:
    """The step lab's tiles for one setting, each with its change against the defaults."""
    r = step_readout(settings)
    d = step_readout(base or STEP_DEFAULTS)
    fits = "all" if r["fits"] == float("inf") else f"{r['fits']:,}"
    tiles = tiles_with_deltas_html([
        ("step time", f"{r['step_ms']:.1f} ms", r["step_ms"], d["step_ms"]),
        ("tokens/s per person", f"{r['per_person']:,.0f}", r["per_person"], d["per_person"]),
        ("tokens/s for the replica", f"{r['replica']:,.0f}", r["replica"], d["replica"]),
        ("a lone request's tokens/s", f"{r['lone']:,.0f}", r["lone"], d["lone"]),
        ("people whose caches fit", fits, float(r["fits"]), float(d["fits"])),
        ("cache share of bytes read", f"{r['cache_share']:.0%}", r["cache_share"], d["cache_share"]),
    ], min_width=150)
    note = f"<p>The step waits on {r['bound']}."
    if r["fits"] != float("inf") and r["batch"] > r["fits"]:
        note += (f" <span style='color:#a00'>Only {r['fits']:,} caches of {r['context']:,} tokens fit: the "
                 f"other {r['batch'] - r['fits']:,} people wait in the queue.</span>")
    return tiles + note + "</p>"


def step_time_lab(batch: int = 128, context_tokens: int = 8000, bandwidth_efficiency: float | None = None,
                  overhead_ms: float | None = None, **changes: object):
    """The step-time model: chip, weight format, people, length, both efficiencies, overhead; presets."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    import numpy as np
    from IPython.display import display

    start = step_settings(batch=batch, context_tokens=context_tokens, **changes)
    if bandwidth_efficiency is not None:
        start["bandwidth_efficiency"] = bandwidth_efficiency
    if overhead_ms is not None:
        start["overhead_ms"] = overhead_ms
    style = {"description_width": "190px"}
    layout = w.Layout(width="500px")
    knobs = {
        "chip": w.Dropdown(options=list(STEP_CHIPS), value=start["chip"], description="Chip", style=style,
                           layout=layout),
        "num_chips": w.Dropdown(options=[1, 2, 4, 8], value=start["num_chips"], description="Chips in the replica",
                                style=style, layout=layout),
        "weight_dtype": w.ToggleButtons(options=list(WEIGHT_DTYPES), value=start["weight_dtype"],
                                        description="Weight format", style=style),
        "batch": w.IntSlider(value=start["batch"], min=1, max=1024, description="People in the step", style=style,
                             layout=layout, continuous_update=False),
        "context_tokens": w.IntSlider(value=start["context_tokens"], min=0, max=200_000, step=1000,
                                      description="Tokens per conversation", style=style, layout=layout,
                                      continuous_update=False),
        "bandwidth_efficiency": w.FloatSlider(value=start["bandwidth_efficiency"], min=0.1, max=1.0, step=0.05,
                                              description="Share of peak bandwidth", style=style, layout=layout,
                                              continuous_update=False),
        "compute_efficiency": w.FloatSlider(value=start["compute_efficiency"], min=0.1, max=1.0, step=0.05,
                                            description="Share of peak arithmetic", style=style, layout=layout,
                                            continuous_update=False),
        "overhead_ms": w.FloatSlider(value=start["overhead_ms"], min=0.0, max=10.0, step=0.5,
                                     description="Overhead per step (ms)", style=style, layout=layout,
                                     continuous_update=False),
    }
    presets = w.Dropdown(options=list(STEP_PRESETS), description="Preset", style=style, layout=layout)
    load = w.Button(description="Load")
    tiles = w.HTML()
    chart = w.Output()
    state = {"loading": False}

    def refresh(_=None):
        if state["loading"]:
            return
        settings = {k: v.value for k, v in knobs.items()}
        try:
            tiles.value = step_readout_html(settings)
        except ValueError as exc:
            tiles.value = f"<p style='color:#a00'>{exc}</p>"
            return
        r, ctx = step_replica(settings), settings["context_tokens"]
        with chart:
            chart.clear_output(wait=True)
            batches = np.unique(np.geomspace(1, 1024, 40).astype(int))
            fig, ax = plt.subplots(figsize=(7, 2.8))
            ax.plot(batches, [r.step_seconds(int(x), ctx) * 1e3 for x in batches], label="step (ms)")
            ax2 = ax.twinx()
            ax2.plot(batches, [r.replica_tokens_per_s(int(x), ctx) for x in batches], color="tab:orange",
                     label="replica tokens/s")
            ax.axvline(settings["batch"], color="gray", ls=":")
            ax.set(xscale="log", xlabel="people in the step", ylabel="step (ms)")
            ax2.set_ylabel("replica tokens/s", color="tab:orange")
            display(fig)
            plt.close(fig)

    def load_preset(_=None):
        settings = step_settings(**STEP_PRESETS[presets.value])
        state["loading"] = True
        try:
            for k, knob in knobs.items():
                knob.value = settings[k]
        finally:
            state["loading"] = False
        refresh()

    for knob in knobs.values():
        knob.observe(refresh, names="value")
    load.on_click(load_preset)
    refresh()
    return w.VBox([w.HTML("<b>The step-time model</b> (the 200B running example's model; tiles compare "
                          "with the defaults)"), w.HBox([presets, load]), *knobs.values(), tiles, chart])


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
