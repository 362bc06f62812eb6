"""Exercise 24 · What a chat costs: dollars per million tokens, in and out. Hidden tests.

Expected values come from :func:`servelab.cost.chat_cost` (and its
:class:`~servelab.cost.ChatCost` record) on replicas from
:mod:`servelab.roofline`, so the exercise and chapter 24 can never disagree.
Every turn is priced with ``config=None`` (the 2 x parameters rule for
prefill, no attention term) and a one-token reply, so that the decode step is
taken at exactly the given context.
"""
from servelab import cost
from servelab.grading import Case, Question
from servelab.roofline import EXAMPLE_REPLICA, Replica
from servelab.specs import Chip, get_chip

_B200_PRICE = cost.CHIP_HOURLY_USD["B200"]
_H100_PRICE = cost.CHIP_HOURLY_USD["H100 SXM"]
_R = EXAMPLE_REPLICA                                   # 8 B200s, 200B at 8 bits
_H = Replica.for_model("Llama-3-70B", "H100 SXM", 4)   # 4 H100s, 70B at 8 bits
_PEAK_B200 = get_chip("B200").peak_flops("fp8")
_PEAK_H100 = get_chip("H100 SXM").peak_flops("fp8")


def _turn(replica, context, batch, cached_share=0.0, **kwargs):
    """One chat turn of ``context`` prompt tokens and a one-token reply, priced by the library."""
    c = cost.chat_cost(conversation_tokens=context, reply_tokens=1, cached_share=cached_share,
                       replica=replica, config=None, batch=batch, **kwargs)
    if c.batch != batch or c.step_s != replica.step_seconds(batch, context):
        raise AssertionError("test case: the batch does not fit at this context")
    return c


# ---------------------------------------------------------------------------
# Q1: dollars per million output tokens
# ---------------------------------------------------------------------------

def _output_case(replica, context, batch, price, label):
    step = replica.step_seconds(batch, context)
    expected = _turn(replica, context, batch, price_per_chip_hour=price).output_usd_per_million
    return Case(args=(price, replica.num_chips, step, batch), expected=expected, rel=1e-9, label=label)


def _output(price, chips, step, batch):
    """The same rate from the library's record for one output token."""
    return cost.ChatCost(input_tokens=1, cached_tokens=0, output_tokens=1, batch=batch, step_s=step,
                         prefill_chip_s=0.0, decode_chip_s=1 * step / batch * chips,
                         price_per_chip_hour=price).output_usd_per_million


Q1 = Question(
    id="q1", title="Dollars per million output tokens", function="cost_per_million_output_tokens", points=3,
    level="easy", minutes=6,
    visible=[_output_case(_R, 8000, 128, _B200_PRICE,
                          f"${_B200_PRICE}/chip-h, 8 chips, the 200B example's step at 128 people x 8,000 tokens, batch 128")],
    hidden=[
        _output_case(_R, 8000, 32, _B200_PRICE, "the 200B replica with only 32 people per step"),
        _output_case(_R, 8000, 1, _B200_PRICE, "the 200B replica serving one person"),
        _output_case(_H, 4000, 64, _H100_PRICE, f"4 H100s at ${_H100_PRICE} serving 70B, 64 people x 4,000 tokens"),
        Case(args=(2.0, 1, 0.02, 16), expected=_output(2.0, 1, 0.02, 16), rel=1e-9,
             label="$2/chip-h, 1 chip, 20 ms step, batch 16"),
        Case(args=(_B200_PRICE, 8, 0.0116, 0), raises=ValueError, label="batch 0"),
        Case(args=(_B200_PRICE, 8, 0.0, 128), raises=ValueError, label="a step of 0 s"),
        Case(args=(-1.0, 8, 0.0116, 128), raises=ValueError, label="a negative price"),
        Case(args=(_B200_PRICE, 0, 0.0116, 128), raises=ValueError, label="no chips"),
    ],
)


# ---------------------------------------------------------------------------
# Q2: dollars per million input tokens, cached ones included
# ---------------------------------------------------------------------------

