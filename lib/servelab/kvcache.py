"""KV cache arithmetic: what one token costs, and what a card's memory grants.

Every running request keeps the keys and values of all its tokens so that the
next step does not recompute them. That store is the resource a serving pool
actually schedules. These functions price it; :func:`kv_calculator` bundles them
into the readouts of the course's KV cache calculator lab (chapter 11).

Units: bytes and tokens as plain numbers; gigabytes are decimal (1e9), the way
vendors quote card memory. Pure Python, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from servelab._checks import check_positive as _check_positive
from servelab.specs import GB, Chip, ModelConfig, get_chip, get_model

#: Bytes each stored number takes, by format name.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "float32": 4,
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
    "fp8": 1, "float8": 1, "int8": 1,
    "fp4": 0.5, "int4": 0.5,
}

#: The KV calculator's safety margin: 5% of the room left after weights stays unused
#: (activations, fragmentation, allocator slack).
DEFAULT_MARGIN = 0.05


def bytes_per_element(dtype: str) -> float:
    """Bytes per stored number for a format name such as 'bf16' or 'fp8'."""
    try:
        return DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}") from None


def kv_elements_per_token_per_layer(config: ModelConfig) -> int:
    """Numbers one token stores in one layer's cache.

    Standard attention keeps a key and a value per KV head:
    ``2 x num_key_value_heads x head_dim`` (MHA, GQA and MQA differ only in the
    number of KV heads). MLA keeps one compressed latent of ``kv_lora_rank``
    numbers plus the ``qk_rope_head_dim`` numbers of its rotary key, shared by
    all heads: 512 + 64 = 576 for DeepSeek-V3.
    """
    if config.attention_kind == "mla":
        return config.kv_lora_rank + config.qk_rope_head_dim
    return 2 * config.num_key_value_heads * config.head_dim


def kv_bytes_per_token(config: ModelConfig | str, cache_dtype: str = "bf16") -> float:
    """Bytes of KV cache one token occupies across all layers.

    ``2 x layers x kv_heads x head_dim x bytes`` for MHA/GQA/MQA; for
    Llama 3 8B in bf16 that is 2 x 32 x 8 x 128 x 2 = 131,072 bytes.
    """
    config = get_model(config)
    per_token = config.num_hidden_layers * kv_elements_per_token_per_layer(config) * bytes_per_element(cache_dtype)
    return int(per_token) if float(per_token).is_integer() else per_token


def weights_bytes(num_params: float, dtype: str = "bf16") -> float:
    """Bytes the weights take: parameters x bytes per parameter."""
    _check_positive("num_params", num_params)
    return num_params * bytes_per_element(dtype)


def kv_room_bytes(memory_bytes: float, weights: float, margin: float = DEFAULT_MARGIN) -> float:
    """Memory left for KV cache after the weights, keeping a safety margin.

    ``(memory - weights) x (1 - margin)``; the margin applies to what is left,
    which is how the KV calculator gets 60.8 GB from an 80 GB card and 16 GB of weights.
    Raises if the weights alone do not fit.
    """
    _check_positive("memory_bytes", memory_bytes)
    _check_positive("weights", weights)
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be a fraction in [0, 1), got {margin!r}")
    if weights >= memory_bytes:
        raise ValueError(
            f"the weights ({weights / GB:.1f} GB) do not fit in {memory_bytes / GB:.1f} GB of memory: "
            "use more cards (tensor parallelism), a bigger card or fewer bits per weight")
    return (memory_bytes - weights) * (1 - margin)


def max_cached_tokens(room_bytes: float, bytes_per_token: float) -> int:
    """Tokens of cache the room holds in total (also the longest single sequence)."""
    _check_positive("bytes_per_token", bytes_per_token)
    if room_bytes < 0:
        raise ValueError(f"room_bytes cannot be negative, got {room_bytes!r}")
    return int(room_bytes // bytes_per_token)


def seat_bytes(seq_len: int, bytes_per_token: float) -> float:
    """Cache one running request holds at ``seq_len`` tokens (prompt + answer so far)."""
    _check_length(seq_len)
    return seq_len * bytes_per_token


def seats_granted(room_bytes: float, bytes_per_token: float, seq_len: int) -> int:
    """How many requests of ``seq_len`` tokens fit in the room at once."""
    return int(room_bytes // seat_bytes(seq_len, bytes_per_token))


def outweigh_tokens(weights: float, bytes_per_token: float) -> int:
    """Sequence length at which one request's cache outweighs the model's weights."""
    _check_positive("bytes_per_token", bytes_per_token)
    return math.ceil(weights / bytes_per_token)


def cache_share_of_weights(seats: int, seq_len: int, bytes_per_token: float, weights: float) -> float:
    """The cache of ``seats`` requests at ``seq_len`` tokens, as a fraction of the weights."""
    if seats < 0:
        raise ValueError(f"seats cannot be negative, got {seats!r}")
    return seats * seat_bytes(seq_len, bytes_per_token) / weights


# ---------------------------------------------------------------------------
# The calculator lab
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelTier:
    """A lab's model choice: a public shape, its headline size and the cards it spans."""

    label: str
    config: ModelConfig
    num_params: float
    num_chips: int
    chip: Chip

    @property
    def weights_bytes(self) -> float:
        return weights_bytes(self.num_params, "bf16")


