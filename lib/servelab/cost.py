"""What a chat costs in rented chip time: the calculator of chapter 24.

A chat turn spends chip time in two ways:

* **prefill** reads the prompt tokens that are *not* in the prefix cache, at
  about 2 operations per parameter each plus attention work, at an arithmetic
  efficiency of the replica's peak. Cached tokens skip this entirely.
* **decode** writes the reply one token per step. A step is shared by
  everyone in the batch, so each output token costs ``step / batch`` of the
  whole replica. The batch is an assumed operating point (128 by default, as
  in the 200B running example), lowered when long conversations do not fit in memory.

Chip-seconds times the hourly rental price gives dollars. The calculator counts
chip rental only; real list prices also pay for idle peak capacity, networks,
buildings, engineering and training (see chapter 24). Pure Python, no torch.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

from servelab._checks import check_count as _check_count
from servelab.arith import prefill_ops
from servelab.roofline import EXAMPLE_REPLICA, Replica
from servelab.specs import ModelConfig, get_model

__all__ = [
    "CHIP_HOURLY_USD", "PRICE_SOURCES", "PROMPT_CACHE_TERMS", "DEFAULT_BATCH", "ChatCost", "chat_cost",
    "SENSITIVITY_RANGES", "Sensitivity", "sensitivity", "plot_sensitivity",
    "PrefixReadout", "prefix_readout", "PrefixTier", "PREFIX_TIERS", "TierPrice", "prefix_tier_price",
]

#: On-demand rental price per chip-hour in US dollars, from a public price list.
#: Prices move (and differ several-fold between clouds for the same chip); pass
#: your own ``price_per_chip_hour`` for a current quote.
CHIP_HOURLY_USD: dict[str, float] = {
    "H100 SXM": 3.99,
    "B200": 6.69,
}
PRICE_SOURCES: dict[str, str] = {
    "H100 SXM": "Lambda on-demand cloud, 8x NVIDIA H100 SXM instance, per GPU-hour "
                "(https://lambda.ai/instances, as listed in September 2026)",
    "B200": "Lambda on-demand cloud, 8x NVIDIA B200 SXM6 instance, per GPU-hour "
            "(https://lambda.ai/instances, as listed in September 2026)",
}

#: Provider prompt-cache terms: how long an idle cached prefix lives, and what a
#: cached input token is billed as a share of a fresh one. Published figures;
#: they change, so read them as examples of the shape of the offer.
PROMPT_CACHE_TERMS: dict[str, dict[str, float | str]] = {
    "Anthropic": {
        "ttl_minutes": 5,             # default lifetime, refreshed on every hit
        "read_price_share": 0.10,     # a cache read costs 10% of the base input price
        "write_price_share": 1.25,    # writing the 5-minute cache costs 125%
        "source": "Anthropic prompt caching documentation "
                  "(https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching)",
    },
    "OpenAI": {
        "ttl_minutes": 5,             # cleared after 5-10 minutes idle, always within an hour
        "read_price_share": 0.50,     # 50% discount on cached input tokens at launch (GPT-4o)
        "write_price_share": 1.0,     # no surcharge for writing
        "source": "OpenAI, 'Prompt Caching in the API', October 2024 "
                  "(https://openai.com/index/api-prompt-caching/)",
    },
}

#: The assumed number of people sharing a decode step (the 200B running example's operating point).
DEFAULT_BATCH = 128


@dataclass(frozen=True)
class ChatCost:
    """Chip time and dollars for one chat turn, with per-million-token rates."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int
    batch: int                  # people sharing each decode step
    step_s: float               # one decode step at the average context
    prefill_chip_s: float
    decode_chip_s: float
    price_per_chip_hour: float

    @property
    def fresh_tokens(self) -> int:
        return self.input_tokens - self.cached_tokens

    @property
    def chip_s(self) -> float:
        return self.prefill_chip_s + self.decode_chip_s

    @property
    def usd_per_chip_s(self) -> float:
        return self.price_per_chip_hour / 3600.0

    @property
    def input_usd(self) -> float:
        return self.prefill_chip_s * self.usd_per_chip_s

    @property
    def output_usd(self) -> float:
        return self.decode_chip_s * self.usd_per_chip_s

    @property
    def usd_per_chat(self) -> float:
        return self.input_usd + self.output_usd

    @property
    def input_usd_per_million(self) -> float:
        """Dollars per million prompt tokens that miss the cache (cached ones cost ~nothing here)."""
        return self.input_usd / self.fresh_tokens * 1e6 if self.fresh_tokens else 0.0

    @property
    def blended_input_usd_per_million(self) -> float:
        """Dollars per million prompt tokens, cached and fresh together."""
        return self.input_usd / self.input_tokens * 1e6

    @property
    def output_usd_per_million(self) -> float:
        return self.output_usd / self.output_tokens * 1e6

    @property
    def output_to_input_ratio(self) -> float:
        """How many times a fresh input token an output token costs."""
        return self.output_usd_per_million / self.input_usd_per_million if self.fresh_tokens else math.inf

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        for name in ("fresh_tokens", "chip_s", "input_usd", "output_usd", "usd_per_chat",
                     "input_usd_per_million", "blended_input_usd_per_million", "output_usd_per_million",
                     "output_to_input_ratio"):
            d[name] = getattr(self, name)
        return d


