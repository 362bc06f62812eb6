"""Exercise 23 · Sizing a serving pool: seats, replicas and the monthly bill. Hidden tests.

Expected values come from :mod:`servelab.kvcache` (the KV room and the seats it
grants) and from :func:`servelab.pool.size_pool` (its live seats, first-token
time, per-seat decode rate, replicas and monthly bill), so the exercise and
chapter 23 can never disagree. The one quantity the library does not print, the
cost per million output tokens at the pool's load, comes from the short
reference :func:`_usd_per_million` below, built on ``size_pool``'s bill.
"""
import math

from servelab import kvcache, pool
from servelab.grading import Case, Question
from servelab.pool import HOURS_PER_MONTH, POOL_CHIP_HOURLY_USD, Workload

GB = 1e9
_SMALL = kvcache.TIERS["small"]          # the chapter's 8B class on one 80 GB H100
_LARGE = kvcache.TIERS["large"]          # the 70B class on two
_BPT_8B = kvcache.kv_bytes_per_token(_SMALL.config, "bf16")
_BPT_8B_FP8 = kvcache.kv_bytes_per_token(_SMALL.config, "fp8")
_BPT_70B = kvcache.kv_bytes_per_token(_LARGE.config, "bf16")
_CARD = _SMALL.chip.memory_bytes
_CHAT = pool.WORKLOADS["chat"]
_DOCS = pool.WORKLOADS["documents"]


def _away_from_whole(x: float, what: str) -> None:
    """A test case must not sit on a rounding boundary, or two correct orders of operations could disagree."""
    if abs(x - round(x)) < 1e-6 * max(1.0, abs(x)):
        raise AssertionError(f"test case: {what} = {x!r} is too close to a whole number")


# ---------------------------------------------------------------------------
# Q1: seats one card grants
# ---------------------------------------------------------------------------

def _seats(card, weights, bpt, prompt, answer, margin=kvcache.DEFAULT_MARGIN):
    room = kvcache.kv_room_bytes(card, weights, margin)
    _away_from_whole(room / kvcache.seat_bytes(prompt + answer, bpt), "seats before rounding")
    return kvcache.seats_granted(room, bpt, prompt + answer)


def _seats_case(card, weights, bpt, prompt, answer, label, margin=None):
    kwargs = {} if margin is None else {"margin": margin}
    return Case(args=(card, weights, bpt, prompt, answer), kwargs=kwargs,
                expected=_seats(card, weights, bpt, prompt, answer, **kwargs), label=label)


# The chapter's default seat (1,200-token prompt + 200-token chat answer) on the 8B class:
# the pool's KV budget of 463,867 tokens holds 331 such seats.
_CHAPTER_SEATS = kvcache.kv_calculator(_SMALL, "bf16", seq_len=1200 + _CHAT.output_tokens,
                                       concurrent=10**6).seats_granted
if _CHAPTER_SEATS != _seats(_CARD, _SMALL.weights_bytes, _BPT_8B, 1200, _CHAT.output_tokens):
    raise AssertionError("test case: the seats do not match the pool's calculator")

Q1 = Question(
    id="q1", title="Seats one card grants", function="seats_per_card", points=3, level="easy", minutes=8,
    visible=[Case(args=(_CARD, _SMALL.weights_bytes, _BPT_8B, 1200, _CHAT.output_tokens),
                  expected=_CHAPTER_SEATS,
                  label="80 GB card, 16 GB of weights, 131,072 B/token, 1,200 + 200 tokens")],
    hidden=[
        _seats_case(_CARD, _SMALL.weights_bytes, _BPT_8B, 1200, _DOCS.output_tokens,
                    f"the chapter's card, a {_DOCS.output_tokens}-token document answer"),
        _seats_case(_CARD, _SMALL.weights_bytes, _BPT_8B_FP8, 1200, _CHAT.output_tokens,
                    "the chapter's card with an fp8 cache (half the bytes per token)"),
        _seats_case(_CARD, _SMALL.weights_bytes, _BPT_8B, 1200, _CHAT.output_tokens,
                    "the chapter's card, no safety margin", margin=0.0),
        _seats_case(_CARD, _SMALL.weights_bytes, _BPT_8B, 4000, 1000,
                    "the chapter's card, a 20% margin, 4,000 + 1,000 tokens", margin=0.2),
        _seats_case(_CARD, _SMALL.weights_bytes, _BPT_8B, 30_000, _CHAT.output_tokens,
                    "the chapter's card, 30,000-token prompts"),
        _seats_case(141 * GB, 70 * GB, _BPT_70B, 4000, 1000,
                    "141 GB card, 70B at 8 bits (70 GB), 327,680 B/token, 4,000 + 1,000 tokens"),
        Case(args=(_CARD, _SMALL.weights_bytes, _BPT_8B, 1_000_000, 200), expected=0,
             label="a million-token prompt: not one seat"),
        Case(args=(_CARD, 140 * GB, _BPT_70B, 1200, 200), raises=ValueError,
             label="140 GB of weights on an 80 GB card"),
        Case(args=(_CARD, _SMALL.weights_bytes, _BPT_8B, 0, 200), raises=ValueError, label="a zero-token prompt"),
        Case(args=(_CARD, _SMALL.weights_bytes, _BPT_8B, 1200, -5), raises=ValueError, label="a negative answer"),
        Case(args=(_CARD, _SMALL.weights_bytes, 0, 1200, 200), raises=ValueError, label="zero bytes per token"),
        Case(args=(_CARD, _SMALL.weights_bytes, _BPT_8B, 1200, 200), kwargs={"margin": 1.0}, raises=ValueError,
             label="margin 1 (nothing left for the cache)"),
        Case(args=(_CARD, _SMALL.weights_bytes, _BPT_8B, 1200, 200), kwargs={"margin": -0.1}, raises=ValueError,
             label="a negative margin"),
    ],
)


