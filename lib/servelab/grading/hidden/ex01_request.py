"""Exercise 1 · A request's life: token timing, a stop-string streamer, a conversation's bill.

Expected answers come from the library (:func:`servelab.loadgen.token_latencies`,
:func:`servelab.engine.stop.holdback_stream` (the engine's one holdback rule), :mod:`servelab.server.billing`),
so the exercise and chapter 1 cannot drift apart.
"""
import random

from servelab.grading import Case, Question
from servelab.loadgen import token_latencies
from servelab.server.billing import Rates, bill_turn
from servelab.engine.stop import holdback_stream


# ---------------------------------------------------------------------- Q1
def _timing(sent, times):
    lat = token_latencies(sent, times)
    return {"ttft": lat["ttft"], "tpot": lat["tpot"], "itl": lat["itl"]}


def _t1(sent, times, label):
    return Case(args=(sent, times), expected=_timing(sent, times), rel=1e-9, abs=1e-12, label=label)


Q1 = Question(
    id="q1", title="TTFT, TPOT and inter-token gaps from a timestamp log", function="token_timing",
    points=3, level="easy", minutes=8,
    visible=[_t1(100.0, [100.25, 100.30, 100.36, 100.40],
                 "sent at 100.0 s, four tokens at 100.25, 100.30, 100.36, 100.40")],
    hidden=[
        _t1(0.0, [1.0, 1.5], "two tokens: one gap"),
        _t1(5.0, [5.0, 5.0, 5.1], "a token at the send instant, and two in the same chunk"),
        _t1(10.0, [12.0, 12.01, 12.03, 12.06, 12.10, 12.15], "a slow first token (long queue), then fast decode"),
        _t1(0.0, [0.5], "one token: no TPOT (None), no gaps"),
        _t1(0.0, [0.2, 0.21, 0.22, 0.23, 0.73],
            "a stall before the last token: TPOT is the average pace, not the typical (median) gap"),
        Case(args=(0.0, []), raises=ValueError, label="no tokens at all"),
        Case(args=(1.0, [1.2, 1.1]), raises=ValueError, label="timestamps out of order"),
        Case(args=(2.0, [1.5, 2.5]), raises=ValueError, label="a token before the request was sent"),
    ],
)


# ---------------------------------------------------------------------- Q2
def _t2(pieces, stops, label):
    return Case(args=(pieces, stops), expected=holdback_stream(pieces, stops), label=label)


def _expected_text(pieces, stops):
    text = "".join(pieces)
    cut = min((i for s in stops if (i := text.find(s)) != -1), default=len(text))
    return text[:cut]


def _stream_property_test(func):
    """Random pieces with stop strings spliced in at random places (stops never overlap)."""
    rng = random.Random(1)
    alphabet = "ab c\n"
    for trial in range(300):
        stops = rng.choice([["XY"], ["ZZZ"], ["XY", "ZZZ"], ["\n\nUser:"], ["END", "XY"]])
        body = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.7:
            stop = rng.choice(stops)
            at = rng.randint(0, len(body))
            k = rng.randint(0, len(stop) - 1) if rng.random() < 0.3 else len(stop)
            body = body[:at] + stop[:k] + body[at:]  # k < len: a near-miss that must be released
            if k == len(stop) and rng.random() < 0.5:
                body += rng.choice(stops)
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(0, 8)))) if len(body) > 1 else []
        pieces = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)])] if body else [""]
        want = _expected_text(pieces, stops)
        got = func(list(pieces), list(stops))
        where = f"pieces={pieces!r}, stops={stops!r}"
        assert isinstance(got, list) and len(got) == len(pieces), \
            f"{where}: return one delta per piece ({len(pieces)}), got {got!r}"
        assert all(isinstance(d, str) for d in got), f"{where}: every delta must be a string, got {got!r}"
        shown = ""
        received = ""
        hold = max(len(s) for s in stops) - 1
        for i, (piece, delta) in enumerate(zip(pieces, got)):
            shown += delta
            received += piece
            assert want.startswith(shown), \
                f"{where}: after piece {i} the client has seen {shown!r}, which is not a prefix of the answer {want!r}"
            visible = min(len(received), len(want))
            assert i == len(pieces) - 1 or visible - len(shown) <= hold, \
                f"{where}: after piece {i} you hold back {visible - len(shown)} characters; at most {hold} can still become a stop string"
        assert shown == want, f"{where}: the client saw {shown!r} in all, expected {want!r}"


