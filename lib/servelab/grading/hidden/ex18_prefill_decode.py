"""Exercise 18 · Prefill meets decode: a chunk size for a gap target, a prefill:decode split, the split
for a trace, and a chunked-prefill token budget for two promises. Hidden tests.

Expected values come from :func:`servelab.sim.pools.largest_chunk` and
:func:`servelab.sim.pools.best_split`, the functions chapter 18 uses.
"""
import math
import random

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


# --------------------------------------------------------------------------- Q4

def _q4_serve(trace, budget, base_s, per_token_s):
    """One budget: (nearest-rank p95 time to first token, the slowest step anyone waited through)."""
    t, nxt = 0.0, 0
    waiting = []                      # [request, prompt tokens still to prefill], first come first
    decoding = {}                     # request -> tokens it has still to produce
    first = [0.0] * len(trace)
    worst_gap = 0.0
    while nxt < len(trace) or waiting or decoding:
        if not waiting and not decoding:
            t = max(t, trace[nxt][0])                 # idle until the next arrival
        while nxt < len(trace) and trace[nxt][0] <= t:
            waiting.append([nxt, trace[nxt][1]])      # arrived by the step's start
            nxt += 1
        rows = list(decoding)                         # every stream decodes one token
        room = budget - len(rows)                     # prompt chunks fill what is left
        chunks = []
        for w in waiting:
            if room <= 0:
                break
            take = min(w[1], room)
            chunks.append((w, take))
            room -= take
        step = base_s + per_token_s * (len(rows) + sum(take for _, take in chunks))
        t += step
        if rows:                                      # someone waited this step for a token
            worst_gap = max(worst_gap, step)
        for r in rows:
            decoding[r] -= 1
            if decoding[r] == 0:
                del decoding[r]
        for w, take in chunks:
            w[1] -= take
            if w[1] == 0:                             # prompt done: its first token, now
                first[w[0]] = t - trace[w[0]][0]
                if trace[w[0]][2] > 1:
                    decoding[w[0]] = trace[w[0]][2] - 1
        waiting = [w for w in waiting if w[1] > 0]
    rank = math.ceil(0.95 * len(trace))
    return sorted(first)[rank - 1], worst_gap


def _choose_budget(trace, budgets, base_s, per_token_s, ttft_p95_s, itl_s):
    """Reference: every budget simulated; of those that keep both promises, the shortest worst gap
    (the smaller budget on a tie), with its p95 time to first token and worst gap."""
    if not trace or not budgets or min(budgets) < 1:
        raise ValueError("a trace and budgets of at least one token")
    if base_s < 0 or per_token_s <= 0 or ttft_p95_s <= 0 or itl_s <= 0:
        raise ValueError("costs and promises must be positive")
    for k, (arrival, prompt, output) in enumerate(trace):
        if prompt < 1 or output < 1 or (k and arrival < trace[k - 1][0]):
            raise ValueError("prompts and outputs of at least one token, arrivals in order")
    best = None
    for budget in budgets:
        ttft, gap = _q4_serve(trace, budget, base_s, per_token_s)
        if ttft <= ttft_p95_s and gap <= itl_s:
            if best is None or (gap, budget) < (best[2], best[0]):
                best = (budget, ttft, gap)
    return best