def _check_fraction_closed(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a share in [0, 1], got {value!r}")




def chat_cost(conversation_tokens: int = 8000, reply_tokens: int = 500, cached_share: float = 0.5,
              price_per_chip_hour: float | None = None, replica: Replica = EXAMPLE_REPLICA,
              config: ModelConfig | str | None = "Example-200B", batch: int = DEFAULT_BATCH,
              prefill_efficiency: float | None = None) -> ChatCost:
    """Chip-seconds and dollars for one chat turn.

    ``conversation_tokens`` is everything sent this turn (instructions, history,
    the new message); ``cached_share`` of it sits in the prefix cache;
    ``reply_tokens`` are written one step at a time. ``config`` adds attention
    work to prefill (None: the 2 x parameters rule only). The batch is
    ``min(batch, people whose caches fit)`` at the average context during the
    reply. ``price_per_chip_hour`` defaults to :data:`CHIP_HOURLY_USD` for the
    replica's chip.
    """
    _check_count("conversation_tokens", conversation_tokens)
    _check_count("reply_tokens", reply_tokens)
    _check_fraction_closed("cached_share", cached_share)
    _check_count("batch", batch)
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servelab.roofline.Replica, got {type(replica).__name__}")
    if price_per_chip_hour is None:
        if replica.chip.name not in CHIP_HOURLY_USD:
            raise ValueError(f"no listed price for {replica.chip.name}; pass price_per_chip_hour= "
                             f"(listed: {sorted(CHIP_HOURLY_USD)})")
        price_per_chip_hour = CHIP_HOURLY_USD[replica.chip.name]
    if isinstance(price_per_chip_hour, bool) or not isinstance(price_per_chip_hour, (int, float)) \
            or not 0 < price_per_chip_hour < math.inf:
        raise ValueError(f"price_per_chip_hour must be a positive number of dollars, got {price_per_chip_hour!r}")
    efficiency = replica.compute_efficiency if prefill_efficiency is None else prefill_efficiency
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not 0 < efficiency <= 1:
        raise ValueError(f"prefill_efficiency must be a fraction in (0, 1], got {efficiency!r}")
    cfg = get_model(config) if config is not None else None

    cached = int(round(conversation_tokens * cached_share))
    if cached:
        prefill = prefill_ops(replica.num_params, conversation_tokens, cfg, cached_tokens=cached)
    else:
        prefill = prefill_ops(replica.num_params, conversation_tokens, cfg)
    # the whole replica works on the prompt; chip-seconds = replica-seconds x chips
    prefill_replica_s = prefill / (replica.peak_ops * efficiency)
    prefill_chip_s = prefill_replica_s * replica.num_chips

    average_context = conversation_tokens + reply_tokens // 2
    fits = replica.people(average_context)
    if fits < 1:
        raise ValueError(f"one conversation of {average_context:,} tokens does not fit in the replica's "
                         f"{replica.free_bytes / 1e9:,.0f} GB of KV room: shorten it or add chips")
    shared_by = min(batch, fits)
    step = replica.step_seconds(shared_by, average_context)
    decode_chip_s = reply_tokens * step / shared_by * replica.num_chips
    return ChatCost(input_tokens=conversation_tokens, cached_tokens=cached, output_tokens=reply_tokens,
                    batch=shared_by, step_s=step, prefill_chip_s=prefill_chip_s,
                    decode_chip_s=decode_chip_s, price_per_chip_hour=float(price_per_chip_hour))


# ---------------------------------------------------------------------------
# What moves the answer most
# ---------------------------------------------------------------------------

#: Low and high values tried for each knob of :func:`chat_cost` (the rest held
#: at the base case). Ranges are plausible spans, chosen for illustration.
SENSITIVITY_RANGES: dict[str, tuple[Any, Any]] = {
    "cached_share": (0.0, 0.9),
    "conversation_tokens": (2_000, 64_000),
    "reply_tokens": (100, 4_000),
    "price_per_chip_hour": ("x0.5", "x2"),
    "batch": (32, 256),
    "prefill_efficiency": (0.3, 0.8),
}


@dataclass(frozen=True)
class Sensitivity:
    """One knob's swing: cost per chat at its low and high values."""

    knob: str
    low_value: Any
    high_value: Any
    low_usd: float
    high_usd: float
    base_usd: float

    @property
    def swing(self) -> float:
        """max/min of the two costs: how many times over this knob can move the answer."""
        lo, hi = sorted((self.low_usd, self.high_usd))
        return hi / lo


def sensitivity(base: Mapping[str, Any] | None = None,
                ranges: Mapping[str, tuple[Any, Any]] | None = None) -> list[Sensitivity]:
    """Vary each knob between its low and high value, others at ``base``; biggest swing first.

    ``base`` holds :func:`chat_cost` keyword arguments; ``ranges`` maps knob
    names to (low, high). A value written ``"x0.5"`` multiplies the base value.
    """
    base = dict(base or {})
    ranges = dict(SENSITIVITY_RANGES if ranges is None else ranges)
    base_cost = chat_cost(**base)
    resolved = {"conversation_tokens": base_cost.input_tokens, "reply_tokens": base_cost.output_tokens,
                "price_per_chip_hour": base_cost.price_per_chip_hour, "batch": base.get("batch", DEFAULT_BATCH),
                "cached_share": base.get("cached_share", 0.5),
                "prefill_efficiency": base.get("prefill_efficiency",
                                               base.get("replica", EXAMPLE_REPLICA).compute_efficiency)}
    out = []
    for knob, (low, high) in ranges.items():
        if knob not in resolved:
            raise ValueError(f"unknown knob {knob!r}; choose from {sorted(resolved)}")

        def value(v: Any) -> Any:
            if isinstance(v, str) and v.startswith("x"):
                scaled = resolved[knob] * float(v[1:])
                return int(round(scaled)) if isinstance(resolved[knob], int) else scaled
            return v

        lo_v, hi_v = value(low), value(high)
        lo_cost = chat_cost(**{**base, knob: lo_v}).usd_per_chat
        hi_cost = chat_cost(**{**base, knob: hi_v}).usd_per_chat
        out.append(Sensitivity(knob, lo_v, hi_v, lo_cost, hi_cost, base_cost.usd_per_chat))
    return sorted(out, key=lambda s: s.swing, reverse=True)


#: How the tornado chart names each knob.
_KNOB_LABELS = {"cached_share": "cached share", "conversation_tokens": "conversation (tokens)",
                "reply_tokens": "reply (tokens)", "price_per_chip_hour": "chip price ($/h)",
                "batch": "batch (people)", "prefill_efficiency": "prefill efficiency"}


def _knob_value(knob: str, value) -> str:
    if knob == "price_per_chip_hour" and isinstance(value, (int, float)):
        return f"${value:.2f}"
    if isinstance(value, float) and value <= 1:
        return f"{value:.0%}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def plot_sensitivity(results: Iterable[Sensitivity], ax=None, title: str | None = None):
    """A tornado chart: one bar per knob from its low-value cost to its high-value cost."""
    import matplotlib.pyplot as plt  # only when drawing

    results = list(results)
    if not results:
        raise ValueError("no sensitivity results to plot; call sensitivity() first")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 0.5 * len(results) + 1.2))
    base = results[0].base_usd
    for i, s in enumerate(reversed(results)):
        lo, hi = sorted((s.low_usd, s.high_usd))
        ax.barh(i, hi - lo, left=lo, color="tab:blue", alpha=0.7)
        ax.text(hi, i, f"  {_KNOB_LABELS.get(s.knob, s.knob)}: {_knob_value(s.knob, s.low_value)}"
                f" → {_knob_value(s.knob, s.high_value)}", va="center", fontsize=8)
    ax.axvline(base, color="black", lw=1, ls="--")
    ax.set_xscale("log")
    lo_all = min(min(s.low_usd, s.high_usd) for s in results)
    hi_all = max(max(s.low_usd, s.high_usd) for s in results)
    ax.set_xlim(lo_all / 1.3, hi_all * 12)  # room for the labels right of the bars
    ax.set_yticks([])
    ax.set_xlabel("chip cost per chat (US$, log scale)")
    ax.set_title(title or "What moves the cost of a chat")
    return ax