#: The two tiers of the course's labs: an 8B-class model on one 80 GB card and a
#: 70B-class model split over two. Parameter counts are the headline sizes.
TIERS: dict[str, ModelTier] = {
    "small": ModelTier("8B class", get_model("Llama-3-8B"), 8e9, 1, get_chip("H100 SXM")),
    "large": ModelTier("70B class", get_model("Llama-3-70B"), 70e9, 2, get_chip("H100 SXM")),
}


def get_tier(tier: str | ModelTier) -> ModelTier:
    if isinstance(tier, ModelTier):
        return tier
    try:
        return TIERS[str(tier).lower()]
    except KeyError:
        raise ValueError(f"unknown model tier {tier!r}; choose one of {sorted(TIERS)}") from None


@dataclass(frozen=True)
class KVReadout:
    """Everything the KV cache calculator shows for one setting of its knobs."""

    tier: str
    cache_dtype: str
    seq_len: int
    requested: int
    num_chips: int
    memory_bytes: float          # all cards together
    weights_bytes: float         # all cards together
    room_bytes: float            # KV room after weights and margin, all cards
    bytes_per_token: float
    seat_bytes: float            # one request's cache at seq_len
    seats_fit: int               # seats the room holds at seq_len
    seats_granted: int           # min(requested, seats_fit)
    cache_in_use_bytes: float    # granted seats x seat bytes
    cache_share_of_weights: float
    max_sequence_tokens: int     # the longest single sequence the room holds
    outweigh_tokens: int         # one sequence's cache > weights beyond this

    @property
    def waiting(self) -> int:
        """Requests the memory does not grant: they queue, with no error anywhere."""
        return self.requested - self.seats_granted

    def ledger(self) -> list[tuple[str, float]]:
        """Where the cards' memory goes, in bytes: weights, cache in use, free room, margin."""
        margin = self.memory_bytes - self.weights_bytes - self.room_bytes
        return [("weights", self.weights_bytes), ("KV cache in use", self.cache_in_use_bytes),
                ("free KV room", self.room_bytes - self.cache_in_use_bytes), ("safety margin", margin)]

    def summary(self) -> str:
        return (f"{self.tier}: {self.bytes_per_token:,.0f} B/token, room {self.room_bytes / GB:.1f} GB, "
                f"{self.seats_granted} of {self.requested} seats granted (room for {self.seats_fit}), "
                f"cache = {self.cache_share_of_weights:.0%} of weights")


