"""Exercise 9 · Batching and step time: prefill, first token, the step model. Hidden tests.

Expected values come from :mod:`servelab.arith` and :mod:`servelab.roofline`.
"""
from servelab import arith, roofline as rl
from servelab.grading import Case, Question
from servelab.specs import Chip


def _chip(peak):
    return Chip(name="test", memory_bytes=1e11, hbm_bandwidth=1e12, flops={"fp8": peak})


def _prefill(params, tokens, peak, chips, eff, cached=0):
    if cached == tokens:
        return 0.0
    return arith.prefill_seconds(arith.prefill_ops(params, tokens, cached_tokens=cached), _chip(peak), chips, eff)


Q1 = Question(
    id="q1", title="Prefill time", function="prefill_seconds", points=2, level="easy", minutes=6,
    visible=[Case(args=(200e9, 3000, 4.5e15, 8, 0.5), expected=_prefill(200e9, 3000, 4.5e15, 8, 0.5), rel=1e-9,
                  label="200B, 3,000 tokens, 8 chips of 4.5 PFLOPS at 50%")],
    hidden=[
        Case(args=(70e9, 8000, 989.4e12, 2, 0.4), expected=_prefill(70e9, 8000, 989.4e12, 2, 0.4), rel=1e-9),
        Case(args=(200e9, 3000, 4.5e15, 8, 0.5), kwargs={"cached_tokens": 2000},
             expected=_prefill(200e9, 3000, 4.5e15, 8, 0.5, 2000), rel=1e-9, label="2,000 of 3,000 cached"),
        Case(args=(200e9, 3000, 4.5e15, 8, 0.5), kwargs={"cached_tokens": 3000}, expected=0.0,
             label="fully cached prompt"),
        Case(args=(8e9, 1, 989.4e12, 1, 1.0), expected=_prefill(8e9, 1, 989.4e12, 1, 1.0), rel=1e-9),
        Case(args=(200e9, 3000, 4.5e15, 8, 0.5), kwargs={"cached_tokens": 4000}, raises=ValueError,
             label="more cached than sent"),
        Case(args=(200e9, 0, 4.5e15, 8, 0.5), raises=ValueError, label="empty prompt"),
        Case(args=(200e9, 3000, 4.5e15, 8, 0), raises=ValueError, label="efficiency 0"),
        Case(args=(200e9, 3000, 4.5e15, 0, 0.5), raises=ValueError, label="zero chips"),
    ],
)


def _step(w, b, l, k, bw, eff=0.6, over=0.002):
    return rl.decode_step_seconds(w, k, b, l, bw, eff, over)


Q2 = Question(
    id="q2", title="The decode step", function="decode_step_seconds", points=3, level="medium", minutes=8,
    visible=[Case(args=(200e9, 128, 8000, 163_840, 64e12), expected=_step(200e9, 128, 8000, 163_840, 64e12),
                  rel=1e-9, label="the 200B example: 128 people at 8,000 tokens")],
    hidden=[
        Case(args=(200e9, 1, 0, 163_840, 64e12), expected=_step(200e9, 1, 0, 163_840, 64e12), rel=1e-9,
             label="one person, empty cache"),
        Case(args=(140e9, 16, 4000, 327_680, 6.7e12), kwargs={"efficiency": 0.7, "overhead_s": 0.001},
             expected=_step(140e9, 16, 4000, 327_680, 6.7e12, 0.7, 0.001), rel=1e-9),
        Case(args=(200e9, 128, 128_000, 163_840, 64e12), kwargs={"overhead_s": 0.0},
             expected=_step(200e9, 128, 128_000, 163_840, 64e12, 0.6, 0.0), rel=1e-9, label="no overhead"),
        Case(args=(200e9, 0, 8000, 163_840, 64e12), raises=ValueError, label="zero people"),
        Case(args=(200e9, 128, -1, 163_840, 64e12), raises=ValueError, label="negative length"),
        Case(args=(200e9, 128, 8000, 163_840, 64e12), kwargs={"efficiency": 1.5}, raises=ValueError),
    ],
)


def _ttft(params, tokens, cached, peak, chips, eff, step, queue=0.0, n=1):
    """Queue + prefill (at least the last prompt token) + one step per token after the first.

    The first token is sampled from the prefill's last logits: no decode step
    comes before it. A fully cached prompt still computes its last token.
    """
    fresh_from = min(cached, tokens - 1)
    return queue + _prefill(params, tokens, peak, chips, eff, fresh_from) + (n - 1) * step


