"""The serving-pool lab of chapter 23: knobs, readouts against the defaults, famous failures."""
from __future__ import annotations

from servelab import kvcache, pool
from servelab.pool import PoolReadout
from servelab.widgets.common import tiles_html


def _delta(value: float, base: float, fmt: str, unit: str = "") -> str:
    diff = value - base
    return f"<span style='font-size:11px;color:#777'>vs defaults: {diff:+{fmt}}{unit}</span>"


def pool_readout_html(r: PoolReadout, base: PoolReadout, other: PoolReadout) -> str:
    """Tiles with deltas against the default config, the memory ledger and the other workload.

    TTFT and TPOT are the simulated p95s at the peak (queueing included); the
    prefill alone is shown beside them.
    """
    tiles = tiles_html([
        ("live seats", f"{r.live_seats} {_delta(r.live_seats, base.live_seats, 'd')}"),
        ("TTFT p95", f"{r.ttft_p95_s * 1e3:,.0f} ms {_delta(r.ttft_p95_s * 1e3, base.ttft_p95_s * 1e3, ',.0f', ' ms')}"),
        ("TPOT p95", f"{r.tpot_p95_s * 1e3:,.0f} ms {_delta(r.tpot_p95_s * 1e3, base.tpot_p95_s * 1e3, ',.0f', ' ms')}"),
        ("aggregate decode", f"{r.aggregate_tokens_per_s:,.0f} tok/s "
                             f"{_delta(r.aggregate_tokens_per_s, base.aggregate_tokens_per_s, ',.0f')}"),
        ("monthly bill", f"${r.monthly_usd:,.0f} {_delta(r.monthly_usd, base.monthly_usd, ',.0f')}"),
    ], min_width=150)
    memory = (f"Memory grants all {r.requested_seats} requested seats: {r.kv_tokens_in_use / 1e3:,.1f}k KV tokens in "
              f"use against {r.kv_token_budget / 1e3:,.0f}k in the budget."
              if r.capacity_ok else
              f"Memory grants only {r.live_seats} of {r.requested_seats} seats; the rest queue.")
    plan = (f"Little's law says {r.littles_law_replicas} replica(s); the p95s need {r.replicas}."
            if r.replicas != r.littles_law_replicas else f"Little's law and the p95s agree: {r.replicas} replica(s).")
    return (f"{tiles}<p><b>{r.verdict()}</b> · {r.replicas} replica(s), {r.chips} card(s). {plan}</p>"
            f"<p>Prefill alone: {r.ttft_s * 1e3:,.0f} ms ({r.miss_tokens:,} cache-miss tokens). {memory}</p>"
            f"<p>Same config, the other workload: {other.verdict()}.</p>")


def _max_seats() -> int:
    """The seats slider's top: at least 128, and every famous failure's seats (ipywidgets
    clamps a value above ``max``, which would quietly undo a failure such as 400 seats)."""
    asked = [f.broken.get("seats", 0) for f in pool.FAMOUS_FAILURES.values()]
    asked += [f.fix.get("seats", 0) for f in pool.FAMOUS_FAILURES.values()]
    return max(128, *asked)


def _header(workload: str) -> str:
    w = pool.WORKLOADS[workload]
    return (f"<b>The serving pool</b>: first token under {w.slo_ttft_s * 1e3:,.0f} ms and an average gap between tokens (TPOT) under "
            f"{w.slo_tpot_s * 1e3:,.0f} ms at p95, under ${w.budget_usd_per_month:,.0f} a month "
            "(percentiles simulated at the peak)")


def pool_lab(workload: str = "chat"):
    """Seats, model tier, prompt length, prefix hit rate and workload -> the pool's four readouts."""
    import ipywidgets as w

    style = {"description_width": "170px"}
    layout = w.Layout(width="480px")
    knobs = {
        "workload": w.ToggleButtons(options=[(v.name, k) for k, v in pool.WORKLOADS.items()], value=workload,
                                    description="Workload", style=style),
        "seats": w.IntSlider(value=16, min=1, max=_max_seats(), description="Batch size (seats)", style=style,
                             layout=layout, continuous_update=False),
        "tier": w.Dropdown(options=[(t.label, k) for k, t in kvcache.TIERS.items()], value="small",
                           description="Model tier", style=style, layout=layout),
        "prompt_tokens": w.IntSlider(value=pool.WORKLOADS[workload].prompt_tokens, min=100, max=100_000, step=100, description="Prompt length (tokens)",
                                     style=style, layout=layout, continuous_update=False),
        "prefix_hit_rate": w.FloatSlider(value=0.3, min=0.0, max=1.0, step=0.05, description="Prefix cache hit rate",
                                         style=style, layout=layout, continuous_update=False),
        "cache_dtype": w.ToggleButtons(options=["bf16", "fp8"], value="bf16", description="Cache storage",
                                       style=style),
        "policy": w.ToggleButtons(options=list(pool.POLICIES), value="continuous", description="Batching",
                                  style=style),
    }
    failures = w.Dropdown(options=[("load a famous failure…", "")] + [(f.title, k) for k, f in
                                                                      pool.FAMOUS_FAILURES.items()],
                          value="", layout=layout)
    fix = w.Button(description="apply the fix", disabled=True)
    story = w.HTML()
    readout = w.HTML()
    defaults = {name: knob.value for name, knob in knobs.items()}

    def settings(overrides: dict | None = None, workload: str | None = None) -> dict:
        wl = workload or knobs["workload"].value
        return {**defaults, "workload": wl, "prompt_tokens": pool.WORKLOADS[wl].prompt_tokens, **(overrides or {})}

    def refresh(_=None):
        if busy["on"]:
            return
        values = {name: knob.value for name, knob in knobs.items()}
        other = next(k for k in pool.WORKLOADS if k != values["workload"])
        try:
            r = pool.size_pool(**values)
            readout.value = pool_readout_html(r, pool.size_pool(workload=values["workload"]),
                                              pool.size_pool(**{**values, "workload": other}))
        except ValueError as exc:  # e.g. not one seat fits: say so instead of failing
            readout.value = f"<p style='color:#a00'>{exc}</p>"

    busy = {"on": False}

    def set_knobs(values: dict):
        busy["on"] = True  # one refresh at the end, not one per knob
        try:
            for name, value in values.items():
                knobs[name].value = value
        finally:
            busy["on"] = False
        refresh()

    def workload_changed(change):
        if not busy["on"]:  # a new workload brings its own prompt length
            set_knobs({"prompt_tokens": pool.WORKLOADS[change["new"]].prompt_tokens})

    def load_failure(change):
        key = change["new"]
        fix.disabled = not key
        if key:
            f = pool.FAMOUS_FAILURES[key]
            story.value = f"<p><i>{f.story}</i> (breaks: {f.check})</p>"
            set_knobs(settings(f.broken, f.workload))

    def apply_fix(_):
        if failures.value:
            f = pool.FAMOUS_FAILURES[failures.value]
            story.value = f"<p><i>{f.story}</i> (breaks: {f.check})</p><p>Fix: {f.fix_story}</p>"
            set_knobs(settings(f.fix, f.workload))

    for knob in knobs.values():
        knob.observe(refresh, names="value")
    knobs["workload"].observe(workload_changed, names="value")
    failures.observe(load_failure, names="value")
    fix.on_click(apply_fix)
    refresh()
    return w.VBox([w.HTML(_header(workload)),
                   *knobs.values(), readout, w.HBox([failures, fix]), story])