# ---------------------------------------------------------------------------
# A shared preamble, cached or edited (the prefix lab of chapter 13)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PrefixReadout:
    """First-token time and chip cost of one request, its preamble cached or not."""

    tier: str
    num_chips: int
    preamble_tokens: int
    question_tokens: int
    cached_ttft_s: float          # prefill of the question only (queue not counted)
    edited_ttft_s: float          # one edited token at the start: the whole prompt again
    preamble_kv_bytes: float      # what keeping the preamble costs in KV memory
    room_bytes: float             # the calculator's KV room for this tier
    price_per_chip_hour: float

    @property
    def speedup(self) -> float:
        return self.edited_ttft_s / self.cached_ttft_s

    @property
    def chip_s_saved(self) -> float:
        """Chip-seconds a hit saves per request (every card of the replica works on the prefill)."""
        return (self.edited_ttft_s - self.cached_ttft_s) * self.num_chips

    @property
    def usd_saved_per_million_requests(self) -> float:
        return self.chip_s_saved * self.price_per_chip_hour / 3600.0 * 1e6

    @property
    def preamble_share_of_room(self) -> float:
        return self.preamble_kv_bytes / self.room_bytes


def prefix_readout(tier: str = "small", preamble_tokens: int = 2000, question_tokens: int = 50,
                   cache_dtype: str = "bf16", efficiency: float | None = None,
                   num_chips: int | None = None, price_per_chip_hour: float | None = None) -> PrefixReadout:
    """A request with a shared preamble on the KV calculator's replica, hit or miss.

    Prefill runs at ``efficiency`` (default: the running example's compute
    efficiency) of the cards' bf16 peak, attention work included
    (:func:`servelab.arith.prefill_ops` with the tier's config), and never
    faster than reading the weights once at the running example's bandwidth
    efficiency (a short prefill is memory-bound). A hit skips
    the preamble; an edit at its start misses every block, so the whole prompt
    is prefilled. Priced at the tier's chip on-demand rate.
    """
    from servelab import kvcache

    _check_count("preamble_tokens", preamble_tokens)
    _check_count("question_tokens", question_tokens)
    readout = kvcache.kv_calculator(tier, cache_dtype, seq_len=preamble_tokens + question_tokens,
                                    concurrent=1, num_chips=num_chips)
    t = kvcache.get_tier(tier)
    chips = readout.num_chips
    eff = EXAMPLE_REPLICA.compute_efficiency if efficiency is None else efficiency
    if not 0 < eff <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {eff!r}")
    rate = chips * t.chip.peak_flops("bf16") * eff
    # A prefill is never faster than one read of the weights (chapter 8): a short
    # question after a cached preamble is memory-bound, not arithmetic-bound.
    weight_read = readout.weights_bytes / (chips * t.chip.hbm_bandwidth
                                           * EXAMPLE_REPLICA.bandwidth_efficiency)
    total = preamble_tokens + question_tokens
    cached = max(prefill_ops(t.num_params, total, t.config, cached_tokens=preamble_tokens) / rate,
                 weight_read)
    edited = max(prefill_ops(t.num_params, total, t.config) / rate, weight_read)
    price = CHIP_HOURLY_USD[t.chip.name] if price_per_chip_hour is None else price_per_chip_hour
    return PrefixReadout(tier=t.label, num_chips=chips, preamble_tokens=preamble_tokens,
                         question_tokens=question_tokens, cached_ttft_s=cached, edited_ttft_s=edited,
                         preamble_kv_bytes=preamble_tokens * readout.bytes_per_token,
                         room_bytes=readout.room_bytes, price_per_chip_hour=price)