# ---------------------------------------------------------------------------
# Q2: replicas for a load (Little's law, as size_pool does it)
# ---------------------------------------------------------------------------

def _replicas_case(label, arrivals, utilisation, output_tokens=_CHAT.output_tokens, **knobs):
    """Readouts of ``size_pool`` in (seats, per-seat decode rate, first-token time), Little's law out.

    The seats, first-token time and decode rate do not depend on the arrival
    rate; the expected count is the reference :func:`_replicas` (Little's law,
    then whole replicas), which ``size_pool`` also uses as its starting point
    (``littles_law_replicas``) before planning for the percentiles.
    """
    r = pool.size_pool(workload=Workload("case", arrivals, output_tokens), simulate=False, **knobs)
    args = (arrivals, output_tokens, r.live_seats, r.per_seat_tokens_per_s, r.ttft_s, utilisation)
    if utilisation == 1.0 and r.littles_law_replicas != _replicas(*args):
        raise AssertionError("test case: the reference disagrees with the pool's Little's law")
    return Case(args=args, expected=_replicas(*args), label=label)


def _replicas(arrivals, output_tokens, seats, tokens_per_s_per_seat, ttft_s, utilisation):
    """Reference for inputs no pool produces: Little's law, then whole replicas."""
    in_flight = arrivals * (ttft_s + output_tokens / tokens_per_s_per_seat)
    _away_from_whole(in_flight / (seats * utilisation), "replicas before rounding")
    return math.ceil(in_flight / (seats * utilisation))


_TIMESTAMP = pool.FAMOUS_FAILURES["timestamp in the preamble"]
_LONG = pool.FAMOUS_FAILURES["long prompts"]
_WALL = pool.FAMOUS_FAILURES["memory wall"]

Q2 = Question(
    id="q2", title="Replicas for the peak", function="replicas_needed", points=4, level="medium", minutes=10,
    visible=[_replicas_case("the chapter's defaults at 40 requests/s, seats 70% full", 40.0, 0.7)],
    hidden=[
        _replicas_case(f"the chapter's chat workload ({_CHAT.peak_arrivals_per_s:g}/s), every seat used",
                       _CHAT.peak_arrivals_per_s, 1.0),
        _replicas_case("the chapter's defaults at 40 requests/s, every seat used", 40.0, 1.0),
        _replicas_case("document answers at 12 requests/s, 85% full", 12.0, 0.85,
                       output_tokens=_DOCS.output_tokens),
        _replicas_case("the 70B class at 10 requests/s, 70% full", 10.0, 0.7, tier="large"),
        _replicas_case("a 60,000-token preamble with no prefix hits: the first token is a large share",
                       _CHAT.peak_arrivals_per_s, 0.9, **_TIMESTAMP.broken),
        _replicas_case("20,000-token documents: memory grants fewer seats than asked", 6.0, 0.75,
                       output_tokens=_DOCS.output_tokens, prompt_tokens=_DOCS.prompt_tokens, **_LONG.broken),
        _replicas_case("400 seats asked for: memory grants fewer", 30.0, 0.8, **_WALL.broken),
        Case(args=(10.0, 500, 32, 25.0, 0.5, 0.8), expected=_replicas(10.0, 500, 32, 25.0, 0.5, 0.8),
             label="10/s, 500 tokens at 25 tok/s a seat, 32 seats, 0.5 s first token, 80% full"),
        # exactly 8 replicas' worth (8/s x (1 s + 475/25 s) = 160 in flight over 32 x 0.625 = 20 a replica):
        # a whole number needs no extra replica, which int(x) + 1 gets wrong
        Case(args=(8.0, 475, 32, 25.0, 1.0, 0.625), expected=8,
             label="8/s, 475 tokens at 25 tok/s, 1 s first token, 32 seats 62.5% full: exactly 8.0 replicas"),
        Case(args=(4.0, 200, 0, 106.0, 0.03, 0.7), raises=ValueError, label="zero seats"),
        Case(args=(4.0, 200, 16, 0.0, 0.03, 0.7), raises=ValueError, label="a decode rate of 0"),
        Case(args=(0.0, 200, 16, 106.0, 0.03, 0.7), raises=ValueError, label="no arrivals"),
        Case(args=(4.0, 200, 16, 106.0, -0.03, 0.7), raises=ValueError, label="a negative first-token time"),
        Case(args=(4.0, 200, 16, 106.0, 0.03, 0.0), raises=ValueError, label="utilisation 0"),
        Case(args=(4.0, 200, 16, 106.0, 0.03, 1.2), raises=ValueError, label="utilisation 1.2"),
    ],
)