def _q4_trace(seed, n, rate, prompt=(500, 3000), output=(50, 300)):
    """Poisson arrivals at ``rate`` a second, uniform prompt and output lengths."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((round(t, 3), rng.randint(*prompt), rng.randint(*output)))
    return out


def _c4(trace, budgets, base_s, per_token_s, ttft_p95_s, itl_s, label):
    got = _choose_budget(trace, budgets, base_s, per_token_s, ttft_p95_s, itl_s)
    return Case(args=(trace, budgets, base_s, per_token_s, ttft_p95_s, itl_s),
                expected=None if got is None else tuple(got), rel=1e-9, abs=1e-12, label=label)


_V = [(0.0, 3000, 40), (0.1, 3000, 40), (0.2, 500, 40), (0.3, 2000, 40), (0.5, 800, 40), (0.6, 1200, 40)]
_B = [256, 512, 1024, 2048]
_T = _q4_trace(3, 60, 4.0)
_T2 = _q4_trace(11, 80, 6.0, prompt=(200, 4000), output=(1, 400))
_MIX = [2048, 256, 1024, 512, 128]
# Steps of 2^-7 s + 2^-15 s a token and arrivals on eighths of a second: every time is exact in
# binary, so a budget can sit exactly on a promise whatever order an answer adds its times in.
_EXACT = [(0.0, 3000, 40), (0.125, 3000, 40), (0.25, 500, 40), (0.375, 2000, 40), (0.5, 800, 40),
          (0.625, 1200, 40)]

Q4 = Question(
    id="q4", title="A chunked-prefill token budget for two promises", function="choose_budget",
    points=6, level="hard", minutes=30, timeout=20.0,
    visible=[_c4(_V, _B, 0.010, 3e-5, 0.25, 0.03, "six requests, first token p95 0.25 s, gaps 30 ms")],
    hidden=[
        _c4(_V, _B, 0.010, 3e-5, 0.15, 0.045, "a tighter first-token promise needs a larger budget"),
        _c4(_V, _B, 0.010, 3e-5, 0.15, 0.04, "no budget keeps both (None)"),
        _c4(_V, _B, 0.010, 3e-5, 1.0, 0.02, "a loose first-token promise: the smallest gaps"),
        _c4(_V, [8192, 4096], 0.010, 3e-5, 1.0, 1.0, "two budgets larger than any step: the same gaps, the smaller"),
        _c4(_T, _MIX, 0.010, 3e-5, 0.5, 0.03, "60 requests at 4 a second"),
        _c4(_T, _MIX, 0.010, 3e-5, 0.2, 0.05, "60 requests, first token p95 0.2 s"),
        _c4(_T, _MIX, 0.010, 3e-5, 0.16, 0.2, "60 requests, first token p95 0.16 s"),
        _c4(_T2, [384, 768, 1536, 3072], 0.008, 2.5e-5, 0.6, 0.04, "80 requests, some of one output token"),
        _c4(_T2, [384, 768, 1536, 3072], 0.008, 2.5e-5, 0.3, 0.06, "80 requests, first token p95 0.3 s"),
        _c4([(0.0, 50, 300)] * 40 + [(0.05, 2000, 10)], [16, 64, 256, 1024], 0.01, 3e-5, 0.5, 0.05,
            "40 streams at once: more decode rows than a small budget"),
        _c4([(0.0, 1000, 5), (10.0, 1000, 5), (10.0, 3000, 1), (20.0, 10, 1)], [128, 512, 4096], 0.01, 3e-5,
            1.0, 0.2, "idle between arrivals; a prompt with no one decoding beside it"),
        _c4(_EXACT, [256, 512, 1024], 2 ** -7, 2 ** -15, 0.2, 0.0234375,
            "512's worst gap is exactly the promise (at most: it keeps it)"),
        _c4(_EXACT, [256, 512, 1024], 2 ** -7, 2 ** -15, 0.25, 0.05,
            "256's first-token p95 is exactly the promise (at most: it keeps it)"),
        _c4([(0.0, 100, 1), (0.5, 3000, 1), (0.5, 200, 1)], [128, 1024], 0.01, 3e-5, 1.0, 0.001,
            "no stream emits a second token: every worst gap is 0"),
        Case(args=([], _B, 0.01, 3e-5, 1.0, 0.05), raises=ValueError, label="an empty trace"),
        Case(args=(_V, [0, 256], 0.01, 3e-5, 1.0, 0.05), raises=ValueError, label="a budget of 0 tokens"),
        Case(args=(_V, _B, 0.01, 0.0, 1.0, 0.05), raises=ValueError, label="tokens that cost nothing"),
        Case(args=([(1.0, 10, 1), (0.5, 10, 1)], _B, 0.01, 3e-5, 1.0, 0.05), raises=ValueError,
             label="arrivals out of order"),
        Case(args=([(0.0, 0, 5)], _B, 0.01, 3e-5, 1.0, 0.05), raises=ValueError, label="an empty prompt"),
    ],
)

QUESTIONS = [Q1, Q2, Q3, Q4]
assert _q4_serve(_EXACT, 512, 2 ** -7, 2 ** -15)[1] == 0.0234375       # the boundary cases sit on
assert _q4_serve(_EXACT, 256, 2 ** -7, 2 ** -15)[0] == 0.25            # their promises exactly