# ---------------------------------------------------------------------------
# Tiers below HBM: reload a cached prefix, or recompute it (chapter 13)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PrefixTier:
    """A place a cold prefix can wait below HBM: its peak bandwidth into one chip and fixed delay."""

    name: str
    bandwidth: float      # bytes per second, the link's peak (real transfers get less)
    latency_s: float
    source: str


def _prefix_tiers() -> dict[str, PrefixTier]:
    from servelab import comm
    from servelab.roofline import MEMORY_TIERS

    host, ssd = MEMORY_TIERS[2], MEMORY_TIERS[3]
    net = comm.NETWORK_400G
    return {
        "host": PrefixTier("host memory (PCIe 5.0 x16)", host.bandwidth, 0.0, host.source),
        # A shared pool in other servers' memory (Mooncake-style), one 400G port per GPU.
        "network": PrefixTier("another server's memory (one 400G port)", net.bandwidth, net.latency_s,
                              net.source),
        "ssd": PrefixTier("local NVMe SSD (PCIe 5.0)", ssd.bandwidth, 0.0, ssd.source),
    }


#: The tiers :func:`prefix_tier_price` prices, by short name.
PREFIX_TIERS: dict[str, PrefixTier] = _prefix_tiers()


@dataclass(frozen=True)
class TierPrice:
    """A cached prefix that left HBM, priced two ways: the request's wait and the batch's chip time.

    *Latency*: the first token waits for the question's own pass (``pass_s``)
    plus whatever the prefix costs to bring back. Recomputing runs the whole
    prompt (``recompute_ttft_s``). A reload from a tier takes ``reload_s[tier]``.
    Two ways to schedule it (:meth:`reload_ttft_s`): load first, then join a
    batch (vLLM's built-in offloading), or load layer by layer while the pass
    runs (LMCache's layer-wise mode), which shows only one layer's share of
    the load when the load is shorter than the pass.

    *Chip time*: recomputing spends the prefix's arithmetic (``recompute_chip_s``),
    chip time the rest of the batch then does not get. A reload moves bytes over
    a link; the chip only writes them into HBM (``hbm_write_s``). That holds
    when the load finishes before the request joins a batch. A layer-by-layer
    load that takes longer than the pass holds the batch's step instead
    (:meth:`layerwise_stall_s`).
    """

    model: str
    chip: str
    prefix_tokens: int
    question_tokens: int
    math_dtype: str
    cache_dtype: str
    num_layers: int
    kv_bytes: float              # the prefix's K/V
    pass_s: float                # the question's pass with the prefix in HBM
    recompute_ttft_s: float      # the whole prompt's prefill
    recompute_chip_s: float      # arithmetic the prefix costs (the chip's time)
    attention_share: float       # of the prefix's operations, attention's part
    hbm_write_s: float           # writing the reloaded bytes into HBM (at the replica's HBM efficiency)
    reload_s: Mapping[str, float]
    price_per_chip_hour: float | None

    def reload_ttft_s(self, tier: str, pipelined: bool = True) -> float:
        """First-token time when the prefix comes back from ``tier``.

        Pipelined (layer by layer): layer ``l`` computes once its blocks have
        arrived and layer ``l - 1`` is done. With ``L`` layers, a load ``T`` and a
        pass ``P``, the first token comes at ``max(T / L + P, T + P / L)``: the
        pass waits for the first layer's share, or the last layer's compute
        follows the whole load. Not pipelined (load first, then join a batch):
        ``T + P``.
        """
        load = self.reload_s[tier]
        if not pipelined:
            return load + self.pass_s
        n = self.num_layers
        return max(load / n + self.pass_s, load + self.pass_s / n)

    def layerwise_stall_s(self, tier: str) -> float:
        """How long a layer-by-layer reload holds the batch's step beyond the pass.

        The step runs with the request in it, so every layer that waits for its
        blocks waits for the whole batch: ``reload_ttft_s(tier) - pass_s``. A load
        shorter than the pass stalls only the first layer's share.
        """
        return self.reload_ttft_s(tier) - self.pass_s

    @property
    def recompute_usd_per_million(self) -> float | None:
        """Chip rental the recomputed prefixes cost, per million requests (None: no price listed)."""
        if self.price_per_chip_hour is None:
            return None
        return self.recompute_chip_s * self.price_per_chip_hour / 3600.0 * 1e6


