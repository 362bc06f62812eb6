"""Exercise 22 · Running a fleet: a token bucket's retry time, replicas for a day's peak, a
cache-aware router's hits against its load balance. Hidden tests.

Expected values come from :mod:`servelab.fleet` (``TokenBucket`` and
``replicas_for_peak``), so the exercise and chapter 22 can never disagree; Q3's reference router
is written here (the library's routes a simulated trace by a hashed home replica).
"""
import random
from collections import OrderedDict

from servelab import fleet
from servelab.grading import Case, Question


def _retry(level, capacity, per_minute, elapsed_s, amount):
    """The library's bucket, started at ``level``, asked after ``elapsed_s`` seconds."""
    b = fleet.TokenBucket(per_minute, capacity)
    b.level = level
    return b.wait(elapsed_s, amount)


def _case(level, capacity, per_minute, elapsed_s, amount, label):
    return Case(args=(level, capacity, per_minute, elapsed_s, amount),
                expected=_retry(level, capacity, per_minute, elapsed_s, amount), rel=1e-9, abs=1e-12, label=label)


Q1 = Question(
    id="q1", title="When may this request come back?", function="retry_after", points=4, level="medium",
    minutes=10,
    visible=[_case(0.0, 60, 60, 0.0, 1, "empty bucket of 60, 60 a minute, one request now: 1 s"),
             _case(10.0, 60, 60, 0.0, 5, "10 in the bucket, asking for 5: now")],
    hidden=[
        _case(2.0, 100, 600, 0.5, 10, "2 left, 10 a second, half a second later, asking for 10"),
        _case(99.0, 100, 600, 3600.0, 100, "an hour idle refills only to the capacity: 100 now"),
        _case(0.0, 100, 600, 3600.0, 100, "an hour idle from empty: a full bucket, so now"),
        _case(0.0, 4000, 4000, 0.0, 3000, "tokens per minute: 3,000 tokens need 45 s"),
        _case(50.0, 100, 30, 10.0, 80, "30 a minute is half a token a second: 50 + 5, 25 short -> 50 s"),
        _case(0.0, 1, 1, 0.0, 1, "one a minute: 60 s"),
        Case(args=(0.0, 100, 60, 0.0, 101), raises=ValueError, label="larger than the whole bucket: never"),
        Case(args=(0.0, 100, 0, 0.0, 1), raises=ValueError, label="a refill rate of 0"),
        Case(args=(0.0, 100, 60, -1.0, 1), raises=ValueError, label="negative elapsed time"),
    ],
)


def _peak_case(rates, per_replica, headroom, label):
    return Case(args=(rates, per_replica, headroom),
                expected=fleet.replicas_for_peak(__import__("numpy").array(rates), per_replica, headroom),
                label=label)


_T, _DAY = fleet.diurnal_rates(24, mean_rate=10, peak_to_trough=4, step_s=3600)
_, _LAUNCH = fleet.diurnal_rates(24, mean_rate=10, surge=(18, 3, 2.0), step_s=3600)

Q2 = Question(
    id="q2", title="Replicas for the peak", function="replicas_for_day", points=4, level="easy", minutes=8,
    visible=[_peak_case([2.0, 5.0, 9.5, 4.0], 3.0, 1.0, "hourly rates peaking at 9.5/s, 3/s a replica: 4")],
    hidden=[
        _peak_case([round(float(x), 3) for x in _DAY], 12.5, 1.0, "the chapter's weekday, 12.5/s a replica"),
        _peak_case([round(float(x), 3) for x in _LAUNCH], 12.5, 1.0, "the weekday with a launch surge"),
        _peak_case([round(float(x), 3) for x in _DAY], 10.0, 1.3, "the weekday, 10/s a replica, 30% headroom"),
        Case(args=([3.0, 9.0, 6.0], 3.0, 1.0), expected=3,
             label="a peak of exactly 3 replicas' worth: 3, not 4 (int(x) + 1 is wrong)"),
        Case(args=([1.0, 30.0, 2.0], 10.0, 1.0), expected=3, label="a spike: the peak, not the mean"),
        Case(args=([0.5], 10.0, 1.0), expected=1, label="a quiet day still needs one replica"),
        Case(args=([], 10.0, 1.0), raises=ValueError, label="no rates"),
        Case(args=([5.0], 0.0, 1.0), raises=ValueError, label="a replica that serves nothing"),
        Case(args=([5.0], 10.0, 0.5), raises=ValueError, label="headroom below 1"),
    ],
)


# --------------------------------------------------------------------------- Q3