Q3 = Question(
    id="q3", title="Time to first token", function="time_to_first_token", points=3, level="medium", minutes=8,
    visible=[Case(args=(200e9, 3000, 0, 4.5e15, 8, 0.5, 0.0116),
                  expected=_ttft(200e9, 3000, 0, 4.5e15, 8, 0.5, 0.0116), rel=1e-9,
                  label="3,000 fresh tokens, 11.6 ms decode steps")],
    hidden=[
        Case(args=(200e9, 3000, 2400, 4.5e15, 8, 0.5, 0.0116), kwargs={"queue_seconds": 0.05},
             expected=_ttft(200e9, 3000, 2400, 4.5e15, 8, 0.5, 0.0116, 0.05), rel=1e-9,
             label="80% cached, 50 ms in the queue"),
        Case(args=(8e9, 1200, 360, 989.4e12, 1, 0.4, 0.008),
             expected=_ttft(8e9, 1200, 360, 989.4e12, 1, 0.4, 0.008), rel=1e-9),
        Case(args=(200e9, 3000, 3000, 4.5e15, 8, 0.5, 0.0116),
             expected=_ttft(200e9, 3000, 3000, 4.5e15, 8, 0.5, 0.0116), rel=1e-9,
             label="fully cached: the last prompt token is still computed"),
        Case(args=(200e9, 3000, 0, 4.5e15, 8, 0.5, 0.0116), kwargs={"tokens": 10},
             expected=_ttft(200e9, 3000, 0, 4.5e15, 8, 0.5, 0.0116, n=10), rel=1e-9,
             label="time until the 10th token"),
        Case(args=(200e9, 3000, 1000, 4.5e15, 8, 0.5, 0.02), kwargs={"queue_seconds": 0.3, "tokens": 2},
             expected=_ttft(200e9, 3000, 1000, 4.5e15, 8, 0.5, 0.02, 0.3, 2), rel=1e-9,
             label="the 2nd token after a 300 ms queue"),
        Case(args=(200e9, 3000, 0, 4.5e15, 8, 0.5, -0.01), raises=ValueError, label="negative step"),
        Case(args=(200e9, 3000, 0, 4.5e15, 8, 0.5, 0.0116), kwargs={"queue_seconds": -1}, raises=ValueError,
             label="negative queue time"),
        Case(args=(200e9, 3000, 0, 4.5e15, 8, 0.5, 0.0116), kwargs={"tokens": 0}, raises=ValueError,
             label="tokens=0"),
        Case(args=(200e9, 3000, 3500, 4.5e15, 8, 0.5, 0.0116), raises=ValueError,
             label="more cached than sent"),
    ],
)

# --------------------------------------------------------------------------- Q4

def _first_token_times(arrivals, max_batch, step_seconds, continuous):
    """Time to first token of each request, static or continuous batching, one replica."""
    waiting = list(range(len(arrivals)))
    running, left, ttft = [], {}, [None] * len(arrivals)
    clock = 0.0
    while waiting or running:
        if not running:
            clock = max(clock, arrivals[waiting[0]][0])
        if continuous or not running:
            while waiting and len(running) < max_batch and arrivals[waiting[0]][0] <= clock + 1e-12:
                i = waiting.pop(0)
                running.append(i)
                left[i] = arrivals[i][1]
        clock += step_seconds
        for i in running:
            if ttft[i] is None:
                ttft[i] = clock - arrivals[i][0]
            left[i] -= 1
        running = [i for i in running if left[i] > 0]
    return ttft


def _p95_both(arrivals, max_batch, step_seconds):
    import math

    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError("max_batch must be a positive integer")
    if step_seconds <= 0:
        raise ValueError("step_seconds must be positive")
    times = [t for t, _ in arrivals]
    if not arrivals or times != sorted(times) or any(n < 1 for _, n in arrivals):
        raise ValueError("need a sorted, non-empty trace with outputs of at least one token")
    rank = math.ceil(0.95 * len(arrivals)) - 1
    return tuple(sorted(_first_token_times(arrivals, max_batch, step_seconds, c))[rank] for c in (False, True))


def _mixed_trace(n, seed):
    import random
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.choice([0.0, 0.0, 0.01, 0.05, 0.2])
        out.append((round(t, 4), rng.choice([1, 2, 5, 40, 120])))
    return out


def _c9(arrivals, max_batch, step_seconds, label):
    return Case(args=(arrivals, max_batch, step_seconds), expected=_p95_both(arrivals, max_batch, step_seconds),
                rel=1e-9, abs=1e-12, label=label)


_Q4_VISIBLE = [(0.0, 100), (0.01, 3), (0.02, 3), (0.5, 2)]

Q4 = Question(
    id="q4", title="First-token p95: static against continuous batching", function="first_token_p95",
    points=5, level="hard", minutes=20,
    visible=[_c9(_Q4_VISIBLE, 2, 0.02, "a long answer holds a static batch")],
    hidden=[
        _c9(_mixed_trace(40, 1), 8, 0.02, "40 requests, mixed lengths, 8 seats"),
        _c9(_mixed_trace(40, 2), 4, 0.03, "40 requests, 4 seats"),
        _c9(_mixed_trace(21, 3), 32, 0.02, "more seats than requests at any time"),
        _c9([(0.0, 5)], 4, 0.02, "one request: both policies agree"),
        _c9([(0.0, 1)] * 10, 3, 0.01, "ten at once, one token each"),
        _c9([(0.0, 50), (0.0, 1), (0.001, 1), (0.002, 1)], 2, 0.01,
            "arrivals during a step join at the next boundary"),
        _c9([(float(i), 2) for i in range(20)], 1, 0.25, "one seat: no batching at all"),
        Case(args=([], 4, 0.02), raises=ValueError, label="no requests"),
        Case(args=([(0.0, 2)], 0, 0.02), raises=ValueError, label="no seats"),
        Case(args=([(1.0, 2), (0.0, 2)], 2, 0.02), raises=ValueError, label="unsorted"),
        Case(args=([(0.0, 0)], 2, 0.02), raises=ValueError, label="an empty answer"),
    ],
)

QUESTIONS = [Q1, Q2, Q3, Q4]
