"""Exercise 7 · Weights in memory: the chips a model needs and the seats left. Hidden tests.

Expected values come from :mod:`servelab.arith` and :mod:`servelab.kvcache`.
"""
from servelab import arith, kvcache
from servelab.grading import Case, Question

GB = 1e9


# Expected counts are typed (and checked against servelab.arith in tests/test_ex07_mutants.py):
# a power of two up to one 8-card box (1, 2, 4, 8), then whole boxes (16, 24, ... 72).
Q1 = Question(
    id="q1", title="Chips per replica", function="chips_per_replica", points=3, level="easy", minutes=8,
    visible=[Case(args=(140 * GB, 80 * GB), expected=4, label="140 GB on 80 GB cards: 3 by memory -> 4"),
             Case(args=(1000 * GB, 180 * GB), expected=16, label="1,000 GB on 180 GB chips: 10 -> two boxes")],
    hidden=[
        Case(args=(200 * GB, 180 * GB), expected=2, label="200 GB on 180 GB chips: 2, not a whole box"),
        Case(args=(16 * GB, 80 * GB), expected=1, label="16 GB on one 80 GB card"),
        Case(args=(108 * GB, 180 * GB), expected=1, label="exactly one chip's share"),
        Case(args=(250 * GB, 80 * GB), expected=8, label="250 GB on 80 GB: 6 chips -> 8"),
        Case(args=(671 * GB, 80 * GB), expected=16, label="671 GB on 80 GB cards: 14 -> 16"),
        Case(args=(812 * GB, 80 * GB), expected=24, label="812 GB on 80 GB: 17 chips -> three boxes"),
        Case(args=(1700 * GB, 80 * GB), expected=40, label="1,700 GB on 80 GB: 36 chips -> five boxes"),
        Case(args=(3000 * GB, 80 * GB), expected=64, label="3,000 GB on 80 GB: 63 chips -> 64"),
        Case(args=(3100 * GB, 80 * GB), expected=72, label="3,100 GB on 80 GB: 65 chips -> 72"),
        Case(args=(3072 * GB, 80 * GB), expected=64,
             label="3,072 GB on 80 GB: exactly 64 chips' share (a ceiling, not int(x) + 1)"),
        Case(args=(200 * GB, 180 * GB), kwargs={"share": 0.9}, expected=2, label="share 0.9"),
        Case(args=(300 * GB, 180 * GB), kwargs={"share": 1.0}, expected=2, label="share 1.0"),
        Case(args=(4000 * GB, 80 * GB), raises=ValueError, label="more than 72 chips"),
        Case(args=(0, 80 * GB), raises=ValueError, label="zero weights"),
        Case(args=(100 * GB, 80 * GB), kwargs={"share": 0}, raises=ValueError, label="share 0"),
        Case(args=(100 * GB, 80 * GB), kwargs={"share": 1.5}, raises=ValueError, label="share 1.5"),
    ],
)


def _seats(weights, usable, chips, bpt, seq_len, margin=0.05):
    room = kvcache.kv_room_bytes(chips * usable, weights, margin)
    return kvcache.seats_granted(room, bpt, seq_len)


Q2 = Question(
    id="q2", title="Seats left after the weights", function="seats_left", points=4, level="medium", minutes=10,
    visible=[Case(args=(200 * GB, 180 * GB, 8, 163_840, 8000), expected=898,
                  label="200 GB on 8 x 180 GB, 163,840 B/token, 8,000 tokens")],
    hidden=[
        Case(args=(200 * GB, 180 * GB, 8, 163_840, 128_000), expected=56, label="... at 128,000 tokens"),
        Case(args=(200 * GB, 180 * GB, 8, 163_840, 1_000_000), expected=7, label="... at 1,000,000 tokens"),
        Case(args=(140 * GB, 80 * GB, 2, 327_680, 4000), expected=_seats(140 * GB, 80 * GB, 2, 327_680, 4000),
             label="70B bf16 on two 80 GB cards, 4,000 tokens"),
        Case(args=(140 * GB, 80 * GB, 2, 327_680, 4000), kwargs={"margin": 0.0},
             expected=_seats(140 * GB, 80 * GB, 2, 327_680, 4000, 0.0), label="... without a margin"),
        Case(args=(16 * GB, 80 * GB, 1, 131_072, 10_000_000), expected=0, label="one sequence too long to fit"),
        Case(args=(200 * GB, 80 * GB, 2, 163_840, 8000), raises=ValueError, label="weights bigger than the chips"),
        Case(args=(200 * GB, 180 * GB, 8, 163_840, 0), raises=ValueError, label="zero-length conversation"),
        Case(args=(200 * GB, 180 * GB, 0, 163_840, 8000), raises=ValueError, label="zero chips"),
    ],
)

QUESTIONS = [Q1, Q2]
