"""Exercise 7 · Weights in memory: the chips a model needs and the seats left. Hidden tests.

Expected values come from :mod:`servelab.arith` and :mod:`servelab.kvcache`.
"""
from servelab import arith, kvcache
from servelab.grading import Case, Question

GB = 1e9
GROUPS = arith.GROUP_SIZES


def _chips(weights, usable, share=0.6):
    return arith.round_to_group(arith.chips_for_weights(weights, _chip(usable), share))


def _chip(usable):
    from servelab.specs import Chip
    return Chip(name=f"test-{usable}", memory_bytes=usable, hbm_bandwidth=1e12, flops={"bf16": 1e15})


Q1 = Question(
    id="q1", title="Chips per replica", function="chips_per_replica", points=3, level="easy", minutes=8,
    visible=[Case(args=(200 * GB, 180 * GB), expected=8, label="200 GB of weights, 180 GB usable chips"),
             Case(args=(1000 * GB, 180 * GB), expected=16, label="1,000 GB on 180 GB chips")],
    hidden=[
        Case(args=(140 * GB, 80 * GB), expected=_chips(140 * GB, 80 * GB), label="140 GB on 80 GB cards"),
        Case(args=(671 * GB, 80 * GB), expected=_chips(671 * GB, 80 * GB), label="671 GB on 80 GB cards"),
        Case(args=(108 * GB, 180 * GB), expected=8, label="exactly one chip's share"),
        Case(args=(1700 * GB, 80 * GB), expected=_chips(1700 * GB, 80 * GB), label="1,700 GB on 80 GB (36 chips)"),
        Case(args=(3000 * GB, 80 * GB), expected=64, label="3,000 GB on 80 GB: 63 chips -> 64"),
        Case(args=(3100 * GB, 80 * GB), expected=72, label="3,100 GB on 80 GB: 65 chips -> 72"),
        Case(args=(3072 * GB, 80 * GB), expected=64,
             label="3,072 GB on 80 GB: exactly 64 chips' share (a ceiling, not int(x) + 1)"),
        Case(args=(200 * GB, 180 * GB), kwargs={"share": 0.9}, expected=8, label="share 0.9"),
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