def kv_calculator(tier: str | ModelTier = "small", cache_dtype: str = "bf16", seq_len: int = 4000,
                  concurrent: int = 16, margin: float = DEFAULT_MARGIN,
                  num_chips: int | None = None) -> KVReadout:
    """The KV cache calculator: model tier, cache dtype, length, asked-for seats -> readouts.

    With the defaults it reproduces the course's reference lab: 131,072 B/token, 60.8 GB of
    room, 115 seats at 4,000 tokens, 464k tokens at most, 122k to outweigh the
    weights and a cache that is 52% of the weights at 16 seats. ``num_chips``
    overrides the tier's card count (the weights are split evenly over them).
    """
    t = get_tier(tier)
    if num_chips is not None:
        if isinstance(num_chips, bool) or not isinstance(num_chips, int) or num_chips < 1:
            raise ValueError(f"num_chips must be a positive whole number of cards, got {num_chips!r}")
        t = ModelTier(t.label, t.config, t.num_params, num_chips, t.chip)
    _check_length(seq_len)
    if not isinstance(concurrent, int) or concurrent < 0:
        raise ValueError(f"concurrent must be a non-negative integer, got {concurrent!r}")
    per_card_weights = t.weights_bytes / t.num_chips
    room = t.num_chips * kv_room_bytes(t.chip.memory_bytes, per_card_weights, margin)
    per_token = kv_bytes_per_token(t.config, cache_dtype)
    fit = seats_granted(room, per_token, seq_len)
    granted = min(concurrent, fit)
    return KVReadout(
        tier=t.label, cache_dtype=cache_dtype, seq_len=seq_len, requested=concurrent,
        num_chips=t.num_chips, memory_bytes=t.num_chips * t.chip.memory_bytes,
        weights_bytes=t.weights_bytes, room_bytes=room, bytes_per_token=per_token,
        seat_bytes=seat_bytes(seq_len, per_token), seats_fit=fit, seats_granted=granted,
        cache_in_use_bytes=granted * seat_bytes(seq_len, per_token),
        cache_share_of_weights=cache_share_of_weights(granted, seq_len, per_token, t.weights_bytes),
        max_sequence_tokens=max_cached_tokens(room, per_token),
        outweigh_tokens=outweigh_tokens(t.weights_bytes, per_token),
    )




def _check_length(seq_len: int) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"sequence length must be a positive whole number of tokens, got {seq_len!r}")


# ---------------------------------------------------------------------------
# What the lab says about a setting (pure functions the widget only shows)
# ---------------------------------------------------------------------------

#: The calculator lab's starting knobs.
LAB_DEFAULTS: dict[str, object] = {"tier": "small", "cache_dtype": "bf16", "seq_len": 4000,
                                   "concurrent": 16, "num_chips": None}

#: "Load a famous failure, then fix it": knob settings (changes from the defaults).
KV_PRESETS: dict[str, dict[str, object]] = {
    "defaults: 8B class, 16 requests of 4,000 tokens": {},
    "failure: 70B class at 32,000 tokens": {"tier": "large", "seq_len": 32_000},
    "fix 1: the same with an fp8 cache": {"tier": "large", "seq_len": 32_000, "cache_dtype": "fp8"},
    "fix 2: the same on four cards": {"tier": "large", "seq_len": 32_000, "num_chips": 4},
}