def prefix_tier_price(model: ModelConfig | str = "Llama-3.1-8B", chip: str = "H100 SXM",
                      prefix_tokens: int = 1200, question_tokens: int = 24, math_dtype: str = "bf16",
                      cache_dtype: str = "bf16", efficiency: float | None = None,
                      bandwidth_efficiency: float | None = None) -> TierPrice:
    """Reload a cold prefix from host memory, another server or an SSD, or recompute it.

    Prefill runs at ``efficiency`` (default: the running example's compute
    efficiency) of the chip's ``math_dtype`` peak, attention included
    (:func:`servelab.arith.prefill_ops`: its part grows with the square of the
    prefix), and never faster than one read of the weights at
    ``bandwidth_efficiency``. Writing a reloaded prefix into HBM runs at the
    same ``bandwidth_efficiency``. Links run at their peak bandwidths, so reloads
    are best cases. One chip; the price is its on-demand rate, when listed.
    """
    from servelab import kvcache
    from servelab.specs import get_chip

    _check_count("prefix_tokens", prefix_tokens)
    _check_count("question_tokens", question_tokens)
    cfg = get_model(model)
    c = get_chip(chip)
    eff = EXAMPLE_REPLICA.compute_efficiency if efficiency is None else efficiency
    bw_eff = EXAMPLE_REPLICA.bandwidth_efficiency if bandwidth_efficiency is None else bandwidth_efficiency
    for name, v in (("efficiency", eff), ("bandwidth_efficiency", bw_eff)):
        if not 0 < v <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {v!r}")
    params = cfg.nominal_params
    rate = c.peak_flops(math_dtype) * eff
    weight_read = kvcache.weights_bytes(params, math_dtype) / (c.hbm_bandwidth * bw_eff)
    total = prefix_tokens + question_tokens
    ops_all = prefill_ops(params, total, cfg)
    ops_question = prefill_ops(params, total, cfg, cached_tokens=prefix_tokens)
    ops_prefix = prefill_ops(params, prefix_tokens, cfg)
    kv_bytes = prefix_tokens * kvcache.kv_bytes_per_token(cfg, cache_dtype)
    reload = {k: kv_bytes / t.bandwidth + t.latency_s for k, t in PREFIX_TIERS.items()}
    return TierPrice(
        model=cfg.name, chip=c.name, prefix_tokens=prefix_tokens, question_tokens=question_tokens,
        math_dtype=math_dtype, cache_dtype=cache_dtype, num_layers=cfg.num_hidden_layers,
        kv_bytes=kv_bytes, pass_s=max(ops_question / rate, weight_read),
        recompute_ttft_s=max(ops_all / rate, weight_read),
        recompute_chip_s=(ops_all - ops_question) / rate,
        attention_share=1 - 2.0 * params * prefix_tokens / ops_prefix,
        hbm_write_s=kv_bytes / (c.hbm_bandwidth * bw_eff), reload_s=reload,
        price_per_chip_hour=CHIP_HOURLY_USD.get(c.name))