def _input(price, chips, params, peak, efficiency, cached_share=0.0):
    """chat_cost's blended input rate (cached and fresh tokens in the denominator)."""
    chip = Chip(name="test", memory_bytes=1e15, hbm_bandwidth=1e13, flops={"fp8": peak})
    replica = Replica(chip=chip, num_chips=chips, num_params=params, weights_bytes=params, kv_bytes_per_token=1.0)
    # 1,000 prompt tokens: every share used below is a whole number of them
    return _turn(replica, 1000, 1, cached_share, price_per_chip_hour=price,
                 prefill_efficiency=efficiency).blended_input_usd_per_million


_SEED_IN = (_B200_PRICE, 8, 200e9, _PEAK_B200, 0.5)
_H100_IN = (_H100_PRICE, 4, 70e9, _PEAK_H100, 0.4)

Q2 = Question(
    id="q2", title="Dollars per million input tokens", function="cost_per_million_input_tokens", points=4,
    level="medium", minutes=10,
    visible=[Case(args=_SEED_IN, expected=_input(*_SEED_IN), rel=1e-9,
                  label=f"${_B200_PRICE}/chip-h, 8 chips, 200B, 4.5e15 ops/s per chip at 50%, nothing cached")],
    hidden=[
        Case(args=_SEED_IN, kwargs={"cached_share": 0.5}, expected=_input(*_SEED_IN, 0.5), rel=1e-9,
             label="the 200B replica, half the prompt cached"),
        Case(args=_SEED_IN, kwargs={"cached_share": 0.8}, expected=_input(*_SEED_IN, 0.8), rel=1e-9,
             label="the 200B replica, 80% cached"),
        Case(args=(_B200_PRICE, 16, 200e9, _PEAK_B200, 0.5), expected=_input(_B200_PRICE, 16, 200e9, _PEAK_B200, 0.5),
             rel=1e-9, label="16 chips instead of 8: same chip-seconds per token"),
        Case(args=_H100_IN, kwargs={"cached_share": 0.25}, expected=_input(*_H100_IN, 0.25), rel=1e-9,
             label=f"4 H100s at ${_H100_PRICE}, 70B at 40%, a quarter cached"),
        Case(args=(1.5, 1, 8e9, 989.4e12, 1.0), expected=_input(1.5, 1, 8e9, 989.4e12, 1.0), rel=1e-9,
             label="one chip at full efficiency, 8B"),
        Case(args=_SEED_IN, kwargs={"cached_share": 1.0}, raises=ValueError, label="cached_share 1"),
        Case(args=_SEED_IN, kwargs={"cached_share": -0.1}, raises=ValueError, label="cached_share -0.1"),
        Case(args=(_B200_PRICE, 8, 200e9, _PEAK_B200, 1.5), raises=ValueError, label="efficiency 1.5"),
        Case(args=(_B200_PRICE, 8, 200e9, _PEAK_B200, 0.0), raises=ValueError, label="efficiency 0"),
        Case(args=(_B200_PRICE, 8, 0, _PEAK_B200, 0.5), raises=ValueError, label="zero parameters"),
        Case(args=(0.0, 8, 200e9, _PEAK_B200, 0.5), raises=ValueError, label="a price of 0"),
    ],
)


# ---------------------------------------------------------------------------
# Q3: how many fresh input tokens one output token costs
# ---------------------------------------------------------------------------

def _ratio_case(replica, context, batch, label):
    step = replica.step_seconds(batch, context)
    args = (replica.num_chips, step, batch, replica.num_params, replica.chip.peak_flops(replica.dtype),
            replica.compute_efficiency)
    expected = _turn(replica, context, batch).output_to_input_ratio
    return Case(args=args, expected=expected, rel=1e-9, label=label)


def _ratio(chips, step, batch, params, peak, efficiency):
    return _output(1.0, chips, step, batch) / _input(1.0, chips, params, peak, efficiency)