# ---------------------------------------------------------------------------
# Q3: the monthly bill and what a million output tokens cost at that load
# ---------------------------------------------------------------------------

def _usd_per_million(monthly_usd, arrivals, output_tokens):
    """Reference (the library has no such readout): the month's bill over the month's output tokens."""
    tokens_per_month = arrivals * output_tokens * 3600 * HOURS_PER_MONTH
    return monthly_usd / tokens_per_month * 1e6


def _bill_case(label, workload=_CHAT, **knobs):
    r = pool.size_pool(workload=workload, simulate=False, **knobs)
    tier = kvcache.get_tier(knobs.get("tier", "small"))
    price = knobs.get("price_per_chip_hour", POOL_CHIP_HOURLY_USD)
    args = (r.replicas, tier.num_chips, price, workload.peak_arrivals_per_s, workload.output_tokens)
    expected = (r.monthly_usd, _usd_per_million(r.monthly_usd, workload.peak_arrivals_per_s,
                                                 workload.output_tokens))
    return Case(args=args, expected=expected, rel=1e-9, label=label)


_UPGRADE = pool.FAMOUS_FAILURES["quality upgrade"]
_BUSY = Workload("busy chat", 40.0, 200)
_QUOTE = 2.5   # a cheaper rental quote than the chapter's, dollars per chip-hour

Q3 = Question(
    id="q3", title="The monthly bill", function="pool_bill", points=4, level="medium", minutes=10,
    visible=[_bill_case(f"the chapter's pool: 1 replica of 1 card at ${POOL_CHIP_HOURLY_USD}/chip-h, "
                        f"{_CHAT.peak_arrivals_per_s:g} requests/s x {_CHAT.output_tokens} tokens")],
    hidden=[
        _bill_case(f"the chapter's pool on the document workload ({_DOCS.peak_arrivals_per_s:g}/s x "
                   f"{_DOCS.output_tokens} tokens)", workload=_DOCS),
        _bill_case("the quality upgrade: 70B class, 2 cards a replica", **_UPGRADE.broken),
        _bill_case("the timestamp failure: 60,000-token prompts", workload=_DOCS, **_TIMESTAMP.broken),
        _bill_case("the chapter's defaults at 40 requests/s", workload=_BUSY),
        _bill_case(f"the 70B class at 40 requests/s, ${_QUOTE:.2f} a chip-hour", workload=_BUSY, tier="large",
                   price_per_chip_hour=_QUOTE),
        Case(args=(0, 1, POOL_CHIP_HOURLY_USD, 4.0, 200), raises=ValueError, label="zero replicas"),
        Case(args=(1, 0, POOL_CHIP_HOURLY_USD, 4.0, 200), raises=ValueError, label="zero chips a replica"),
        Case(args=(1, 1, -1.0, 4.0, 200), raises=ValueError, label="a negative price"),
        Case(args=(1, 1, POOL_CHIP_HOURLY_USD, 0.0, 200), raises=ValueError, label="no traffic"),
        Case(args=(1, 1, POOL_CHIP_HOURLY_USD, 4.0, 0), raises=ValueError, label="zero-token answers"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