def lab_settings(**changes: object) -> dict[str, object]:
    """The lab's defaults with ``changes`` applied (unknown knobs raise)."""
    unknown = set(changes) - set(LAB_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown knob(s) {sorted(unknown)}; the knobs are {sorted(LAB_DEFAULTS)}")
    return {**LAB_DEFAULTS, **changes}


def preset(name: str) -> dict[str, object]:
    """The full knob settings of a named preset."""
    try:
        return lab_settings(**KV_PRESETS[name])
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {list(KV_PRESETS)}") from None


def binding_constraint(r: KVReadout) -> str:
    """One sentence: does memory bind, and what would it take to seat everyone?"""
    if r.waiting == 0:
        spare = r.seats_fit - r.requested
        return (f"Memory does not bind: all {r.requested} requests are seated, with room for {spare:,} more "
                f"of {r.seq_len:,} tokens; the next limit is each step's reads (bandwidth).")
    need = r.requested * r.seat_bytes
    seats = f"{r.seats_fit} seat{'s' * (r.seats_fit != 1)}"
    return (f"Memory binds: {r.room_bytes / GB:.1f} GB of room holds {seats} of "
            f"{r.seq_len:,} tokens ({r.seat_bytes / GB:.2f} GB each), so {r.waiting} of {r.requested} "
            f"requests wait. Seating all of them needs {need / GB:.1f} GB of room, "
            f"{need / r.room_bytes:.1f}x what is there: fewer bytes per token, shorter contexts or more cards.")


def ledger_lines(r: KVReadout) -> list[str]:
    """The memory ledger as sentences, one per slice."""
    margin = r.memory_bytes - r.weights_bytes - r.room_bytes
    free = r.room_bytes - r.cache_in_use_bytes
    cards = f"{r.num_chips} card{'s' * (r.num_chips > 1)}"
    seats = f"{r.seats_granted} seat{'s' * (r.seats_granted != 1)}"
    lines = [f"Weights: {r.weights_bytes / GB:.1f} GB of the {r.memory_bytes / GB:.0f} GB on {cards} "
             f"({r.weights_bytes / r.memory_bytes:.0%}), paid before any seat exists.",
             f"KV cache in use: {r.cache_in_use_bytes / GB:.1f} GB for {seats} of "
             f"{r.seq_len:,} tokens.",
             f"Free KV room: {free / GB:.1f} GB, {free / r.seat_bytes:.1f} more seats of this length.",
             f"Safety margin: {margin / GB:.1f} GB kept back for activations and allocator slack."]
    return lines


_DELTA_FIELDS = (("bytes per token", "bytes_per_token", "{:,.0f} B"),
                 ("one seat", "seat_bytes", "{:.2f} GB"),
                 ("KV room", "room_bytes", "{:.1f} GB"),
                 ("seats that fit", "seats_fit", "{:,}"),
                 ("seats granted", "seats_granted", "{:,}"))


def readout_deltas(r: KVReadout, base: KVReadout) -> list[tuple[str, str, str]]:
    """(label, value, change against ``base``) for the lab's "vs defaults" column."""
    out = []
    for label, field, fmt in _DELTA_FIELDS:
        value, was = getattr(r, field), getattr(base, field)
        shown = fmt.format(value / GB if fmt.endswith("GB") else value)
        if value == was:
            change = "same"
        elif was:
            change = f"{value / was:.2f}x" if value > 0 else "none left"
        else:
            change = "new"
        out.append((label, shown, change))
    return out


def what_mattered(settings: dict[str, object], base: dict[str, object] | None = None,
                  threshold: float = 0.1) -> list[tuple[str, object, object, int, str]]:
    """Which knob changes moved the seats: each changed knob alone, from ``base``.

    Returns ``(knob, from, to, seats granted with only that change, verdict)``,
    biggest effect first; a change "mattered" when it moved the seats granted by
    at least ``threshold`` of the base (and at least one seat), else it was "noise".
    """
    base = lab_settings(**(base or {}))
    settings = lab_settings(**settings)
    start = kv_calculator(**base).seats_granted
    rows = []
    for knob, value in settings.items():
        if value == base[knob]:
            continue
        try:
            alone = kv_calculator(**{**base, knob: value}).seats_granted
        except ValueError:          # e.g. the big model on a single card
            alone = 0
        moved = abs(alone - start)
        verdict = "mattered" if moved >= max(1, threshold * max(start, 1)) else "noise"
        rows.append((knob, base[knob], value, alone, verdict, moved))
    rows.sort(key=lambda row: -row[5])
    return [row[:5] for row in rows]

