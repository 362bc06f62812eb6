"""Exercise 18 · Prefill meets decode: a chunk size for a gap target, a prefill:decode split. Hidden tests.

Expected values come from :func:`servelab.sim.pools.largest_chunk` and
:func:`servelab.sim.pools.best_split`, the functions chapter 18 uses.
"""
from servelab.grading import Case, Question
from servelab.sim.pools import best_split, largest_chunk


def _chunk(*args, label):
    return Case(args=args, expected=largest_chunk(*args), label=label)


Q1 = Question(
    id="q1", title="The largest chunk for a gap target", function="largest_chunk", points=4, level="medium",
    minutes=10,
    visible=[_chunk(0.050, 0.006, 70e-6, 20e-6, 32, label="50 ms target, 6 ms fixed, 70 us/token, 32 rows")],
    hidden=[
        _chunk(0.030, 0.010, 50e-6, 100e-6, 64, label="30 ms, 10 ms fixed, 64 rows at 0.1 ms each"),
        _chunk(0.1, 0.002, 1e-5, 0.0, 0, label="no decodes running"),
        _chunk(0.050, 0.006, 70e-6, 20e-6, 1, label="one stream"),
        Case(args=(0.0105, 0.0005, 1e-5, 0.0, 0), expected=1000,
             label="room of exactly 1,000 tokens: 1,000, not 999 or 1,001"),
        Case(args=(0.01, 0.006, 70e-6, 1e-4, 64), raises=ValueError,
             label="the decodes alone overrun the target: no chunk fits"),
        Case(args=(0.0, 0.006, 70e-6, 1e-4, 4), raises=ValueError, label="a zero target"),
        Case(args=(0.05, 0.006, 0.0, 1e-4, 4), raises=ValueError, label="prompt tokens that cost nothing"),
    ],
)


def _split(*args, label):
    return Case(args=args, expected=best_split(*args), label=label)


Q2 = Question(
    id="q2", title="Balance prefill against decode", function="prefill_gpus", points=4, level="medium",
    minutes=10,
    visible=[_split(4, 3.2, 0.8, label="4 GPUs, 3.2 GPU-s/s of prefill, 0.8 of decode (a coding tool)")],
    hidden=[
        _split(4, 0.1, 3.33, label="essays: little prefill, much decode"),
        _split(8, 2.0, 2.0, label="equal work on 8 GPUs"),
        _split(4, 1.4, 2.6, label="the even ratio says 1.4 prefill GPUs, but 2 keep the busier pool less busy"),
        _split(10, 1.0, 5.0, label="a 1:5 mix on 10 GPUs"),
        _split(2, 5.0, 0.1, label="two GPUs: one each, whatever the mix"),
        _split(5, 1.0, 1.0, label="equal work on 5 GPUs: 2 and 3 tie, fewer prefill GPUs wins"),
        Case(args=(1, 1.0, 1.0), raises=ValueError, label="one GPU cannot be split"),
        Case(args=(4, 0.0, 1.0), raises=ValueError, label="no prefill work"),
    ],
)

# --------------------------------------------------------------------------- Q3

def _split_for_trace(trace, total_cards, prefill_tokens_per_second, step_base, step_per_seq,
                     ttft_p95, tpot):
    """Fewest prefill cards of ``total_cards`` that keep both promises for ``trace``, or None."""
    import math

    if isinstance(total_cards, bool) or not isinstance(total_cards, int) or total_cards < 2:
        raise ValueError("need at least two cards (one per pool)")
    if prefill_tokens_per_second <= 0 or step_base < 0 or step_per_seq <= 0 or ttft_p95 <= 0:
        raise ValueError("rates and times must be positive")
    seats = math.floor((tpot - step_base) / step_per_seq + 1e-9)
    if seats < 1:
        raise ValueError("no decode step meets the TPOT promise")
    times = [t for t, _, _ in trace]
    if times != sorted(times) or any(p < 1 or o < 1 for _, p, o in trace):
        raise ValueError("the trace must be sorted, with positive prompt and output lengths")
    if not trace:
        return (1, total_cards - 1)
    for prefill in range(1, total_cards):
        free_at = [0.0] * prefill
        ttft, events = [], []
        for arrival, prompt, output in trace:
            card = min(range(prefill), key=lambda c: (free_at[c], c))
            done = max(arrival, free_at[card]) + prompt / prefill_tokens_per_second
            free_at[card] = done
            ttft.append(done - arrival)
            events += [(done, 1), (done + (output - 1) * tpot, -1)]
        p95 = sorted(ttft)[math.ceil(0.95 * len(ttft)) - 1]
        if p95 > ttft_p95 + 1e-12:
            continue
        live = peak = 0
        for _, change in sorted(events, key=lambda e: (e[0], e[1])):   # ends before starts
            live += change
            peak = max(peak, live)
        if (total_cards - prefill) * seats >= peak:
            return (prefill, total_cards - prefill)
    return None


def _trace(n, gap, prompt, output, burst_every=0, seed=0):
    import random
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += 0.0 if burst_every and i % burst_every else gap
        out.append((round(t, 6), prompt + rng.randrange(0, prompt // 2 + 1), output + rng.randrange(0, output + 1)))
    return out


_STEP = (4000.0, 0.010, 0.0005)   # prefill tokens/s per card; decode step = 10 ms + 0.5 ms a sequence


def _c18(trace, cards, ttft, tpot, label):
    args = (trace, cards) + _STEP + (ttft, tpot)
    return Case(args=args, expected=_split_for_trace(*args), label=label)


_STEADY = _trace(60, 0.25, 2000, 200)
_BURSTY = _trace(60, 1.5, 2000, 200, burst_every=6, seed=1)

Q3 = Question(
    id="q3", title="Disaggregate: split the cards for a trace and two promises", function="split_for_trace",
    points=6, level="hard", minutes=25,
    visible=[_c18(_STEADY, 5, 1.0, 0.02, "60 requests, one every 250 ms, 5 cards")],
    hidden=[
        _c18(_STEADY, 6, 1.0, 0.012, "a tighter TPOT promise: too few decode seats (None)"),
        _c18(_STEADY, 8, 1.0, 0.012, "a tighter TPOT promise with 8 cards"),
        _c18(_BURSTY, 12, 1.0, 0.02, "bursts of six: the queue, not the average, sets the p95"),
        _c18(_BURSTY, 12, 1.5, 0.02, "bursts with a looser first-token promise"),
        _c18(_BURSTY, 8, 1.0, 0.02, "bursts on 8 cards"),
        _c18(_trace(40, 0.1, 2000, 60), 6, 4.0, 0.015,
             "a long prefill queue: a request takes a decode seat at its first token, not at arrival"),
        _c18([(float(i), 400, 20) for i in range(19)] + [(19.0, 8000, 20)], 4, 1.0, 0.02,
             "one slow prompt in 20 is the top 5%: the nearest-rank p95 is the 19th of 20"),
        _c18(_STEADY[:1], 2, 1.0, 0.02, "one request"),
        _c18([], 3, 1.0, 0.02, "no requests: one prefill card is the fewest"),
        _c18(_trace(20, 0.5, 1000, 1, seed=2), 6, 1.0, 0.012, "one output token: no decoding at all"),
        Case(args=(_STEADY, 1) + _STEP + (1.0, 0.05), raises=ValueError, label="one card"),
        Case(args=(_STEADY, 8) + _STEP + (1.0, 0.0101), raises=ValueError, label="no step meets the TPOT"),
        Case(args=(list(reversed(_STEADY)), 8) + _STEP + (1.0, 0.05), raises=ValueError, label="unsorted trace"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