def _route_by_prefix(requests, replicas, slack, cache_slots):
    """Reference: a cache-aware router (prefix affinity bounded by a load slack), each replica an LRU
    cache of prefixes; returns (hits, requests per replica)."""
    if replicas < 1 or slack < 0 or cache_slots < 0:
        raise ValueError("at least one replica; slack and cache slots cannot be negative")
    in_flight = [[] for _ in range(replicas)]     # finish times of the requests each one serves
    caches = [OrderedDict() for _ in range(replicas)]   # prefixes, least recently served first
    served = [0] * replicas
    hits = 0
    last = float("-inf")
    for arrival, prefix, duration in requests:
        if arrival < last or duration < 0:
            raise ValueError("requests come in arrival order and take a non-negative time")
        last = arrival
        for r in range(replicas):                 # a request finishing now has left
            in_flight[r] = [end for end in in_flight[r] if end > arrival]
        load = [len(x) for x in in_flight]
        least = min(range(replicas), key=load.__getitem__)   # the lowest index on a tie
        target = least
        holders = [r for r in range(replicas) if prefix is not None and prefix in caches[r]]
        if holders:
            home = min(holders, key=load.__getitem__)
            if load[home] <= load[least] + slack:
                target = home
        if prefix is not None:
            cache = caches[target]
            if prefix in cache:
                hits += 1
                cache.move_to_end(prefix)
            else:
                cache[prefix] = True
                if len(cache) > cache_slots:
                    cache.popitem(last=False)
        in_flight[target].append(arrival + duration)
        served[target] += 1
    return hits, served


def _trace(seed, n, prefixes, rate, mean_s, none_share=0.1):
    """Poisson arrivals; prefixes by a 1/k popularity (a few hot documents, a long tail); some
    requests with no shared prefix; exponential service times."""
    rng = random.Random(seed)
    t, out = 0.0, []
    weights = [1 / (k + 1) for k in range(prefixes)]
    for _ in range(n):
        t += rng.expovariate(rate)
        p = None if rng.random() < none_share else f"doc{rng.choices(range(prefixes), weights)[0]}"
        out.append((round(t, 3), p, round(rng.expovariate(1 / mean_s), 3)))
    return out


def _c3(requests, replicas, slack, cache_slots, label):
    hits, served = _route_by_prefix(requests, replicas, slack, cache_slots)
    return Case(args=(requests, replicas, slack, cache_slots), expected=(hits, served), label=label)


_V = [(0.0, "A", 4.0), (0.5, "A", 4.0), (1.0, "A", 4.0), (1.5, "B", 4.0), (2.0, "A", 4.0),
      (2.5, "B", 4.0), (3.0, "A", 4.0), (5.0, "C", 1.0), (6.0, "B", 1.0)]
_T = _trace(1, 300, 8, 4.0, 2.0)

Q3 = Question(
    id="q3", title="A cache-aware router: hits against load balance", function="route_by_prefix",
    points=6, level="hard", minutes=25,
    visible=[_c3(_V, 2, 0, 2, "nine requests, 2 replicas, no slack"),
             _c3(_V, 2, 9, 2, "the same with a slack of 9: more hits, less balance")],
    hidden=[
        _c3(_V, 2, 1, 2, "slack 1"),
        _c3(_T, 4, 0, 2, "300 requests on 4 replicas, no slack, 2 slots"),
        _c3(_T, 4, 2, 2, "slack 2, 2 slots"),
        _c3(_T, 4, 2, 1, "slack 2, 1 slot"),
        _c3(_T, 4, 4, 4, "slack 4, 4 slots"),
        _c3(_T, 4, 100, 1, "pure affinity, 1 slot"),
        _c3(_T, 4, 100, 2, "pure affinity, 2 slots"),
        _c3([(0, "A", 1.0), (1.0, "B", 1.0), (1.0, "A", 1.0)], 2, 0, 4,
            "a request that finishes as another arrives has left"),
        _c3([(0, None, 5), (1, None, 5), (2, None, 5)], 2, 0, 4, "no shared prefix: never a hit"),
        _c3(_T[:50], 3, 2, 0, "no cache slots"),
        _c3([], 3, 1, 2, "no requests"),
        Case(args=(_V, 0, 1, 2), raises=ValueError, label="no replicas"),
        Case(args=(_V, 2, -1, 2), raises=ValueError, label="a negative slack"),
        Case(args=([(1.0, "A", 1.0), (0.5, "A", 1.0)], 2, 1, 2), raises=ValueError,
             label="arrivals out of order"),
        Case(args=([(0.0, "A", -1.0)], 2, 1, 2), raises=ValueError, label="a negative service time"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