Q3 = Question(
    id="q3", title="Output tokens cost more than input tokens", function="output_to_input_cost_ratio",
    points=4, level="medium", minutes=10,
    visible=[_ratio_case(_R, 8000, 128, "the 200B replica: 128 people x 8,000 tokens")],
    hidden=[
        _ratio_case(_R, 2000, 32, "the 200B replica, 32 people x 2,000 tokens"),
        _ratio_case(_R, 2000, 128, "the 200B replica, 128 people x 2,000 tokens"),
        _ratio_case(_R, 2000, 256, "the 200B replica, 256 people x 2,000 tokens: a bigger batch, a lower ratio"),
        _ratio_case(_R, 8000, 1, "the 200B replica serving one person"),
        _ratio_case(_H, 4000, 64, "4 H100s serving 70B, 64 people x 4,000 tokens"),
        Case(args=(1, 0.02, 16, 8e9, 989.4e12, 0.4), expected=_ratio(1, 0.02, 16, 8e9, 989.4e12, 0.4), rel=1e-9,
             label="1 chip, 20 ms step, batch 16, 8B at 40%"),
        Case(args=(8, 0.0116, 0, 200e9, _PEAK_B200, 0.5), raises=ValueError, label="batch 0"),
        Case(args=(8, -0.01, 128, 200e9, _PEAK_B200, 0.5), raises=ValueError, label="a negative step"),
        Case(args=(8, 0.0116, 128, 200e9, _PEAK_B200, 1.5), raises=ValueError, label="efficiency 1.5"),
    ],
)

# --------------------------------------------------------------------------- Q4

def _cheapest(weights_bytes, kv_bytes_per_token, context, chip_memory, bandwidth, price_per_chip_hour,
              tpot, chip_counts, max_batch):
    """Cheapest (chips, batch, dollars per million output tokens) that fits and keeps the TPOT promise."""
    if min(weights_bytes, chip_memory, bandwidth, price_per_chip_hour, tpot) <= 0:
        raise ValueError("sizes, bandwidth, price and tpot must be positive")
    if kv_bytes_per_token < 0 or context < 0 or max_batch < 1 or not chip_counts or min(chip_counts) < 1:
        raise ValueError("bad KV size, context, batch cap or chip counts")
    best = None
    for chips in sorted(set(chip_counts)):
        for batch in range(1, max_batch + 1):
            cache = batch * context * kv_bytes_per_token
            if weights_bytes + cache > chips * chip_memory:
                break                          # larger batches do not fit either
            step = (weights_bytes + cache) / (chips * bandwidth)
            if step > tpot:
                break                          # and are slower still
            dollars = chips * price_per_chip_hour / 3600 * step / batch * 1e6
            if best is None or dollars < best[2] * (1 - 1e-12):
                best = (chips, batch, dollars)
    return best


def _c24(*args, label=""):
    return Case(args=args, expected=_cheapest(*args), rel=1e-9, label=label)


_B200 = (192e9, 8e12, 6.69)        # an example chip: memory, bandwidth, price per chip-hour (inputs, not specs)

Q4 = Question(
    id="q4", title="The cheapest replica that keeps a TPOT promise", function="cheapest_replica",
    points=5, level="hard", minutes=20,
    visible=[_c24(140e9, 327_680, 4000, *_B200, 0.05, [1, 2, 4, 8], 1024,
                  label="a 70B model in bf16 at 4,000 tokens, 50 ms")],
    hidden=[
        _c24(140e9, 327_680, 4000, *_B200, 0.015, [1, 2, 4, 8], 1024, label="a 15 ms promise"),
        _c24(140e9, 327_680, 4000, *_B200, 0.05, [1, 2, 4, 8], 256, label="a batch cap of 256"),
        _c24(140e9, 327_680, 32_000, *_B200, 0.05, [2, 4, 8], 256, label="32,000-token contexts"),
        _c24(400e9, 163_840, 8000, *_B200, 0.04, [1, 2, 4, 8], 512, label="weights that need several chips"),
        _c24(16e9, 131_072, 2000, *_B200, 0.02, [1, 2], 64, label="a small model: the batch cap binds"),
        _c24(140e9, 327_680, 4000, *_B200, 0.004, [1, 2], 256, label="a promise no configuration keeps (None)"),
        _c24(16e9, 0, 2000, *_B200, 0.05, [1], 8, label="no KV cache"),
        Case(args=(140e9, 327_680, 4000, *_B200, 0.05, [], 256), raises=ValueError, label="no chip counts"),
        Case(args=(140e9, 327_680, 4000, *_B200, 0.0, [1], 256), raises=ValueError, label="tpot 0"),
        Case(args=(140e9, 327_680, 4000, *_B200, 0.05, [1], 0), raises=ValueError, label="batch cap 0"),
    ],
)

QUESTIONS = [Q1, Q2, Q3, Q4]