Q2 = Question(
    id="q2", title="A streamer that never shows part of a stop string", function="stream_with_stops",
    points=4, level="medium", minutes=15,
    visible=[_t2(["Sure", ", here", " it is.\n\nUs", "er: thanks"], ["\n\nUser:"],
                 "the stop string arrives split over two pieces"),
             _t2(["Hello", " world"], ["XY"], "no stop: everything shown, the last piece flushes")],
    hidden=[
        _t2(["ab", "cX", "Yd"], ["XY"], "stop split across pieces"),
        _t2(["aX", "b"], ["XY"], "a near-miss: the held X is released"),
        _t2(["a", "X"], ["XY"], "the stream ends on a held X: release it"),
        _t2(["XY"], ["XY"], "the stop is the whole reply"),
        _t2(["a", "b", "c"], ["Q"], "one-character stop: nothing to hold"),
        _t2(["ZZ", "Z", "more"], ["XY", "ZZZ"], "two stops, the second matches"),
        _t2(["aZZZbXYc"], ["XY", "ZZZ"],
            "both stops in one piece: the one earlier in the text wins, not the first in the list"),
        _t2(["a\n", "\nU", "ser: hi"], ["\n\nUser:"],
            "the start of the stop spans two pieces: hold the tail of the text, not of the piece"),
        _t2([], ["XY"], "no pieces at all"),
    ],
    test=_stream_property_test,
)


# ---------------------------------------------------------------------- Q3
def _bill(usages, p_in, p_cached, p_out):
    rates = Rates(p_in, p_cached, p_out)
    with_cache = sum(bill_turn(u, rates).total_usd for u in usages)
    without = sum(bill_turn(u, rates, use_cache=False).total_usd for u in usages)
    return (with_cache, without)


def _usage(prompt, cached, completion):
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


THREE_TURNS = [_usage(1200, 0, 300), _usage(1530, 1488, 250), _usage(1800, 1776, 400)]


def _t3(usages, prices, label):
    return Case(args=(usages, *prices), expected=_bill(usages, *prices), rel=1e-9, label=label)


Q3 = Question(
    id="q3", title="Bill a conversation, with and without cached prefixes", function="bill_conversation",
    points=3, level="medium", minutes=10,
    visible=[_t3(THREE_TURNS, (3.0, 0.3, 15.0),
                 "three turns, $3 / $0.30 / $15 per million fresh-input / cached / output tokens")],
    hidden=[
        _t3([_usage(1000, 0, 100)], (2.0, 0.5, 8.0), "one turn, nothing cached: both bills equal"),
        _t3([_usage(1000, 1000 - 16, 100)], (2.0, 0.0, 8.0), "almost all cached, cached input free"),
        _t3(THREE_TURNS, (0.35, 0.0, 1.36), "chip-time rates of chapter 24's example replica"),
        _t3([{"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}], (1.0, 0.1, 4.0),
            "no prompt_tokens_details: nothing was cached"),
        _t3([_usage(10, 0, 0), _usage(20, 16, 0)], (1.0, 0.1, 4.0), "empty replies"),
        _t3([], (1.0, 0.1, 4.0), "no turns: a zero bill"),
        Case(args=([_usage(100, 120, 5)], 1.0, 0.1, 4.0), raises=ValueError, label="more cached than sent"),
        Case(args=([_usage(-5, 0, 5)], 1.0, 0.1, 4.0), raises=ValueError, label="a negative token count"),
        Case(args=([_usage(100, 0, 5)], -1.0, 0.1, 4.0), raises=ValueError, label="a negative price"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
