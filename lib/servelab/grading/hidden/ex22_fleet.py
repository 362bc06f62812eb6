"""Exercise 22 · Running a fleet: a token bucket's retry time, replicas for a day's peak. Hidden tests.

Expected values come from :mod:`servelab.fleet` (``TokenBucket`` and
``replicas_for_peak``), so the exercise and chapter 22 can never disagree.
"""
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

QUESTIONS = [Q1, Q2]
